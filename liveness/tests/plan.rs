//! Planning single materializations over hand-built pending graphs.

mod common;

use std::collections::VecDeque;

use common::{ext, id_of, ids_of, output_values, val, GraphBuilder, TestNode};
use liveness::{plan, NodeId, Output, PlanError, Request};

#[test]
fn chain_runs_whole_and_returns_only_the_request() {
    let mut g = GraphBuilder::new();
    let a = g.op(&[ext(0)]);
    let b = g.op(&[a]);
    let c = g.op(&[b]);
    let plan = g.plan(Request::Values(&[c]), &[]).unwrap();
    assert_eq!(plan.kept, ids_of(&[a, b, c]));
    assert_eq!(output_values(&plan), [c]);
    assert!(plan.dropped.is_empty());
    assert!(plan.still_pending.is_empty());
    assert_eq!(plan.region_len(), 3);
}

#[test]
fn diamond_is_kept_once() {
    let mut g = GraphBuilder::new();
    let a = g.op(&[ext(0)]);
    let b = g.op(&[a]);
    let c = g.op(&[a, a]);
    let d = g.op(&[b, c]);
    let plan = g.plan(Request::Values(&[d]), &[]).unwrap();
    assert_eq!(plan.kept, ids_of(&[a, b, c, d]));
    assert_eq!(output_values(&plan), [d]);
}

#[test]
fn request_in_the_middle_leaves_later_ops_pending_and_materializes_what_they_read() {
    let mut g = GraphBuilder::new();
    let x = g.op(&[ext(0)]);
    let y = g.op(&[x]);
    let z = g.op(&[y]);
    let w = g.op(&[x, z, ext(1)]);
    let v = g.op(&[w]);
    let plan = g.plan(Request::Values(&[z]), &[]).unwrap();
    assert_eq!(plan.kept, ids_of(&[x, y, z]));
    assert_eq!(plan.still_pending, ids_of(&[w, v]));
    assert_eq!(output_values(&plan), [z, x]);
    assert_eq!(
        plan.outputs[0],
        Output {
            value: z.pending().unwrap(),
            requested: true,
            held_by_storage: false,
            read_by_pending: true,
        }
    );
    assert!(plan.outputs[1].read_by_pending && !plan.outputs[1].requested);
}

#[test]
fn older_unrelated_work_is_in_the_region() {
    let mut g = GraphBuilder::new();
    let metric = g.op(&[ext(0)]);
    let a = g.op(&[ext(1)]);
    let plan = g.plan(Request::Values(&[a]), &[metric]).unwrap();
    assert_eq!(plan.kept, ids_of(&[metric, a]));
    assert_eq!(output_values(&plan), [a, metric]);
    assert!(plan.outputs[1].held_by_storage);
}

#[test]
fn dead_ops_are_dropped() {
    let mut g = GraphBuilder::new();
    let a = g.op(&[ext(0)]);
    let dead = g.op(&[a]);
    let dead_too = g.op(&[dead, a]);
    let b = g.op(&[a]);
    let plan = g.plan(Request::Values(&[b]), &[]).unwrap();
    assert_eq!(plan.kept, ids_of(&[a, b]));
    assert_eq!(plan.dropped, ids_of(&[dead, dead_too]));
    assert_eq!(plan.region_len(), 4);
}

#[test]
fn a_value_held_by_a_storage_keeps_its_producers() {
    let mut g = GraphBuilder::new();
    let a = g.op(&[ext(0)]);
    let kept_alive = g.op(&[a]);
    let b = g.op(&[ext(1)]);
    let plan = g.plan(Request::Values(&[b]), &[kept_alive]).unwrap();
    assert_eq!(plan.kept, ids_of(&[a, kept_alive, b]));
    assert_eq!(output_values(&plan), [b, kept_alive]);
    assert!(plan.dropped.is_empty());
}

