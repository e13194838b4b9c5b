//! Graph prologues: the few pending ops that make nothing but a compiled-mode graph's inputs
//! (autograd's `ones_like` seed of a backward graph, say), folded into the graph's recorded
//! program instead of launched as a region of their own before it (RFC 0033).

use super::*;

/// The most pending ops a graph takes as its prologue.
const MAX_PROLOGUE_OPS: usize = 8;

/// The ops pending before a graph, described so that a later call can tell whether the ops
/// pending then are the same ones, up to their lifted scalars' values.
#[derive(Clone, Debug)]
pub struct Prologue {
    /// The last pending op's digests (structure and sizes), chained over the pending list.
    digests: (u64, u64),
    ops: usize,
    /// (graph input position, op position, output index) for each storage that holds a pending
    /// value: every one is a graph input's.
    held: Vec<(usize, usize, u32)>,
    /// The ops' lifted scalars, in the order a flush packs them (the region's first ones).
    scalars: Vec<(ScalarArg, DType)>,
}

impl Prologue {
    /// The graph input positions whose storages hold a prologue value.
    pub fn held_inputs(&self) -> impl Iterator<Item = usize> + '_ {
        self.held.iter().map(|&(k, _, _)| k)
    }

    /// The lifted scalars, in the order a flush of the prologue and a graph packs them.
    pub fn scalars(&self) -> &[(ScalarArg, DType)] {
        &self.scalars
    }

    /// Whether `other` is the same ops making the same inputs (lifted scalars aside).
    pub fn same_ops(&self, other: &Prologue) -> bool {
        self.digests == other.digests && self.ops == other.ops && self.held == other.held
    }
}

impl<V: Clone> Graph<V> {
    /// The pending ops as the prologue of a graph over the storages `inputs`, or `None` when
    /// they cannot be one: nothing is pending, more than a few ops are, one reads a device
    /// value (an external), writes through a view, runs padded, checks, or draws random numbers,
    /// one is dead, or a storage that is not one of `inputs` holds one of their values.
    pub fn pending_prologue(&self, inputs: &[StorageId]) -> Option<Prologue> {
        if self.pending.is_empty() || self.pending.len() > MAX_PROLOGUE_OPS {
            return None;
        }
        let mut held = Vec::new();
        let mut scalars = Vec::new();
        for (position, node) in self.pending.iter().enumerate() {
            let RegionOp::Aten(op) = node.op else {
                return None;
            };
            if op.is_side_effecting() || op.family() == ops::Family::Random {
                return None;
            }
            for input in &node.inputs {
                if matches!(input.value, ValueRef::External(_)) {
                    return None;
                }
                if let Some(offset) = input.offset {
                    scalars.push((ScalarArg::int(offset), DType::I64));
                }
            }
            for (scalar, dtype) in node.scalars.iter().zip(&node.meta.scalar_dtypes) {
                scalars.push((*scalar, *dtype));
            }
            let mut live = false;
            for index in 0..node.meta.outputs.len() as u32 {
                for storage in self
                    .holders
                    .get(&node.id.output(index))
                    .into_iter()
                    .flatten()
                {
                    let k = inputs.iter().position(|s| s == storage)?;
                    held.push((k, position, index));
                    live = true;
                }
            }
            let read_later = || {
                self.pending.iter().skip(position + 1).any(|later| {
                    later
                        .inputs
                        .iter()
                        .any(|i| matches!(i.value, ValueRef::Pending(out) if out.node == node.id))
                })
            };
            if !live && !read_later() {
                return None; // a dead op a flush would drop: its scalars would not lead
            }
        }
        held.sort_unstable();
        Some(Prologue {
            digests: self.pending.back()?.clone_digests(),
            ops: self.pending.len(),
            held,
            scalars,
        })
    }

    /// Whether the pending ops could be some graph's prologue, whatever its inputs: at most a
    /// few, none reads a device value, has an effect or draws random numbers. Strict keeps such
    /// ops pending after a compiled graph ran, for the next graph to take (RFC 0033).
    pub fn pending_could_be_prologue(&self) -> bool {
        !self.pending.is_empty()
            && self.pending.len() <= MAX_PROLOGUE_OPS
            && self.pending.iter().all(|node| {
                matches!(node.op, RegionOp::Aten(op)
                    if !op.is_side_effecting() && op.family() != ops::Family::Random)
                    && node
                        .inputs
                        .iter()
                        .all(|input| !matches!(input.value, ValueRef::External(_)))
            })
    }

    /// Whether an op on `inputs` would read a value already on the device (not a pending one,
    /// and not a storage never written): such an op cannot join a prologue.
    pub fn reads_device_value(&self, inputs: &[TensorRef]) -> bool {
        inputs.iter().any(|t| {
            self.storages
                .get(&t.storage)
                .is_some_and(|s| matches!(s.value, StorageValue::Device { .. }))
        })
    }

    /// Drops the pending ops once a replay gave every storage that held one of their values a
    /// new one; `false` (nothing dropped) when a pending value is still held.
    pub fn drop_unheld_pending(&mut self) -> bool {
        let held = self.pending.iter().any(|node| {
            (0..node.meta.outputs.len() as u32)
                .any(|index| self.holders.contains_key(&node.id.output(index)))
        });
        if held {
            return false;
        }
        self.stats.dropped_ops += self.pending.len() as u64;
        self.pending.clear();
        self.forget_unread_externals();
        true
    }
}
