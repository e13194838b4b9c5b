//! A training loop that only reads `loss.item()` reaches a steady state: the pending graph stays
//! bounded and every step materializes a region of the same shape.

mod common;

use common::Engine;
use liveness::{NodeId, Plan, Request, ValueRef};

/// What a cache key would see of a region: sizes and output reasons, not id values.
fn region_shape(plan: &Plan) -> (usize, usize, Vec<[bool; 3]>) {
    (
        plan.kept.len(),
        plan.dropped.len(),
        plan.outputs
            .iter()
            .map(|o| [o.requested, o.held_by_storage, o.read_by_pending])
            .collect(),
    )
}

/// The loop's Python-side variables; each is held by a live storage.
struct Variables {
    weight: ValueRef,
    metric: ValueRef,
    loss: ValueRef,
}

impl Variables {
    fn held(&self) -> [ValueRef; 3] {
        [self.weight, self.metric, self.loss]
    }
}

/// One step: forward, backward, SGD update, `metric = metric + loss`, then `loss.item()`.
fn step(engine: &mut Engine, vars: &mut Variables) -> Plan {
    let batch = engine.new_external();
    let hidden = engine.capture(&[batch, vars.weight], false);
    let loss = engine.capture(&[hidden], false);
    let _unused_stat = engine.capture(&[hidden], false);
    let grad = engine.capture(&[batch, hidden, loss], false);
    vars.weight = engine.capture(&[vars.weight, grad], false);
    vars.metric = engine.capture(&[vars.metric, loss], false);
    vars.loss = loss;
    engine.materialize(Request::Values(&[vars.loss]), &vars.held())
}

#[test]
fn metric_accumulation_keeps_the_pending_graph_bounded() {
    const OPS_PER_STEP: usize = 6;
    let mut engine = Engine::default();
    let mut vars = Variables {
        weight: engine.new_external(),
        metric: engine.new_external(),
        loss: engine.new_external(),
    };
    let mut shapes = Vec::new();
    for step_index in 0..200 {
        let plan = step(&mut engine, &mut vars);
        assert!(
            engine.pending.len() <= OPS_PER_STEP,
            "step {step_index}: {} ops pending",
            engine.pending.len()
        );
        shapes.push(region_shape(&plan));
    }
    // The first region holds only the first forward pass; from then on each region holds the
    // previous step's update and metric plus this step's forward pass, always the same shape.
    assert!(shapes[1..].iter().all(|shape| *shape == shapes[1]));
    let (kept, dropped, outputs) = &shapes[1];
    assert_eq!((*kept, *dropped), (5, 1), "the unused statistic is dropped");
    assert_eq!(
        outputs.len(),
        4,
        "loss, and the metric, weight and hidden that later ops read"
    );

    // What stays pending is this step's tail: the unused statistic, the backward pass, the
    // update and the metric addition.
    assert_eq!(engine.pending.len(), 4);
    let remaining: Vec<NodeId> = engine.pending.iter().map(|node| node.id).collect();
    let flush = engine.materialize(Request::All, &vars.held());
    assert_eq!(flush.kept, remaining[1..]);
    assert_eq!(flush.dropped, remaining[..1]);
    assert!(engine.pending.is_empty());
}

#[test]
fn metric_only_loop_never_accumulates_pending_additions() {
    let mut engine = Engine::default();
    let mut metric = engine.new_external();
    for _ in 0..1000 {
        let x = engine.new_external();
        let loss = engine.capture(&[x], false);
        metric = engine.capture(&[metric, loss], false);
        engine.materialize(Request::Values(&[loss]), &[metric, loss]);
        assert!(engine.pending.len() <= 1, "only this step's addition waits");
    }
}