#[test]
fn side_effecting_ops_are_kept_in_capture_order_with_their_inputs() {
    let mut g = GraphBuilder::new();
    let a = g.op(&[ext(0)]);
    let seed = g.op(&[ext(1)]);
    let first = g.effect(&[seed]);
    let dead = g.op(&[a]);
    let second = g.effect(&[a]);
    let b = g.op(&[a]);
    let after = g.effect(&[b]);
    let plan = g.plan(Request::Values(&[b]), &[]).unwrap();
    assert_eq!(
        plan.kept,
        [id_of(a), id_of(seed), first, second, id_of(b)],
        "effects keep their place among the kept ops"
    );
    assert_eq!(plan.dropped, [id_of(dead)]);
    assert_eq!(plan.still_pending, [after]);
    assert_eq!(output_values(&plan), [b]);
}

#[test]
fn flush_all_takes_everything() {
    let mut g = GraphBuilder::new();
    let a = g.op(&[ext(0)]);
    let b = g.op(&[a]);
    let unheld = g.op(&[b]);
    let effect = g.effect(&[unheld]);
    let held = g.op(&[a]);
    let plan = g.plan(Request::All, &[held]).unwrap();
    assert_eq!(
        plan.kept,
        [id_of(a), id_of(b), id_of(unheld), effect, id_of(held)]
    );
    assert_eq!(output_values(&plan), [held]);
    assert!(plan.still_pending.is_empty());
}

#[test]
fn flush_all_without_live_values_or_effects_drops_everything() {
    let mut g = GraphBuilder::new();
    let a = g.op(&[ext(0)]);
    let b = g.op(&[a]);
    let plan = g.plan(Request::All, &[]).unwrap();
    assert!(plan.is_empty());
    assert_eq!(plan.dropped, ids_of(&[a, b]));
    assert!(plan.outputs.is_empty());
}

#[test]
fn requesting_nothing_pending_plans_an_empty_region() {
    let mut g = GraphBuilder::new();
    let a = g.op(&[ext(0)]);
    for requested in [&[][..], &[ext(0), ext(7)][..]] {
        let plan = g.plan(Request::Values(requested), &[a]).unwrap();
        assert_eq!(plan.region_len(), 0);
        assert!(plan.outputs.is_empty());
        assert_eq!(plan.still_pending, [id_of(a)]);
    }
}

#[test]
fn values_held_outside_the_region_are_not_asked_about() {
    let mut g = GraphBuilder::new();
    let a = g.op(&[ext(0)]);
    let later = g.op(&[ext(1)]);
    let mut asked = Vec::new();
    let plan = plan(&g.nodes, Request::Values(&[a]), |value| {
        asked.push(value);
        true
    })
    .unwrap();
    assert_eq!(asked, [a.pending().unwrap()]);
    assert_eq!(plan.still_pending, [id_of(later)]);
}

#[test]
fn outputs_are_deduplicated_and_keep_every_reason() {
    let mut g = GraphBuilder::new();
    let a = g.op(&[ext(0)]);
    let b = g.op(&[a]);
    let _reader = g.op(&[a]);
    let plan = g
        .plan(Request::Values(&[a, b, a, b, ext(3)]), &[a, b])
        .unwrap();
    assert_eq!(output_values(&plan), [a, b]);
    assert!(plan.outputs[0].requested);
    assert!(plan.outputs[0].held_by_storage);
    assert!(plan.outputs[0].read_by_pending);
    assert!(!plan.outputs[1].read_by_pending);
}

#[test]
fn output_order_follows_the_request_then_capture_order() {
    let mut g = GraphBuilder::new();
    let held_late = g.node(&[ext(0)], 2, false);
    let a = g.op(&[ext(0)]);
    let b = g.op(&[a]);
    let held_early = g.op(&[ext(1)]);
    let plan = g
        .plan(
            Request::Values(&[b, a]),
            &[
                val(held_late.output(1)),
                held_early,
                val(held_late.output(0)),
            ],
        )
        .unwrap();
    assert_eq!(
        output_values(&plan),
        [b, a, val(held_late.output(0)), val(held_late.output(1))],
        "held_early is captured after the region"
    );
    assert_eq!(plan.output_position(held_late.output(1)), Some(3));
    assert_eq!(plan.output_position(NodeId::new(99).output(0)), None);
}

