//! Plans over random pending graphs, checked against a naive reference and the plan invariants.

mod common;

use std::collections::{BTreeSet, HashMap, HashSet};

use common::{ext, val, Engine, TestNode};
use liveness::{plan, NodeId, NodeOutput, Plan, Request, ValueRef};
use proptest::prelude::*;

/// A random node; `input_seeds` pick among the values existing when it is captured.
#[derive(Clone, Debug)]
struct NodeSpec {
    num_outputs: u32,
    side_effecting: bool,
    input_seeds: Vec<u32>,
    id_gap: u64,
}

#[derive(Clone, Debug)]
struct Case {
    first_id: u64,
    nodes: Vec<NodeSpec>,
    /// `None` flushes everything.
    request_seeds: Option<Vec<u32>>,
    held_seed: u64,
}

fn node_spec() -> impl Strategy<Value = NodeSpec> {
    (
        prop_oneof![1 => Just(0u32), 6 => Just(1), 2 => Just(2), 1 => Just(3)],
        prop::bool::weighted(0.1),
        prop::collection::vec(any::<u32>(), 0..4),
        prop_oneof![4 => Just(0u64), 1 => 1u64..5],
    )
        .prop_map(
            |(num_outputs, side_effecting, input_seeds, id_gap)| NodeSpec {
                num_outputs,
                side_effecting,
                input_seeds,
                id_gap,
            },
        )
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![Just(0u64), any::<u32>().prop_map(u64::from)],
        prop::collection::vec(node_spec(), 0..40),
        prop::option::weighted(0.8, prop::collection::vec(any::<u32>(), 0..4)),
        any::<u64>(),
    )
        .prop_map(|(first_id, nodes, request_seeds, held_seed)| Case {
            first_id,
            nodes,
            request_seeds,
            held_seed,
        })
}

/// Picks a value among `existing`: one time in seven an external one, else often a recent one.
fn pick(seed: u32, existing: &[NodeOutput]) -> ValueRef {
    let kind = seed % 21;
    let choice = (seed / 21) as usize;
    if existing.is_empty() || kind < 3 {
        return ext(u64::from(seed));
    }
    if kind < 9 {
        let recent = existing.len().min(3);
        val(existing[existing.len() - 1 - choice % recent])
    } else {
        val(existing[choice % existing.len()])
    }
}

struct Built {
    nodes: Vec<TestNode>,
    requested: Option<Vec<ValueRef>>,
    held: HashSet<NodeOutput>,
}

fn build(case: &Case) -> Built {
    let mut nodes = Vec::new();
    let mut existing = Vec::new();
    let mut next_seq = case.first_id;
    for spec in &case.nodes {
        next_seq += spec.id_gap;
        let id = NodeId::new(next_seq);
        next_seq += 1;
        let inputs = spec
            .input_seeds
            .iter()
            .map(|&seed| pick(seed, &existing))
            .collect();
        nodes.push(TestNode {
            id,
            inputs,
            num_outputs: spec.num_outputs,
            side_effecting: spec.side_effecting,
        });
        existing.extend((0..spec.num_outputs).map(|index| id.output(index)));
    }
    let requested = case.request_seeds.as_ref().map(|seeds| {
        seeds
            .iter()
            .map(|&seed| pick(seed, &existing))
            .collect::<Vec<_>>()
    });
    let held = existing
        .iter()
        .enumerate()
        .filter(|&(slot, _)| case.held_seed.rotate_right(slot as u32 * 7) & 3 == 0)
        .map(|(_, &value)| value)
        .collect();
    Built {
        nodes,
        requested,
        held,
    }
}

fn run(built: &Built) -> Plan {
    let request = match &built.requested {
        Some(values) => Request::Values(values),
        None => Request::All,
    };
    plan(&built.nodes, request, |value| built.held.contains(&value)).expect("a valid graph")
}

/// The reference: what a plan must contain, computed the slow, obvious way.
struct Expected {
    region: Vec<NodeId>,
    live_values: BTreeSet<NodeOutput>,
    kept: BTreeSet<NodeId>,
}

