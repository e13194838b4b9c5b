//! Test nodes, a builder for pending graphs, and a small engine that materializes plans.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet, VecDeque};

use liveness::{
    plan, ExternalId, NodeId, NodeIdSequence, NodeOutput, PendingNode, Plan, PlanError, Request,
    ValueRef,
};

/// A pending node made of plain fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestNode {
    pub id: NodeId,
    pub inputs: Vec<ValueRef>,
    pub num_outputs: u32,
    pub side_effecting: bool,
}

impl PendingNode for TestNode {
    fn id(&self) -> NodeId {
        self.id
    }

    fn inputs(&self) -> impl Iterator<Item = ValueRef> + '_ {
        self.inputs.iter().copied()
    }

    fn num_outputs(&self) -> u32 {
        self.num_outputs
    }

    fn is_side_effecting(&self) -> bool {
        self.side_effecting
    }
}

pub fn ext(n: u64) -> ValueRef {
    ValueRef::External(ExternalId(n))
}

pub fn val(output: NodeOutput) -> ValueRef {
    ValueRef::Pending(output)
}

/// Builds a pending graph in capture order.
pub struct GraphBuilder {
    ids: NodeIdSequence,
    pub nodes: Vec<TestNode>,
}

impl GraphBuilder {
    pub fn new() -> Self {
        Self::starting_at(0)
    }

    pub fn starting_at(first: u64) -> Self {
        Self {
            ids: NodeIdSequence::starting_at(NodeId::new(first)),
            nodes: Vec::new(),
        }
    }

    /// Skips `count` ids, as if other ops had been captured and executed meanwhile.
    pub fn skip_ids(&mut self, count: u64) -> &mut Self {
        for _ in 0..count {
            self.ids.next_id();
        }
        self
    }

    pub fn node(&mut self, inputs: &[ValueRef], num_outputs: u32, side_effecting: bool) -> NodeId {
        let id = self.ids.next_id();
        self.nodes.push(TestNode {
            id,
            inputs: inputs.to_vec(),
            num_outputs,
            side_effecting,
        });
        id
    }

    /// A pure op with one output.
    pub fn op(&mut self, inputs: &[ValueRef]) -> ValueRef {
        val(self.node(inputs, 1, false).output(0))
    }

    /// A side-effecting op without outputs.
    pub fn effect(&mut self, inputs: &[ValueRef]) -> NodeId {
        self.node(inputs, 0, true)
    }

    pub fn plan(&self, request: Request<'_>, held: &[ValueRef]) -> Result<Plan, PlanError> {
        let held: HashSet<ValueRef> = held.iter().copied().collect();
        plan(&self.nodes, request, |value| held.contains(&val(value)))
    }
}

pub fn id_of(value: ValueRef) -> NodeId {
    value.pending().expect("a pending value").node
}

pub fn ids_of(values: &[ValueRef]) -> Vec<NodeId> {
    values.iter().map(|&value| id_of(value)).collect()
}

pub fn output_values(plan: &Plan) -> Vec<ValueRef> {
    plan.outputs
        .iter()
        .map(|output| val(output.value))
        .collect()
}

/// Captures ops, materializes plans the way the engine will, and rewrites materialized values
/// into external ones.
#[derive(Default)]
pub struct Engine {
    ids: NodeIdSequence,
    pub pending: VecDeque<TestNode>,
    materialized: HashMap<NodeOutput, ExternalId>,
    next_external: u64,
}

impl Engine {
    pub fn new_external(&mut self) -> ValueRef {
        self.next_external += 1;
        ext(self.next_external)
    }

    /// The current form of a value: external once it has been materialized.
    pub fn resolve(&self, value: ValueRef) -> ValueRef {
        match value
            .pending()
            .and_then(|output| self.materialized.get(&output))
        {
            Some(&external) => ValueRef::External(external),
            None => value,
        }
    }

    pub fn capture(&mut self, inputs: &[ValueRef], side_effecting: bool) -> ValueRef {
        let id = self.ids.next_id();
        let inputs = inputs.iter().map(|&value| self.resolve(value)).collect();
        self.pending.push_back(TestNode {
            id,
            inputs,
            num_outputs: 1,
            side_effecting,
        });
        val(id.output(0))
    }

    /// Plans and "runs" a materialization; `held` are the values live storages hold.
    pub fn materialize(&mut self, request: Request<'_>, held: &[ValueRef]) -> Plan {
        let held: HashSet<ValueRef> = held.iter().map(|&value| self.resolve(value)).collect();
        let resolved: Vec<ValueRef>;
        let request = match request {
            Request::All => Request::All,
            Request::Prefix(len) => Request::Prefix(len),
            Request::Values(values) => {
                resolved = values.iter().map(|&value| self.resolve(value)).collect();
                Request::Values(&resolved)
            }
        };
        let plan = plan(self.pending.iter(), request, |value| {
            held.contains(&val(value))
        })
        .expect("a consistent pending graph");
        self.pending.drain(..plan.region_len());
        for output in &plan.outputs {
            self.next_external += 1;
            self.materialized
                .insert(output.value, ExternalId(self.next_external));
        }
        let materialized = &self.materialized;
        for node in &mut self.pending {
            for input in &mut node.inputs {
                if let Some(external) = input.pending().and_then(|o| materialized.get(&o)) {
                    *input = ValueRef::External(*external);
                }
            }
        }
        plan
    }
}