#[test]
fn the_same_program_gives_the_same_plan_shape_whatever_its_ids() {
    let build = |first: u64, gap: u64| {
        let mut g = GraphBuilder::starting_at(first);
        let a = g.op(&[ext(0)]);
        g.skip_ids(gap);
        let b = g.node(&[a], 2, false);
        let _dead = g.op(&[val(b.output(0))]);
        g.skip_ids(gap);
        let c = g.op(&[val(b.output(1)), a]);
        let _later = g.op(&[c]);
        let plan = g.plan(Request::Values(&[c]), &[a]).unwrap();
        let position = |id: NodeId| g.nodes.iter().position(|node| node.id == id).unwrap();
        let positions = |ids: &[NodeId]| ids.iter().map(|&id| position(id)).collect::<Vec<_>>();
        let outputs: Vec<_> = plan
            .outputs
            .iter()
            .map(|output| {
                (
                    position(output.value.node),
                    output.value.index,
                    output.requested,
                )
            })
            .collect();
        (
            positions(&plan.kept),
            positions(&plan.dropped),
            positions(&plan.still_pending),
            outputs,
        )
    };
    let reference = build(0, 0);
    assert_eq!(reference.1, [2], "dead is dropped");
    for (first, gap) in [(0, 0), (1000, 0), (5, 3), (u64::MAX - 20, 7)] {
        assert_eq!(build(first, gap), reference, "first id {first}, gap {gap}");
    }
}

#[test]
fn multi_output_nodes_track_each_output() {
    let mut g = GraphBuilder::new();
    let split = g.node(&[ext(0)], 3, false);
    let reader = g.op(&[val(split.output(2))]);
    let plan = g
        .plan(Request::Values(&[val(split.output(1))]), &[])
        .unwrap();
    assert_eq!(plan.kept, [split]);
    assert_eq!(
        output_values(&plan),
        [val(split.output(1)), val(split.output(2))]
    );
    assert_eq!(plan.still_pending, [id_of(reader)]);
}

#[test]
fn a_pure_node_without_outputs_is_dropped() {
    let mut g = GraphBuilder::new();
    let nothing = g.node(&[ext(0)], 0, false);
    let plan = g.plan(Request::All, &[]).unwrap();
    assert_eq!(plan.dropped, [nothing]);
}

#[test]
fn any_iterator_of_nodes_works() {
    let mut g = GraphBuilder::new();
    let a = g.op(&[ext(0)]);
    let b = g.op(&[a]);
    let deque: VecDeque<TestNode> = g.nodes.iter().cloned().collect();
    let from_deque = plan(deque.iter(), Request::Values(&[b]), |_| false).unwrap();
    let from_owned = plan(deque.clone(), Request::Values(&[b]), |_| false).unwrap();
    let from_slice = g.plan(Request::Values(&[b]), &[]).unwrap();
    assert_eq!(from_deque, from_slice);
    assert_eq!(from_owned, from_slice);
}

#[test]
fn empty_pending_graph_plans_nothing() {
    let nodes: [TestNode; 0] = [];
    let plan = plan(&nodes, Request::All, |_| true).unwrap();
    assert_eq!(plan, Default::default());
}

mod errors {
    use super::*;

    fn message(error: &PlanError) -> String {
        let text = error.to_string();
        assert!(text.contains("expected") && text.contains("got"), "{text}");
        text
    }

    #[test]
    fn requested_value_not_pending() {
        let mut g = GraphBuilder::new();
        let _a = g.op(&[ext(0)]);
        let gone = NodeId::new(42).output(0);
        let error = g.plan(Request::Values(&[val(gone)]), &[]).unwrap_err();
        assert_eq!(error, PlanError::RequestedNotPending { requested: gone });
        assert!(message(&error).contains("n42.0"));
    }