fn expected(built: &Built) -> Expected {
    let nodes = &built.nodes;
    let position = |id: NodeId| nodes.iter().position(|node| node.id == id).unwrap();
    let requested: Vec<NodeOutput> = built
        .requested
        .iter()
        .flatten()
        .filter_map(|value| value.pending())
        .collect();
    let region_len = match &built.requested {
        None => nodes.len(),
        Some(_) => requested
            .iter()
            .map(|value| position(value.node) + 1)
            .max()
            .unwrap_or(0),
    };
    let region: Vec<NodeId> = nodes[..region_len].iter().map(|node| node.id).collect();
    let in_region = |id: NodeId| region.contains(&id);

    let mut live_values: BTreeSet<NodeOutput> = requested.iter().copied().collect();
    live_values.extend(built.held.iter().filter(|value| in_region(value.node)));
    for node in &nodes[region_len..] {
        live_values.extend(
            node.inputs
                .iter()
                .filter_map(|input| input.pending())
                .filter(|input| in_region(input.node)),
        );
    }

    let mut kept = BTreeSet::new();
    let mut stack: Vec<NodeId> = live_values.iter().map(|value| value.node).collect();
    stack.extend(
        nodes[..region_len]
            .iter()
            .filter(|n| n.side_effecting)
            .map(|n| n.id),
    );
    while let Some(id) = stack.pop() {
        if kept.insert(id) {
            let node = &nodes[position(id)];
            stack.extend(
                node.inputs
                    .iter()
                    .filter_map(|input| input.pending())
                    .map(|v| v.node),
            );
        }
    }
    Expected {
        region,
        live_values,
        kept,
    }
}

/// Ancestors of `id` through pending inputs, itself included.
fn ancestors(nodes: &[TestNode], id: NodeId) -> HashSet<NodeId> {
    let by_id: HashMap<NodeId, &TestNode> = nodes.iter().map(|node| (node.id, node)).collect();
    let mut seen = HashSet::new();
    let mut stack = vec![id];
    while let Some(id) = stack.pop() {
        if seen.insert(id) {
            stack.extend(
                by_id[&id]
                    .inputs
                    .iter()
                    .filter_map(|input| input.pending())
                    .map(|value| value.node),
            );
        }
    }
    seen
}

/// A plan with ids replaced by positions in the pending list.
#[derive(Debug, PartialEq)]
struct PlanShape {
    kept: Vec<usize>,
    dropped: Vec<usize>,
    outputs: Vec<(usize, u32, [bool; 3])>,
}

fn shape(nodes: &[TestNode], plan: &Plan) -> PlanShape {
    let position = |id: NodeId| nodes.iter().position(|node| node.id == id).unwrap();
    PlanShape {
        kept: plan.kept.iter().map(|&id| position(id)).collect(),
        dropped: plan.dropped.iter().map(|&id| position(id)).collect(),
        outputs: plan
            .outputs
            .iter()
            .map(|output| {
                let reasons = [
                    output.requested,
                    output.held_by_storage,
                    output.read_by_pending,
                ];
                (position(output.value.node), output.value.index, reasons)
            })
            .collect(),
    }
}

/// What a random program does after capturing an op.
#[derive(Clone, Debug)]
enum Read {
    Nothing,
    Variable(usize),
    All,
}

/// One captured op of a random program, stored into a variable (Python rebinding a name).
#[derive(Clone, Debug)]
struct ProgramStep {
    input_seeds: Vec<usize>,
    side_effecting: bool,
    variable: usize,
    read: Read,
}

