//! A planned region's source (its nodes with their operands resolved), from which the module's
//! `fuse::Region` and the recompile explainer's signature are built only on a cache miss.

use super::*;

/// A region's ops as captured, with their operands resolved: building the [`Region`] (and then
/// the module text) is left to a cache miss, so a warm flush never builds either.
#[derive(Debug)]
pub struct RegionSource {
    // Inline lists sized for one op: the op-by-op modes flush every op, and a warm flush only
    // drops its source, so these should cost no allocation there.
    /// The kept nodes, in capture order.
    pub(super) nodes: SmallVec<[Node; 1]>,
    /// Every kept node's input operands, flattened in node and input order.
    pub(super) operands: SmallVec<[Operand; 4]>,
    pub(super) arg_types: SmallVec<[TensorType; 2]>,
    /// Lifted scalars' slots in push order: per node, its inputs' offsets, then its op scalars.
    pub(super) slots: fuse::ScalarSlots,
    pub(super) scalar_packs: SmallVec<[(DType, u32); 1]>,
    pub(super) outputs: SmallVec<[Operand; 2]>,
    /// (argument, output) pairs: the output is the argument's storage's new value, and the
    /// argument's buffer is donated to it.
    pub(super) aliases: SmallVec<[(u32, u32); 2]>,
}

impl RegionSource {
    /// Number of ops that run.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// (argument, output) pairs whose buffers the executable shares.
    pub fn aliases(&self) -> &[(u32, u32)] {
        &self.aliases
    }

    /// What the region is built for, op by op (taken on a compile, to explain a recompile).
    pub fn signature(&self) -> RegionSignature {
        let mut operands = self.operands.iter();
        let type_of = |operand: &Operand, ops: &[OpSignature]| match *operand {
            Operand::Arg(i) => (self.arg_types[i as usize].clone(), InputOrigin::Argument(i)),
            Operand::Node { node, output } => (
                ops[node as usize].outputs[output as usize].clone(),
                InputOrigin::Op {
                    position: node,
                    output,
                },
            ),
        };
        let mut ops: Vec<OpSignature> = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let mut inputs = SmallVec::new();
            for input in &node.inputs {
                let operand = operands.next().expect("one operand per input");
                let (stored, source) = type_of(operand, &ops);
                let (ty, view, stored) = match (&input.view, &input.reshape_to) {
                    (Some(view), _) => (
                        signature::view_result(view).unwrap_or_else(|| stored.clone()),
                        Some(signature::describe_view(view)),
                        Some(stored),
                    ),
                    (None, Some(shape)) => {
                        (TensorType::new(stored.dtype, shape), None, Some(stored))
                    }
                    (None, None) => (stored, None, None),
                };
                inputs.push(InputSignature {
                    ty,
                    stored,
                    source,
                    view,
                });
            }
            ops.push(OpSignature {
                op: node.op.clone(),
                params: node.params.clone(),
                scalar_kinds: node.scalars.iter().map(ScalarKind::of).collect(),
                variant: node.meta.variant,
                inputs,
                outputs: node.meta.outputs.clone(),
                location: node.location.clone(),
            });
        }
        let outputs = self
            .outputs
            .iter()
            .map(|o| match *o {
                Operand::Node { node, output } => (node, output),
                Operand::Arg(i) => (u32::MAX, i),
            })
            .collect();
        RegionSignature {
            skeleton: signature::skeleton(self.nodes.iter().map(|n| &n.op)),
            ops,
            outputs,
            aliases: self.aliases.to_vec(),
        }
    }

    /// The region to emit.
    pub fn build(&self) -> Region {
        let mut operands = self.operands.iter();
        let mut slots = self.slots.iter().copied();
        let nodes = self
            .nodes
            .iter()
            .map(|node| {
                let inputs = node
                    .inputs
                    .iter()
                    .map(|input| InputRef {
                        operand: *operands.next().expect("one operand per input"),
                        reshape_to: input.reshape_to.as_deref().cloned(),
                        view: input.view.clone(),
                        offset: input.offset.and_then(|_| slots.next()),
                    })
                    .collect();
                let scalars = slots.by_ref().take(node.meta.scalar_dtypes.len()).collect();
                RegionNode {
                    op: node.op.clone(),
                    params: node.params.clone(),
                    inputs,
                    scalars,
                    meta: node.meta.clone(),
                }
            })
            .collect();
        Region {
            args: self.arg_types.to_vec(),
            nodes,
            outputs: self.outputs.to_vec(),
            scalar_packs: self.scalar_packs.to_vec(),
            aliases: self.aliases.to_vec(),
        }
    }
}

/// "add", or "region of 12 ops: add, mul, ...".
pub(super) fn region_label(nodes: &[Node]) -> String {
    match nodes {
        [] => "empty region".to_string(),
        [node] => node.op.name().to_string(),
        nodes => {
            let mut names: Vec<&str> = nodes.iter().take(6).map(|n| n.op.name()).collect();
            if nodes.len() > 6 {
                names.push("...");
            }
            format!("region of {} ops: {}", nodes.len(), names.join(", "))
        }
    }
}

impl<V> Flush<V> {
    /// The region's source, which [`Graph::flush`] always builds.
    pub fn source(&self) -> &RegionSource {
        self.region
            .as_deref()
            .expect("a flush whose program the caller had carries no source")
    }
}
