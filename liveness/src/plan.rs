//! Planning one materialization: the region to run, the values to keep, the ops to drop.

use crate::error::PlanError;
use crate::ids::{NodeId, NodeOutput, ValueRef};
use crate::node::PendingNode;
use crate::positions::Positions;

/// What a materialization must produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// Run every pending op: an explicit sync, a region-size cap.
    All,
    /// Produce these values, and run every op captured before the newest one they depend on.
    ///
    /// External values are accepted and need no work; an empty list plans an empty region.
    Values(&'a [ValueRef]),
    /// Run the first this-many pending ops (fewer if fewer are pending): a cut between two
    /// repetitions of a loop body, so the device runs one while the host captures the next.
    Prefix(usize),
}

/// A value the region must hand back, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Output {
    /// The value.
    pub value: NodeOutput,
    /// The caller asked for it.
    pub requested: bool,
    /// A live storage holds it (the caller's `is_held` said so).
    pub held_by_storage: bool,
    /// An op that stays pending reads it.
    pub read_by_pending: bool,
}

/// The outcome of planning one materialization.
///
/// The region is the prefix of the pending list made of `kept` and `dropped`; `still_pending` is
/// the rest. Each list is in capture order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The region's ops to run.
    pub kept: Vec<NodeId>,
    /// The values to materialize, without repeats, in a fixed order: first the requested
    /// pending values in request order, then the others by producer capture order and output
    /// index. The order depends only on the graph's shape and the request, not on id values, so
    /// the same program gives the same order every time.
    pub outputs: Vec<Output>,
    /// The region's ops with no path to an output and no side effect: discard them.
    pub dropped: Vec<NodeId>,
    /// The ops captured after the region; they stay pending.
    pub still_pending: Vec<NodeId>,
}

impl Plan {
    /// How many pending ops the region takes off the front of the pending list.
    pub fn region_len(&self) -> usize {
        self.kept.len() + self.dropped.len()
    }

    /// Whether there is nothing to run.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// Where `value` is among the outputs.
    pub fn output_position(&self, value: NodeOutput) -> Option<usize> {
        self.outputs.iter().position(|output| output.value == value)
    }
}

// Why an output slot must be materialized; `EMITTED` guards against repeats.
const REQUESTED: u8 = 1;
const HELD_BY_STORAGE: u8 = 1 << 1;
const READ_BY_PENDING: u8 = 1 << 2;
const EMITTED: u8 = 1 << 3;
const LIVE: u8 = REQUESTED | HELD_BY_STORAGE | READ_BY_PENDING;

/// An input edge to a pending producer; inputs from external values need no tracking.
#[derive(Clone, Copy)]
struct PendingInput {
    producer: usize,
    slot: usize,
}

/// The pending nodes, flattened by position; each output gets a global slot number.
struct FlatGraph {
    ids: Vec<NodeId>,
    side_effecting: Vec<bool>,
    /// Slots of node `p` are `first_slot[p]..first_slot[p + 1]`.
    first_slot: Vec<usize>,
    /// Inputs of node `p` are `inputs[first_input[p]..first_input[p + 1]]`.
    first_input: Vec<usize>,
    inputs: Vec<PendingInput>,
    positions: Positions,
}

impl FlatGraph {
    fn build<N: PendingNode>(pending: impl IntoIterator<Item = N>) -> Result<Self, PlanError> {
        let pending = pending.into_iter();
        let capacity = pending.size_hint().0;
        let mut graph = Self {
            ids: Vec::with_capacity(capacity),
            side_effecting: Vec::with_capacity(capacity),
            first_slot: Vec::with_capacity(capacity + 1),
            first_input: Vec::with_capacity(capacity + 1),
            inputs: Vec::with_capacity(capacity * 2),
            positions: Positions::new(),
        };
        graph.first_slot.push(0);
        graph.first_input.push(0);
        for node in pending {
            graph.push(&node)?;
        }
        Ok(graph)
    }

    fn push<N: PendingNode>(&mut self, node: &N) -> Result<(), PlanError> {
        let id = node.id();
        if let Some(&previous) = self.ids.last() {
            if id <= previous {
                return Err(PlanError::NotInCaptureOrder { previous, got: id });
            }
        }
        // Inputs are resolved before the node's own id is recorded, so a self-reference or a
        // reference to a later node is reported as not pending before it.
        for input in node.inputs().filter_map(ValueRef::pending) {
            let producer = self
                .positions
                .get(input.node)
                .ok_or(PlanError::InputNotPending {
                    consumer: id,
                    input,
                })?;
            let num_outputs = self.num_outputs(producer);
            if input.index >= num_outputs {
                return Err(PlanError::InputOutputOutOfRange {
                    consumer: id,
                    input,
                    num_outputs,
                });
            }
            let slot = self.first_slot[producer] + input.index as usize;
            self.inputs.push(PendingInput { producer, slot });
        }
        self.positions.push(id);
        self.ids.push(id);
        self.side_effecting.push(node.is_side_effecting());
        let next_slot = self.first_slot[self.ids.len() - 1] + node.num_outputs() as usize;
        self.first_slot.push(next_slot);
        self.first_input.push(self.inputs.len());
        Ok(())
    }

    fn len(&self) -> usize {
        self.ids.len()
    }