fn program_step() -> impl Strategy<Value = ProgramStep> {
    (
        prop::collection::vec(any::<usize>(), 1..4),
        prop::bool::weighted(0.1),
        0usize..8,
        prop_oneof![
            6 => Just(Read::Nothing),
            3 => any::<usize>().prop_map(Read::Variable),
            1 => Just(Read::All),
        ],
    )
        .prop_map(
            |(input_seeds, side_effecting, variable, read)| ProgramStep {
                input_seeds,
                side_effecting,
                variable,
                read,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn plans_satisfy_the_invariants(case in case()) {
        let built = build(&case);
        let nodes = &built.nodes;
        let plan = run(&built);
        let expected = expected(&built);

        // The region is a prefix, split into kept and dropped; the rest stays pending.
        let region_len = plan.region_len();
        prop_assert_eq!(region_len, expected.region.len());
        let mut region: Vec<NodeId> = plan.kept.iter().chain(&plan.dropped).copied().collect();
        region.sort();
        prop_assert_eq!(&region, &expected.region);
        prop_assert!(plan.kept.windows(2).all(|pair| pair[0] < pair[1]));
        prop_assert!(plan.dropped.windows(2).all(|pair| pair[0] < pair[1]));
        let suffix: Vec<NodeId> = nodes[region_len..].iter().map(|node| node.id).collect();
        prop_assert_eq!(&plan.still_pending, &suffix);

        // Every kept op reads only kept or external values.
        let kept: HashSet<NodeId> = plan.kept.iter().copied().collect();
        for node in nodes.iter().filter(|node| kept.contains(&node.id)) {
            for input in node.inputs.iter().filter_map(|input| input.pending()) {
                prop_assert!(kept.contains(&input.node), "{} reads dropped {}", node.id, input);
            }
        }

        // Every output is produced by a kept op, once; the outputs are exactly the live values.
        let outputs: Vec<NodeOutput> = plan.outputs.iter().map(|output| output.value).collect();
        let distinct: BTreeSet<NodeOutput> = outputs.iter().copied().collect();
        prop_assert_eq!(distinct.len(), outputs.len());
        prop_assert!(outputs.iter().all(|value| kept.contains(&value.node)));
        prop_assert_eq!(&distinct, &expected.live_values);

        // Kept is exactly the closure of outputs and side effects: nothing live is dropped,
        // nothing dead is kept.
        prop_assert_eq!(&kept.iter().copied().collect::<BTreeSet<_>>(), &expected.kept);
        for &dropped in &plan.dropped {
            let node = nodes.iter().find(|node| node.id == dropped).unwrap();
            prop_assert!(!node.side_effecting);
            for value in &outputs {
                prop_assert!(!ancestors(nodes, value.node).contains(&dropped));
            }
        }

        // Order: requested values first as asked, the rest by capture order and index.
        let mut requested_order = Vec::new();
        for value in built.requested.iter().flatten().filter_map(|value| value.pending()) {
            if !requested_order.contains(&value) {
                requested_order.push(value);
            }
        }
        prop_assert_eq!(&outputs[..requested_order.len()], &requested_order[..]);
        let rest = &outputs[requested_order.len()..];
        prop_assert!(rest.windows(2).all(|pair| pair[0] < pair[1]));
        prop_assert!(plan.outputs[requested_order.len()..].iter().all(|output| !output.requested));

        // Deterministic, and independent of the id values.
        prop_assert_eq!(&run(&built), &plan);
        let renumbered = Case {
            first_id: 1 << 40,
            nodes: case.nodes.iter().map(|spec| NodeSpec { id_gap: 0, ..spec.clone() }).collect(),
            ..case.clone()
        };
        let rebuilt = build(&renumbered);
        prop_assert_eq!(shape(&rebuilt.nodes, &run(&rebuilt)), shape(nodes, &plan));
    }

    #[test]
    fn repeated_materializations_keep_the_pending_graph_consistent(
        steps in prop::collection::vec(program_step(), 1..60),
    ) {
        let mut engine = Engine::default();
        let mut variables = vec![engine.new_external()];
        for step in steps {
            let inputs: Vec<ValueRef> = step
                .input_seeds
                .iter()
                .map(|&seed| variables[seed % variables.len()])
                .collect();
            let value = engine.capture(&inputs, step.side_effecting);
            if step.variable < variables.len() {
                variables[step.variable] = value;
            } else {
                variables.push(value);
            }
            let requested;
            let request = match step.read {
                Read::Nothing => continue,
                Read::All => Request::All,
                Read::Variable(seed) => {
                    requested = [variables[seed % variables.len()]];
                    Request::Values(&requested)
                }
            };
            let before = engine.pending.len();
            let plan = engine.materialize(request, &variables);
            prop_assert_eq!(before - engine.pending.len(), plan.region_len());
            // Every variable is still readable: pending, or materialized just now.
            for &variable in &variables {
                if let Some(output) = engine.resolve(variable).pending() {
                    prop_assert!(engine.pending.iter().any(|node| node.id == output.node));
                }
            }
        }
        engine.materialize(Request::All, &variables);
        prop_assert!(engine.pending.is_empty());
    }
}