    #[test]
    fn requested_output_out_of_range() {
        let mut g = GraphBuilder::new();
        let a = g.node(&[ext(0)], 2, false);
        let error = g
            .plan(Request::Values(&[val(a.output(2))]), &[])
            .unwrap_err();
        assert_eq!(
            error,
            PlanError::RequestedOutputOutOfRange {
                requested: a.output(2),
                num_outputs: 2
            }
        );
        assert!(message(&error).contains("below 2"));
    }

    #[test]
    fn input_from_a_node_that_is_not_pending() {
        let mut g = GraphBuilder::new();
        let a = g.op(&[val(NodeId::new(77).output(0))]);
        let error = g.plan(Request::All, &[]).unwrap_err();
        assert_eq!(
            error,
            PlanError::InputNotPending {
                consumer: id_of(a),
                input: NodeId::new(77).output(0)
            }
        );
        message(&error);
    }

    #[test]
    fn input_from_itself_or_a_later_node() {
        let mut g = GraphBuilder::new();
        let a = g.op(&[val(NodeId::new(0).output(0))]);
        let error = g.plan(Request::All, &[]).unwrap_err();
        assert!(
            matches!(error, PlanError::InputNotPending { consumer, .. } if consumer == id_of(a))
        );

        let mut g = GraphBuilder::new();
        let a = g.op(&[val(NodeId::new(1).output(0))]);
        let _b = g.op(&[ext(0)]);
        let error = g.plan(Request::All, &[]).unwrap_err();
        assert!(
            matches!(error, PlanError::InputNotPending { consumer, .. } if consumer == id_of(a))
        );
    }

    #[test]
    fn input_output_out_of_range() {
        let mut g = GraphBuilder::new();
        let a = g.op(&[ext(0)]);
        let b = g.op(&[val(id_of(a).output(1))]);
        let error = g.plan(Request::All, &[]).unwrap_err();
        assert_eq!(
            error,
            PlanError::InputOutputOutOfRange {
                consumer: id_of(b),
                input: id_of(a).output(1),
                num_outputs: 1
            }
        );
        message(&error);
    }

    #[test]
    fn nodes_out_of_capture_order() {
        let mut g = GraphBuilder::new();
        let a = g.op(&[ext(0)]);
        let b = g.op(&[ext(0)]);
        g.nodes.swap(0, 1);
        let error = g.plan(Request::All, &[]).unwrap_err();
        assert_eq!(
            error,
            PlanError::NotInCaptureOrder {
                previous: id_of(b),
                got: id_of(a)
            }
        );
        message(&error);

        g.nodes[1].id = id_of(b);
        let error = g.plan(Request::All, &[]).unwrap_err();
        assert!(
            matches!(error, PlanError::NotInCaptureOrder { .. }),
            "repeated id"
        );
    }
}

#[test]
fn a_prefix_request_cuts_after_that_many_ops_and_hands_over_what_later_ops_read() {
    let mut g = GraphBuilder::new();
    let x = g.op(&[ext(0)]);
    let dead = g.op(&[x]);
    let y = g.op(&[x]);
    let z = g.op(&[y, ext(1)]);
    let w = g.op(&[z]);
    let plan = g.plan(Request::Prefix(4), &[]).unwrap();
    assert_eq!(plan.kept, ids_of(&[x, y, z]));
    assert_eq!(plan.dropped, ids_of(&[dead]));
    assert_eq!(plan.still_pending, ids_of(&[w]));
    assert_eq!(output_values(&plan), [z]);
    assert!(plan.outputs[0].read_by_pending && !plan.outputs[0].requested);
    // A prefix longer than the pending list takes all of it.
    assert_eq!(g.plan(Request::Prefix(99), &[]).unwrap().still_pending, []);
}