    fn num_outputs(&self, position: usize) -> u32 {
        // Fits: it was a u32 when recorded.
        (self.first_slot[position + 1] - self.first_slot[position]) as u32
    }

    fn inputs_of(&self, position: usize) -> &[PendingInput] {
        &self.inputs[self.first_input[position]..self.first_input[position + 1]]
    }

    fn slots_of(&self, position: usize) -> std::ops::Range<usize> {
        self.first_slot[position]..self.first_slot[position + 1]
    }
}

/// Plans the materialization of `request` over `pending` (ordered materialization).
///
/// - `pending`: every pending node, in capture order (ids strictly increasing). Anything that
///   iterates nodes works: `slice.iter()`, `deque.iter()`, an adaptor over the caller's ops.
/// - `request`: the values to produce, or [`Request::All`].
/// - `is_held`: whether a live storage holds a value; asked once for each output of each region
///   op, and for nothing else.
///
/// The region is the pending prefix up to and including the newest producer of a requested
/// value (everything for [`Request::All`]), so older work is never left behind and the pending
/// graph stays bounded. Its outputs are the requested values plus every region value that is
/// still live outside the region: held by a storage or read by an op that stays pending. Region
/// ops with no path to an output are dropped unless they are side-effecting; side-effecting
/// ops and everything they read are kept.
///
/// Time and memory are O(N + E + S + Q) for N pending nodes, E input edges, S outputs of the
/// pending nodes and Q requested values: one forward pass to flatten the graph and one backward pass over the
/// region to mark what is kept (nodes are topologically ordered by capture, so no worklist is
/// needed). Id lookups are offsets while pending ids are contiguous, hash lookups otherwise.
///
/// # Errors
/// [`PlanError`] when a requested value or a node input does not name an existing output of a
/// pending node (captured before the reader, for inputs), or when the nodes are not in capture
/// order.
pub fn plan<N, I, F>(pending: I, request: Request<'_>, mut is_held: F) -> Result<Plan, PlanError>
where
    N: PendingNode,
    I: IntoIterator<Item = N>,
    F: FnMut(NodeOutput) -> bool,
{
    let graph = FlatGraph::build(pending)?;
    let mut flags = vec![0u8; graph.first_slot[graph.len()]];

    let mut requested_slots = Vec::new();
    let region_len = match request {
        Request::All => graph.len(),
        Request::Prefix(len) => len.min(graph.len()),
        Request::Values(values) => {
            let mut region_len = 0;
            for requested in values.iter().filter_map(|value| value.pending()) {
                let position = graph
                    .positions
                    .get(requested.node)
                    .ok_or(PlanError::RequestedNotPending { requested })?;
                let num_outputs = graph.num_outputs(position);
                if requested.index >= num_outputs {
                    return Err(PlanError::RequestedOutputOutOfRange {
                        requested,
                        num_outputs,
                    });
                }
                let slot = graph.first_slot[position] + requested.index as usize;
                flags[slot] |= REQUESTED;
                requested_slots.push((requested, slot));
                region_len = region_len.max(position + 1);
            }
            region_len
        }
    };

    for position in 0..region_len {
        let id = graph.ids[position];
        for (index, slot) in graph.slots_of(position).enumerate() {
            if is_held(id.output(index as u32)) {
                flags[slot] |= HELD_BY_STORAGE;
            }
        }
    }
    for position in region_len..graph.len() {
        for input in graph.inputs_of(position) {
            if input.producer < region_len {
                flags[input.slot] |= READ_BY_PENDING;
            }
        }
    }

    // Producers precede their readers, so one backward pass sees every reader of a node
    // before the node itself.
    let mut kept = vec![false; region_len];
    for position in (0..region_len).rev() {
        kept[position] |= graph.side_effecting[position]
            || graph.slots_of(position).any(|slot| flags[slot] & LIVE != 0);
        if kept[position] {
            for input in graph.inputs_of(position) {
                kept[input.producer] = true;
            }
        }
    }

    let mut outputs = Vec::new();
    let mut emit = |value: NodeOutput, slot: usize, outputs: &mut Vec<Output>| {
        let slot_flags = flags[slot];
        if slot_flags & LIVE != 0 && slot_flags & EMITTED == 0 {
            flags[slot] |= EMITTED;
            outputs.push(Output {
                value,
                requested: slot_flags & REQUESTED != 0,
                held_by_storage: slot_flags & HELD_BY_STORAGE != 0,
                read_by_pending: slot_flags & READ_BY_PENDING != 0,
            });
        }
    };
    for &(value, slot) in &requested_slots {
        emit(value, slot, &mut outputs);
    }
    for position in 0..region_len {
        let id = graph.ids[position];
        for (index, slot) in graph.slots_of(position).enumerate() {
            emit(id.output(index as u32), slot, &mut outputs);
        }
    }

    let mut kept_ids = Vec::new();
    let mut dropped_ids = Vec::new();
    for (&id, &keep) in graph.ids[..region_len].iter().zip(&kept) {
        if keep {
            kept_ids.push(id);
        } else {
            dropped_ids.push(id);
        }
    }

    Ok(Plan {
        kept: kept_ids,
        outputs,
        dropped: dropped_ids,
        still_pending: graph.ids[region_len..].to_vec(),
    })
}
