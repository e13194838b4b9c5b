//! The deferred-op graph: capture (meta at once, node appended, digests hashed incrementally),
//! storages' values, and the planning of a flush into one fused region with its key.

use crate::memory_cut::{plan_cuts, Role as MemoryRole, ValueLife};
use crate::signature::{
    self, InputOrigin, InputSignature, OpSignature, RegionSignature, ScalarKind,
};
use crate::storage::{Storage, StorageId, StorageSlots, StorageValue};
use fuse::{InputRef, InputView, Operand, Region, RegionNode, RegionOp, StableHasher, WriteView};
use liveness::{ExternalId, NodeId, NodeIdSequence, NodeOutput, PendingNode, Request, ValueRef};
pub use ops::ErrorKind;
use ops::{DType, Meta, OpError, OpId, ScalarArg, Shape, TensorType};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::Arc;

/// An engine error: the Python exception class it maps to, and a PyTorch-style message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineError {
    pub kind: ErrorKind,
    pub message: String,
}

impl EngineError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        EngineError {
            kind,
            message: message.into(),
        }
    }
    pub fn runtime(message: impl Into<String>) -> Self {
        EngineError::new(ErrorKind::Runtime, message)
    }
    pub fn not_implemented(message: impl Into<String>) -> Self {
        EngineError::new(ErrorKind::NotImplemented, message)
    }
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for EngineError {}

impl From<OpError> for EngineError {
    fn from(e: OpError) -> Self {
        EngineError {
            kind: e.kind,
            message: e.message,
        }
    }
}

impl From<views::ViewError> for EngineError {
    fn from(e: views::ViewError) -> Self {
        EngineError::runtime(e.to_string())
    }
}

/// A tensor as PyTorch describes it: a strided window on a storage.
#[derive(Debug, PartialEq, Eq)]
pub struct TensorRef {
    pub storage: StorageId,
    pub dtype: DType,
    pub sizes: Shape,
    pub strides: SmallVec<[i64; 6]>,
    pub offset: i64,
}

impl Clone for TensorRef {
    /// Copies sizes and strides in one go (the derived clone goes element by element).
    fn clone(&self) -> Self {
        TensorRef {
            storage: self.storage,
            dtype: self.dtype,
            sizes: Shape::from_slice(&self.sizes),
            strides: SmallVec::from_slice(&self.strides),
            offset: self.offset,
        }
    }
}

impl TensorRef {
    /// A contiguous tensor over a whole storage.
    pub fn contiguous(storage: StorageId, dtype: DType, sizes: &[i64]) -> Self {
        let mut strides: SmallVec<[i64; 6]> = SmallVec::from_elem(1, sizes.len());
        for i in (0..sizes.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * sizes[i + 1].max(1);
        }
        TensorRef {
            storage,
            dtype,
            sizes: Shape::from_slice(sizes),
            strides,
            offset: 0,
        }
    }

    pub fn numel(&self) -> i64 {
        self.sizes.iter().product()
    }

    /// The element count of a contiguous tensor, `None` for any other: one pass for the check
    /// every captured input goes through.
    fn contiguous_numel(&self) -> Option<i64> {
        let mut expected = 1;
        let mut contiguous = true;
        for (&size, &stride) in self.sizes.iter().zip(&self.strides).rev() {
            contiguous &= size == 1 || stride == expected;
            expected *= size;
        }
        // PyTorch: an empty tensor is contiguous whatever its strides.
        (contiguous || expected == 0).then_some(expected)
    }

    fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, &self.sizes)
    }

    fn layout(&self) -> views::Layout {
        views::Layout {
            elem_size: self.dtype.size_bytes(),
            sizes: views::Dims::from_slice(&self.sizes),
            strides: views::Dims::from_slice(&self.strides),
            offset: self.offset,
        }
    }
}

/// How a tensor relates to its storage's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Placement {
    native: DType,
    base_len: i64,
    /// Contiguous, offset 0, the storage's dtype, every element: the value itself, reshaped.
    whole: bool,
}

/// The outputs of a captured op: the storages written and their types.
#[derive(Clone, Debug)]
pub struct Captured {
    pub outputs: CapturedOutputs,
}

/// One op call as PyTorch makes it: the op, its tensors, scalars and static params, and its
/// `out=` tensors (none: the results go to new storages).
#[derive(Clone, Copy, Debug)]
pub struct OpCall<'a> {
    pub op: OpId,
    pub inputs: &'a [TensorRef],
    pub scalars: &'a [ScalarArg],
    pub params: &'a [i64],
    pub outs: &'a [TensorRef],
}

/// Inline: nearly every op has one output, and a capture should not allocate for it.
pub type CapturedOutputs = SmallVec<[(StorageId, TensorType); 1]>;

/// Fewer pending ops than this are flushed as one region without a memory estimate.
const MEMORY_CUT_MIN_OPS: usize = 8;

/// How many memory plans are remembered (a program's distinct flushes; cleared when full).
const MEMORY_PLANS_KEPT: usize = 256;

/// What a flush is asked to materialize.
#[derive(Copy, Clone, Debug)]
pub enum FlushRequest<'a> {
    /// Every pending op (an explicit sync, op-by-op modes, the region-size cap).
    All,
    /// The values of these storages (and, by ordered materialization, every older op).
    Storages(&'a [StorageId]),
    /// The oldest this-many pending ops (a cut between repetitions of a loop body; see
    /// [`Graph::repeat_cut`]).
    Prefix(usize),
}

/// A device value and its type, as passed to a region.
#[derive(Clone, Debug)]
pub struct ExternalValue<V> {
    pub value: V,
    pub ty: TensorType,
}

/// A planned region: everything the engine needs to compile (on a miss) and run it. Its output
/// values are already installed in the storages that hold them.
#[derive(Debug)]
pub struct Flush<V> {
    /// Key parts: op structure, and all dimensions (the engine adds the options part).
    pub shapeless: u64,
    pub dims: u64,
    /// What the module is built from ([`RegionSource::build`]); `None` when the caller already
    /// has the program for this key (see [`Graph::flush_with`]). Boxed: it holds the nodes
    /// inline, and a flush is moved several times on its way to the queue.
    pub region: Option<Box<RegionSource>>,
    /// Number of ops that run.
    pub ops: usize,
    /// (argument, output) pairs: the output is the argument's storage's new value, and the
    /// argument's buffer is donated to it.
    pub aliases: SmallVec<[(u32, u32); 2]>,
    pub args: SmallVec<[V; 4]>,
    pub scalar_packs: fuse::ScalarPacks,
    pub outputs: SmallVec<[V; 2]>,
    /// Shared: a one-op region's label is the op's name, made once per op.
    pub label: Arc<str>,
    pub dropped_ops: usize,
    /// Verdicts of the region's side-effecting checks (`_assert_async`): 0-d bools that must be
    /// true, each with the op that produced it. They are extra outputs no storage holds.
    pub checks: Vec<(V, String)>,
}

/// A region's ops as captured, with their operands resolved: building the [`Region`] (and then
/// the module text) is left to a cache miss, so a warm flush never builds either.
#[derive(Debug)]
pub struct RegionSource {
    // Inline lists sized for one op: the op-by-op modes flush every op, and a warm flush only
    // drops its source, so these should cost no allocation there.
    /// The kept nodes, in capture order.
    nodes: SmallVec<[Node; 1]>,
    /// Every kept node's input operands, flattened in node and input order.
    operands: SmallVec<[Operand; 4]>,
    arg_types: SmallVec<[TensorType; 2]>,
    /// Lifted scalars' slots in push order: per node, its inputs' offsets, then its op scalars.
    slots: fuse::ScalarSlots,
    scalar_packs: SmallVec<[(DType, u32); 1]>,
    outputs: SmallVec<[Operand; 2]>,
    /// (argument, output) pairs: the output is the argument's storage's new value, and the
    /// argument's buffer is donated to it.
    aliases: SmallVec<[(u32, u32); 2]>,
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
                let (ty, view) = match (&input.view, &input.reshape_to) {
                    (Some(view), _) => (
                        signature::view_result(view).unwrap_or(stored),
                        Some(signature::describe_view(view)),
                    ),
                    (None, Some(shape)) => (TensorType::new(stored.dtype, shape), None),
                    (None, None) => (stored, None),
                };
                inputs.push(InputSignature { ty, source, view });
            }
            ops.push(OpSignature {
                op: node.op.clone(),
                params: node.params.clone(),
                scalar_kinds: node.scalars.iter().map(ScalarKind::of).collect(),
                variant: node.meta.variant,
                inputs,
                outputs: node.meta.outputs.clone(),
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
fn region_label(nodes: &[Node]) -> String {
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

/// Where a host read gets its bytes.
#[derive(Clone, Debug)]
pub enum ReadSource<V> {
    Device(V, TensorType),
    /// The storage was never written: zeros.
    Zeros,
}

/// Counters of the capture side.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    pub captured_ops: u64,
    pub deferred_ops: u64,
    pub materializations: u64,
    pub regions: u64,
    pub region_ops: u64,
    pub dropped_ops: u64,
    pub largest_region: u64,
    pub live_storages: u64,
    /// Ops Strict ran by its direct path ([`Graph::run_if_compiled`]), not captured as nodes.
    pub direct_ops: u64,
}

#[derive(Clone, Debug)]
struct NodeInput {
    value: ValueRef,
    /// Boxed: most inputs read their value as it is, and a node is moved on every capture.
    reshape_to: Option<Box<Shape>>,
    view: Option<Arc<InputView>>,
    /// The storage offset of a windowed view, lifted to a runtime scalar.
    offset: Option<i64>,
}

impl NodeInput {
    fn plain(value: ValueRef) -> Self {
        NodeInput {
            value,
            reshape_to: None,
            view: None,
            offset: None,
        }
    }
}

/// For a view at a non-zero offset in its storage's own dtype: the layout at offset 0 and the
/// number of base elements it spans. Such views read a window at a runtime offset, so views
/// that differ only in where they start share one compiled program.
fn windowed(t: &TensorRef, placement: &Placement) -> Option<(views::Layout, i64)> {
    if t.dtype != placement.native || t.numel() == 0 {
        return None;
    }
    let mut layout = t.layout();
    layout.offset = 0;
    let extent = layout.last_index()? + 1;
    // A view spanning the whole storage (a transpose, say) has no offset to vary.
    (extent < placement.base_len && extent + t.offset <= placement.base_len)
        .then_some((layout, extent))
}

#[derive(Clone, Debug)]
struct Node {
    id: NodeId,
    op: RegionOp,
    params: SmallVec<[i64; 4]>,
    scalars: SmallVec<[ScalarArg; 2]>,
    meta: Meta,
    inputs: SmallVec<[NodeInput; 3]>,
    /// Digests chained over the pending list up to and including this node.
    prefix_shapeless: u64,
    prefix_dims: u64,
    /// What the node computes, blind to where its inputs come from ([`repeat_digest`]).
    repeat_digest: u64,
    /// The longest proper prefix of the pending list up to this node that is also its suffix,
    /// compared by `repeat_digest` (the KMP failure function, kept as ops arrive): the list is
    /// periodic with period `len - border`.
    border: u32,
    /// Elements the pending list's results hold up to and including this node: a cut is only
    /// worth a region of its own when a repetition does enough work.
    work_prefix: u64,
}

impl PendingNode for Node {
    fn id(&self) -> NodeId {
        self.id
    }
    fn inputs(&self) -> impl Iterator<Item = ValueRef> + '_ {
        self.inputs.iter().map(|i| i.value)
    }
    fn num_outputs(&self) -> u32 {
        self.meta.outputs.len() as u32
    }
    fn is_side_effecting(&self) -> bool {
        matches!(self.op, RegionOp::Aten(op) if op.is_side_effecting())
    }
}

#[derive(Clone, Debug)]
struct External<V> {
    value: V,
    ty: TensorType,
}

/// The capture state of one engine: storages, pending ops and the values they read.
#[derive(Debug)]
pub struct Graph<V> {
    storages: StorageSlots<V>,
    pending: VecDeque<Node>,
    ids: NodeIdSequence,
    externals: HashMap<ExternalId, External<V>>,
    external_of: HashMap<(StorageId, u64), ExternalId>,
    /// The device value (as the external pending ops read it) a storage held before its first
    /// pending write: at the flush that installs the storage's new value, that external's buffer
    /// is the one to donate to it.
    overwritten: HashMap<StorageId, ExternalId>,
    next_external: u64,
    /// Which storages hold each pending value (a held value is live: it must be materialized).
    holders: HashMap<NodeOutput, SmallVec<[StorageId; 2]>>,
    /// First-use numbering of the externals read by the pending list (part of the key).
    arg_numbers: HashMap<ExternalId, u32>,
    /// Where the pending list's repetition tracking starts (see [`Graph::repeat_cut`]): ops
    /// before it (a loop's first step, which creates optimizer state, say) matched nothing.
    repeat_anchor: usize,
    /// The repetition digests of the block the last two-repetition cut found: once a loop's
    /// body is known, each later repetition is cut as soon as it is captured, so the device lags
    /// the host by one block rather than two, and a loop that starts again after a sync needs
    /// no two blocks to be found again.
    known_block: Vec<u64>,
    stats: GraphStats,
    /// Whether regions donate overwritten values to their successors (see `set_donation`).
    donate: bool,
    /// Storages whose device value another storage holds too (one output installed into
    /// several): overwriting one of them must not donate the value.
    shared_values: HashSet<StorageId>,
    /// Memory cuts planned for whole flushes, by the flushed ops and what they leave held
    /// (see [`Graph::memory_cuts`]).
    memory_plans: HashMap<(u64, u64, u64), Vec<usize>>,
    /// Labels of one-op regions by op name, so an op-by-op flush allocates no label.
    op_labels: HashMap<&'static str, Arc<str>>,
    /// The key [`Graph::run_if_compiled`] computed for an op it then left to capture and flush:
    /// checked against the flush's own key (debug builds), so the two keyings cannot drift.
    #[cfg(debug_assertions)]
    direct_key_check: Option<(u64, u64)>,
}

impl<V: Clone> Default for Graph<V> {
    fn default() -> Self {
        Graph::new()
    }
}

impl<V: Clone> Graph<V> {
    pub fn new() -> Self {
        Graph {
            storages: StorageSlots::default(),
            pending: VecDeque::new(),
            ids: NodeIdSequence::new(),
            externals: HashMap::default(),
            external_of: HashMap::default(),
            overwritten: HashMap::default(),
            next_external: 0,
            holders: HashMap::default(),
            arg_numbers: HashMap::default(),
            repeat_anchor: 0,
            known_block: Vec::new(),
            stats: GraphStats::default(),
            donate: false,
            shared_values: HashSet::default(),
            memory_plans: HashMap::default(),
            op_labels: HashMap::default(),
            #[cfg(debug_assertions)]
            direct_key_check: None,
        }
    }

    /// Strict's direct path, for an op that reads whole device values and writes new storages
    /// or one whole `out` tensor, while nothing is pending: keys the one-op region a capture
    /// and flush of it would build (aliases included), and when `has_program(shapeless, dims, 1)`
    /// knows that key, installs the results and returns the region ready to launch, without a
    /// node, externals or a liveness plan, with the storages that hold its results. `None`:
    /// capture and flush it instead (no program for its key yet, or not an op this path
    /// takes). Errors are the ones capture would raise.
    pub fn run_if_compiled(
        &mut self,
        call: OpCall<'_>,
        mut make_output: impl FnMut(&TensorType) -> V,
        has_program: impl FnOnce(u64, u64, usize) -> bool,
    ) -> Result<Option<(Captured, Flush<V>)>, EngineError> {
        let OpCall {
            op,
            inputs,
            scalars,
            params,
            outs,
        } = call;
        if !self.pending.is_empty() || op.is_side_effecting() || outs.len() > 1 {
            return Ok(None);
        }
        let mut types: SmallVec<[TensorType; 3]> = SmallVec::new();
        for (i, t) in inputs.iter().enumerate() {
            if !self.placement(&OperandName(op, "input", i), t)?.whole {
                return Ok(None);
            }
            types.push(t.ty());
        }
        let meta = ops::meta(op, &types, scalars, params)?;
        let outputs_len = meta.outputs.len();
        if outputs_len == 0 {
            return Ok(None);
        }
        if let Some(out) = outs.first() {
            // One whole destination of the result's own type and shape, which no input reads
            // except as that same tensor (an in-place op); anything else is capture's to
            // check, cast or refuse.
            if !self.placement(&OperandName(op, "output", 0), out)?.whole
                || outputs_len != 1
                || meta.outputs[0].dtype != out.dtype
                || meta.outputs[0].shape != out.sizes
                || inputs.iter().any(|t| t.storage == out.storage && t != out)
            {
                return Ok(None);
            }
        }
        // Arguments numbered by first use of their storage, as capture numbers externals.
        let mut args: SmallVec<[V; 4]> = SmallVec::new();
        let mut arg_storages: SmallVec<[StorageId; 4]> = SmallVec::new();
        let mut digest_inputs: SmallVec<[InputDigest<'_>; 3]> = SmallVec::new();
        let mut aliases: SmallVec<[(u32, u32); 2]> = SmallVec::new();
        for t in inputs {
            let Some(StorageValue::Device { value, ty }) =
                self.storages.get(&t.storage).map(|s| &s.value)
            else {
                return Ok(None);
            };
            let number = match arg_storages.iter().position(|&s| s == t.storage) {
                Some(k) => k,
                None => {
                    arg_storages.push(t.storage);
                    args.push(value.clone());
                    // An in-place op donates the value it overwrites, as a flush decides:
                    // when donation is on, the value is this storage's alone, and its type is
                    // the result's.
                    if outs.first().is_some_and(|out| out.storage == t.storage)
                        && self.donate
                        && !self.shared_values.contains(&t.storage)
                        && *ty == meta.outputs[0]
                    {
                        aliases.push((arg_storages.len() as u32 - 1, 0));
                    }
                    arg_storages.len() - 1
                }
            };
            digest_inputs.push(InputDigest {
                source: InputSource::Argument {
                    number: number as u32,
                    stored: Some(ty),
                },
                reshape_to: (ty.shape != t.sizes).then_some(t.sizes.as_slice()),
                view: None,
            });
        }
        let (s, d) = op_digests(
            &RegionOp::Aten(op),
            params,
            scalars,
            digest_inputs.drain(..),
            &meta,
        );
        drop(digest_inputs);
        // The one-op region's key as `flush_with` forms it: the op's prefix digests (it would
        // be alone in the pending list), each output by position, no checks, then the aliases.
        let mut key_s = StableHasher::new();
        key_s.u64(fuse::combine(0, s)).u64(outputs_len as u64);
        for index in 0..outputs_len {
            key_s.u64(0).u32(index as u32);
        }
        key_s.u64(0);
        let shapeless = finish_shapeless_key(&mut key_s, &aliases);
        let dims = StableHasher::new().u64(fuse::combine(0, d)).finish();
        if !has_program(shapeless, dims, 1) {
            #[cfg(debug_assertions)]
            {
                self.direct_key_check = Some((shapeless, dims));
            }
            return Ok(None);
        }

        let scalars_typed: SmallVec<[(ScalarArg, DType); 4]> = scalars
            .iter()
            .copied()
            .zip(meta.scalar_dtypes.iter().copied())
            .collect();
        let (_, packs) = fuse::pack_scalars(&scalars_typed);
        let mut outputs: SmallVec<[V; 2]> = SmallVec::new();
        let mut captured = CapturedOutputs::new();
        for ty in meta.outputs {
            let value = make_output(&ty);
            let installed = StorageValue::Device {
                value: value.clone(),
                ty: ty.clone(),
            };
            // What a capture's write and its flush leave: one more version.
            let storage = match outs.first() {
                Some(out) => {
                    // No donation bookkeeping for the value it replaced.
                    self.overwritten.remove(&out.storage);
                    self.shared_values.remove(&out.storage);
                    let entry = self
                        .storages
                        .get_mut(&out.storage)
                        .expect("checked storage");
                    entry.version += 1;
                    entry.value = installed;
                    out.storage
                }
                None => {
                    let nbytes = ty.nbytes();
                    self.insert_storage(nbytes, Some(ty.dtype), installed, 1)
                }
            };
            outputs.push(value);
            captured.push((storage, ty));
        }
        let name = op.name();
        let label = self
            .op_labels
            .entry(name)
            .or_insert_with(|| Arc::from(name))
            .clone();
        self.stats.captured_ops += 1;
        self.stats.direct_ops += 1;
        self.stats.materializations += 1;
        self.stats.regions += 1;
        self.stats.region_ops += 1;
        self.stats.largest_region = self.stats.largest_region.max(1);
        Ok(Some((
            Captured { outputs: captured },
            Flush {
                shapeless,
                dims,
                region: None,
                ops: 1,
                aliases,
                args,
                scalar_packs: packs,
                outputs,
                label,
                dropped_ops: 0,
                checks: Vec::new(),
            },
        )))
    }

    /// Enables input donation: a region argument that was a storage's value until the region
    /// overwrote it, and that no other storage and no op left pending reads, is aliased to the
    /// output that becomes the storage's new value (the executable updates it in place). The
    /// decision rests on the graph alone, so a repeated program always gets the same aliases
    /// (and executable); a holder outside the graph at run time (a read in flight) makes the
    /// execution copy the argument instead (`ExecJob` checks).
    pub fn set_donation(&mut self, enabled: bool) {
        self.donate = enabled;
    }

    pub fn stats(&self) -> GraphStats {
        GraphStats {
            live_storages: self.storages.len() as u64,
            ..self.stats.clone()
        }
    }

    pub fn reset_stats(&mut self) {
        self.stats = GraphStats::default();
    }

    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    // ----- storages -----

    /// A new, unwritten storage of `nbytes` bytes.
    pub fn new_storage(&mut self, nbytes: u64) -> StorageId {
        self.new_storage_of(nbytes, None)
    }

    /// A new storage whose native dtype is already known (an op's output).
    fn new_storage_of(&mut self, nbytes: u64, native: Option<DType>) -> StorageId {
        self.insert_storage(nbytes, native, StorageValue::Uninit, 0)
    }

    /// A new storage made with its value and version in one map insertion.
    fn insert_storage(
        &mut self,
        nbytes: u64,
        native: Option<DType>,
        value: StorageValue<V>,
        version: u64,
    ) -> StorageId {
        self.storages.insert(Storage {
            nbytes,
            native,
            value,
            version,
        })
    }

    /// PyTorch dropped its last reference to the storage.
    pub fn release_storage(&mut self, id: StorageId) -> Result<(), EngineError> {
        let storage = self
            .storages
            .remove(&id)
            .ok_or_else(|| unknown_storage(id))?;
        if let StorageValue::Pending { out, .. } = storage.value {
            self.drop_holder(out, id);
        }
        self.overwritten.remove(&id);
        self.shared_values.remove(&id);
        Ok(())
    }

    pub fn storage_nbytes(&self, id: StorageId) -> Result<u64, EngineError> {
        Ok(self.storage(id)?.nbytes)
    }

    /// Changes a storage's byte size (`resize_`); only an unwritten storage can change size so far.
    pub fn resize_storage(&mut self, id: StorageId, nbytes: u64) -> Result<(), EngineError> {
        let storage = self
            .storages
            .get_mut(&id)
            .ok_or_else(|| unknown_storage(id))?;
        if storage.nbytes == nbytes {
            return Ok(());
        }
        let (old_bytes, native) = (storage.nbytes, storage.native);
        let native = match (&storage.value, native) {
            (StorageValue::Uninit, _) | (_, None) => {
                storage.nbytes = nbytes;
                storage.native = None;
                storage.value = StorageValue::Uninit;
                return Ok(());
            }
            (_, Some(native)) => native,
        };
        // A written storage keeps its bytes: the new value is the old one cut or zero-padded.
        let size = native.size_bytes() as u64;
        if !nbytes.is_multiple_of(size) {
            return Err(EngineError::not_implemented(format!(
                "resizing a pjrt storage of {} values to {nbytes} bytes (not a whole number of \
                 {size}-byte elements) is not supported",
                native.name()
            )));
        }
        let (old_len, new_len) = ((old_bytes / size) as i64, (nbytes / size) as i64);
        let old = TensorRef::contiguous(id, native, &[old_len]);
        let placement = Placement {
            native,
            base_len: old_len,
            whole: true,
        };
        let input = self.read_for_node(&old, &placement)?;
        let (op, params): (OpId, SmallVec<[i64; 4]>) = if new_len > old_len {
            (
                OpId::ConstantPadNd,
                SmallVec::from_slice(&[0, new_len - old_len]),
            )
        } else {
            (OpId::Slice, SmallVec::from_slice(&[0, 0, new_len, 1]))
        };
        let meta = ops::meta(op, &[TensorType::new(native, &[old_len])], &[], &params)?;
        let node = self.push_node(
            RegionOp::Aten(op),
            &params,
            &[],
            meta,
            SmallVec::from_elem(input, 1),
        );
        self.storages.get_mut(&id).unwrap().nbytes = nbytes;
        self.write_pending(id, node.output(0));
        self.stats.captured_ops += 1;
        Ok(())
    }

    fn storage(&self, id: StorageId) -> Result<&Storage<V>, EngineError> {
        self.storages.get(&id).ok_or_else(|| unknown_storage(id))
    }

    /// Where `t` sits in its storage; fixes the storage's native type on first typed use.
    fn placement(
        &mut self,
        what: &dyn std::fmt::Display,
        t: &TensorRef,
    ) -> Result<Placement, EngineError> {
        if t.sizes.len() != t.strides.len() {
            return Err(EngineError::runtime(format!(
                "{what}: sizes {:?} and strides {:?} have different lengths",
                t.sizes.as_slice(),
                t.strides.as_slice()
            )));
        }
        if t.sizes.iter().any(|&s| s < 0) {
            return Err(EngineError::runtime(format!(
                "{what}: negative size in {:?}",
                t.sizes.as_slice()
            )));
        }
        let storage = self
            .storages
            .get_mut(&t.storage)
            .ok_or_else(|| unknown_storage(t.storage))?;
        let native = match storage.native {
            Some(native) => native,
            None => {
                let size = t.dtype.size_bytes() as u64;
                if storage.nbytes % size != 0 {
                    return Err(EngineError::runtime(format!(
                        "{what}: a storage of {} bytes cannot hold {} elements ({size} bytes \
                         each)",
                        storage.nbytes,
                        t.dtype.name()
                    )));
                }
                storage.native = Some(t.dtype);
                t.dtype
            }
        };
        // Element sizes are powers of two: a shift, not a 64-bit division, on every operand.
        let base_len = (storage.nbytes >> native.size_bytes().trailing_zeros()) as i64;
        let whole = t.offset == 0 && t.dtype == native && t.contiguous_numel() == Some(base_len);
        if !whole {
            views::check_in_bounds(base_len, native.size_bytes(), &t.layout())?;
        }
        Ok(Placement {
            native,
            base_len,
            whole,
        })
    }

    /// Whether `t` is its storage's whole value (contiguous, offset 0, same dtype, every
    /// element), so host transfers can move the storage's buffer directly.
    pub fn is_whole(&mut self, t: &TensorRef) -> Result<bool, EngineError> {
        Ok(self.placement(&"a pjrt tensor", t)?.whole)
    }

    // ----- capture -----

    /// Captures one op: meta at once (shape, dtype and value errors raised here), then a
    /// pending node whose outputs go to new storages (`outs` empty) or into `outs`.
    pub fn capture(
        &mut self,
        op: OpId,
        inputs: &[TensorRef],
        scalars: &[ScalarArg],
        params: &[i64],
        outs: &[TensorRef],
    ) -> Result<Captured, EngineError> {
        // Kept only if this capture succeeds: its flush then checks the key.
        #[cfg(debug_assertions)]
        let direct_key_check = self.direct_key_check.take();
        let captured = self.capture_op(op, inputs, scalars, params, outs)?;
        #[cfg(debug_assertions)]
        {
            self.direct_key_check = direct_key_check;
        }
        Ok(captured)
    }

    fn capture_op(
        &mut self,
        op: OpId,
        inputs: &[TensorRef],
        scalars: &[ScalarArg],
        params: &[i64],
        outs: &[TensorRef],
    ) -> Result<Captured, EngineError> {
        if op == OpId::Fill && outs.len() == 1 {
            let out = &outs[0];
            if views::has_internal_overlap(&out.layout()) == views::MemOverlap::Yes {
                // Every element of an expanded destination gets the same value, so PyTorch
                // allows filling it: fill the distinct elements (stride-0 dims of size 1).
                let collapsed = collapse_expanded(out);
                let inputs: SmallVec<[TensorRef; 2]> = inputs
                    .iter()
                    .map(|t| {
                        if t == out {
                            collapsed.clone()
                        } else {
                            t.clone()
                        }
                    })
                    .collect();
                let mut captured = self.capture(
                    op,
                    &inputs,
                    scalars,
                    params,
                    std::slice::from_ref(&collapsed),
                )?;
                captured.outputs = smallvec::smallvec![(out.storage, out.ty())];
                return Ok(captured);
            }
        }
        let mut types: SmallVec<[TensorType; 3]> = SmallVec::new();
        let mut placements: SmallVec<[Placement; 3]> = SmallVec::new();
        for (i, t) in inputs.iter().enumerate() {
            placements.push(self.placement(&OperandName(op, "input", i), t)?);
            types.push(t.ty());
        }
        let meta = ops::meta(op, &types, scalars, params)?;
        let mut out_placements: SmallVec<[Placement; 1]> = SmallVec::new();
        for (i, out) in outs.iter().enumerate() {
            let placement = self.placement(&OperandName(op, "output", i), out)?;
            let written = out.layout();
            if !placement.whole {
                views::check_no_internal_overlap(&written)?;
            }
            for input in inputs
                .iter()
                .filter(|t| t.storage == out.storage && *t != out)
            {
                views::check_no_partial_overlap(&written, &input.layout())?;
            }
            out_placements.push(placement);
            let produced = meta.outputs.get(i).ok_or_else(|| {
                EngineError::runtime(format!(
                    "{}: got {} output tensors but the op produces {}",
                    op.name(),
                    outs.len(),
                    meta.outputs.len()
                ))
            })?;
            if !can_cast(produced.dtype, out.dtype) {
                return Err(EngineError::runtime(format!(
                    "result type {} can't be cast to the desired output type {}",
                    produced.dtype.scalar_type_name(),
                    out.dtype.scalar_type_name()
                )));
            }
            if produced.shape != out.sizes {
                return Err(EngineError::runtime(format!(
                    "{}: output {i} has shape {:?} but the result has shape {:?}; resize the \
                     output first (PyTorch's out= does this)",
                    op.name(),
                    out.sizes.as_slice(),
                    produced.shape.as_slice()
                )));
            }
        }
        let mut node_inputs: SmallVec<[NodeInput; 3]> = SmallVec::new();
        for (t, placement) in inputs.iter().zip(&placements) {
            node_inputs.push(self.read_for_node(t, placement)?);
        }
        let id = self.push_node(RegionOp::Aten(op), params, scalars, meta, node_inputs);
        let mut outputs = CapturedOutputs::new();
        if outs.is_empty() && op.is_side_effecting() {
            // Its results are verdicts for the engine, not tensors for PyTorch.
        } else if outs.is_empty() {
            // Each type is cloned straight from the node into the result: the meta is large,
            // and every extra move of it shows in the per-op capture cost.
            let count = self.pending.back().expect("just pushed").meta.outputs.len();
            for i in 0..count {
                let ty = self.pending.back().expect("just pushed").meta.outputs[i].clone();
                let nbytes = ty.nbytes();
                let storage = self.new_pending_storage(nbytes, ty.dtype, id.output(i as u32));
                outputs.push((storage, ty));
            }
        } else {
            let out_types = self
                .pending
                .back()
                .expect("just pushed")
                .meta
                .outputs
                .clone();
            for (i, out) in outs.iter().enumerate() {
                let produced = &out_types[i];
                let mut value = id.output(i as u32);
                if produced.dtype != out.dtype {
                    // out= with another dtype: PyTorch casts the result into the output's dtype.
                    let cast_meta = ops::meta(
                        OpId::Convert,
                        std::slice::from_ref(produced),
                        &[],
                        &[out.dtype.code() as i64],
                    )?;
                    let input = NodeInput::plain(ValueRef::Pending(value));
                    let cast = self.push_node(
                        RegionOp::Aten(OpId::Convert),
                        &[out.dtype.code() as i64],
                        &[],
                        cast_meta,
                        SmallVec::from_elem(input, 1),
                    );
                    value = cast.output(0);
                }
                let placement = out_placements[i];
                if placement.whole {
                    self.write_pending(out.storage, value);
                } else {
                    self.write_through_view(out, &placement, value)?;
                }
                outputs.push((out.storage, out.ty()));
            }
        }
        self.stats.captured_ops += 1;
        Ok(Captured { outputs })
    }

    /// A write of `value` (the op's result, in `out`'s dtype and shape) through the view `out`:
    /// a node computing the storage's new flat value from its old one.
    fn write_through_view(
        &mut self,
        out: &TensorRef,
        placement: &Placement,
        value: NodeOutput,
    ) -> Result<(), EngineError> {
        let window = windowed(out, placement);
        let program = match &window {
            Some((layout, extent)) => {
                views::invert(*extent, placement.native.size_bytes(), layout)?
            }
            None => views::invert(
                placement.base_len,
                placement.native.size_bytes(),
                &out.layout(),
            )?,
        };
        let whole_base =
            TensorRef::contiguous(out.storage, placement.native, &[placement.base_len]);
        let base_input = self.read_for_node(
            &whole_base,
            &Placement {
                whole: true,
                ..*placement
            },
        )?;
        let ty = TensorType::new(placement.native, &[placement.base_len]);
        let (scalar_dtypes, scalars) = match window {
            Some(_) => (
                ops::ScalarDTypes::from_elem(DType::I64, 1),
                vec![ScalarArg::int(out.offset)],
            ),
            None => (ops::ScalarDTypes::new(), Vec::new()),
        };
        let meta = Meta {
            outputs: smallvec::smallvec![ty],
            scalar_dtypes,
            variant: 0,
        };
        let mut inputs: SmallVec<[NodeInput; 3]> = SmallVec::new();
        inputs.push(base_input);
        inputs.push(NodeInput::plain(ValueRef::Pending(value)));
        let write = RegionOp::WriteView(Arc::new(WriteView {
            program,
            view_dtype: out.dtype,
            base_dtype: placement.native,
            base_len: placement.base_len,
            window: window.map(|(_, extent)| extent),
        }));
        let id = self.push_node(write, &[], &scalars, meta, inputs);
        self.write_pending(out.storage, id.output(0));
        Ok(())
    }

    /// The node input that reads tensor `t` now (a snapshot: later writes don't change it).
    fn read_for_node(
        &mut self,
        t: &TensorRef,
        placement: &Placement,
    ) -> Result<NodeInput, EngineError> {
        // Borrowed, not cloned: only the value's id and whether its shape matches are needed.
        let storage = self
            .storages
            .get(&t.storage)
            .ok_or_else(|| unknown_storage(t.storage))?;
        let version = storage.version;
        let found = match &storage.value {
            StorageValue::Pending { out } => Some((
                ValueRef::Pending(*out),
                self.pending_type(*out).shape == t.sizes,
            )),
            StorageValue::Device { value, ty } => {
                let key = (t.storage, version);
                let external = match self.external_of.get(&key) {
                    Some(e) => *e,
                    None => {
                        let e = ExternalId(self.next_external);
                        self.next_external += 1;
                        self.externals.insert(
                            e,
                            External {
                                value: value.clone(),
                                ty: ty.clone(),
                            },
                        );
                        self.external_of.insert(key, e);
                        e
                    }
                };
                Some((ValueRef::External(external), ty.shape == t.sizes))
            }
            StorageValue::Uninit => None,
        };
        let (value, same_shape) = match found {
            Some(found) => found,
            None => {
                // An unwritten storage reads as zeros: capture the fill.
                let mut params: SmallVec<[i64; 4]> = SmallVec::new();
                params.push(placement.native.code() as i64);
                params.push(placement.base_len);
                let meta = ops::meta(OpId::Zeros, &[], &[], &params)?;
                let same_shape = meta.outputs[0].shape == t.sizes;
                let id = self.push_node(
                    RegionOp::Aten(OpId::Zeros),
                    &params,
                    &[],
                    meta,
                    SmallVec::new(),
                );
                self.write_pending(t.storage, id.output(0));
                (ValueRef::Pending(id.output(0)), same_shape)
            }
        };
        if placement.whole {
            let reshape_to = (!same_shape).then(|| Box::new(t.sizes.clone()));
            return Ok(NodeInput {
                value,
                reshape_to,
                view: None,
                offset: None,
            });
        }
        let (chain, window, offset) = match windowed(t, placement) {
            Some((layout, extent)) => (
                views::decompose(extent, placement.native.size_bytes(), &layout)?,
                Some(extent),
                Some(t.offset),
            ),
            None => (
                views::decompose(
                    placement.base_len,
                    placement.native.size_bytes(),
                    &t.layout(),
                )?,
                None,
                None,
            ),
        };
        Ok(NodeInput {
            value,
            reshape_to: None,
            view: Some(Arc::new(InputView {
                chain,
                view_dtype: t.dtype,
                base_dtype: placement.native,
                window,
            })),
            offset,
        })
    }

    #[inline]
    fn push_node(
        &mut self,
        op: RegionOp,
        params: &[i64],
        scalars: &[ScalarArg],
        meta: Meta,
        inputs: SmallVec<[NodeInput; 3]>,
    ) -> NodeId {
        let id = self.ids.next_id();
        let position = self.pending.len();
        let (prev_s, prev_d) = self
            .pending
            .back()
            .map(|n| (n.prefix_shapeless, n.prefix_dims))
            .unwrap_or((0, 0));
        let base = self.pending.front().map(|n| n.id.seq()).unwrap_or(id.seq());
        // Built in the call: a node is large, and a local would be one more copy of it.
        self.pending.push_back(Node {
            id,
            op,
            params: SmallVec::from_slice(params),
            scalars: SmallVec::from_slice(scalars),
            meta,
            inputs,
            prefix_shapeless: 0,
            prefix_dims: 0,
            repeat_digest: 0,
            border: 0,
            work_prefix: 0,
        });
        // Hashed in place, for the same reason.
        let node = self.pending.back_mut().expect("just pushed");
        let (s, d) =
            Self::node_digests(node, position, base, &mut self.arg_numbers, &self.externals);
        node.prefix_shapeless = fuse::combine(prev_s, s);
        node.prefix_dims = fuse::combine(prev_d, d);
        self.track_repeats(position);
        id
    }

    /// Extends the repetition bookkeeping to the node at `position` (every node before it is
    /// up to date): amortized constant time per node.
    fn track_repeats(&mut self, position: usize) {
        let node = &self.pending[position];
        let digest = repeat_digest(node);
        let work: u64 = node.meta.outputs.iter().map(|t| t.numel() as u64).sum();
        let work_prefix = match position.checked_sub(1) {
            Some(previous) => self.pending[previous].work_prefix + work,
            None => work,
        };
        let anchor = self.repeat_anchor;
        let mut border = 0;
        if position > anchor {
            let previous_border = self.pending[position - 1].border as usize;
            let mut j = previous_border;
            border = loop {
                if self.pending[anchor + j].repeat_digest == digest {
                    break j + 1;
                }
                if j == 0 {
                    break 0;
                }
                j = self.pending[anchor + j - 1].border as usize;
            };
            if border == 0 && previous_border > 0 {
                // A partial match broke off: what came before does not repeat. Track from
                // here, so a loop whose first step differs still finds its period.
                self.repeat_anchor = position;
            }
        }
        let node = &mut self.pending[position];
        node.repeat_digest = digest;
        node.border = border as u32;
        node.work_prefix = work_prefix;
    }

    /// Where to cut the pending list so the device runs one stretch of a loop while the host
    /// captures the next, with every cut alike (one program). A loop is found when the ops since
    /// the tracking anchor are exactly two repetitions of a block (the fewest whole periods that
    /// make at least `min_ops` ops and `min_work` result elements): the cut takes everything up
    /// to the end of the first, and the block is remembered. From then on, ops since the anchor
    /// that repeat the remembered block are cut as soon as they are all captured, the
    /// remaining block of the two included. After a cut the list starts at a block boundary,
    /// so later cuts fall at the same place in the loop. Repetitions too small are left to grow
    /// into one region.
    pub fn repeat_cut(&mut self, min_ops: usize, min_work: u64) -> Option<usize> {
        let anchor = self.repeat_anchor;
        let n = self.pending.len().checked_sub(anchor)?;
        if let Some(cut) = self.known_block_cut(anchor) {
            return Some(cut);
        }
        let last = self.pending.back()?;
        if last.border == 0 {
            return None;
        }
        let period = n - last.border as usize;
        let before = match anchor {
            0 => 0,
            _ => self.pending[anchor - 1].work_prefix,
        };
        let period_work = (self.pending[anchor + period - 1].work_prefix - before).max(1);
        let repeats = min_ops
            .div_ceil(period)
            .max(min_work.div_ceil(period_work) as usize)
            .max(1);
        let block = period.checked_mul(repeats)?;
        if n != 2 * block {
            return None;
        }
        self.known_block.clear();
        self.known_block.extend(
            self.pending
                .range(anchor..anchor + block)
                .map(|node| node.repeat_digest),
        );
        Some(anchor + block)
    }

    /// Where to cut the pending list before flushing all of it (ascending lengths of prefixes
    /// to run first), so that a late, large result (a first layer's weight gradient) is not
    /// allocated while the scratch before it is live, and a value only the pending ops read is
    /// not held past its last reader (see `memory_cut`). Empty when one region is estimated to
    /// need no more memory.
    pub fn memory_cuts(&mut self) -> Vec<usize> {
        let ops = self.pending.len();
        let (Some(front), Some(back)) = (self.pending.front(), self.pending.back()) else {
            return Vec::new();
        };
        if ops < MEMORY_CUT_MIN_OPS {
            return Vec::new();
        }
        // A loop flushes the same ops with the same values held at every step: its plan is
        // remembered by the ops' digest and the positions of the held values. (A stale plan
        // would cost memory or launches, never correctness: any prefix may run first.)
        let base = front.id.seq();
        let held = self.holders.keys().fold(0u64, |acc, out| {
            let position = out.node.seq() - base;
            acc.wrapping_add(
                StableHasher::new()
                    .u64(position)
                    .u32(out.index)
                    .finish()
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15),
            )
        });
        let key = (back.prefix_shapeless, back.prefix_dims, held);
        if let Some(cuts) = self.memory_plans.get(&key) {
            return cuts.clone();
        }
        let cuts = self.plan_memory_cuts();
        if self.memory_plans.len() >= MEMORY_PLANS_KEPT {
            self.memory_plans.clear();
        }
        self.memory_plans.insert(key, cuts.clone());
        cuts
    }

    /// [`Graph::memory_cuts`], planned afresh.
    fn plan_memory_cuts(&self) -> Vec<usize> {
        let ops = self.pending.len();
        let base = self.pending.front().map_or(0, |n| n.id.seq());
        // Values numbered in capture order: node `p`'s outputs start at `first[p]`.
        let mut first = Vec::with_capacity(ops + 1);
        let mut count = 0;
        for node in &self.pending {
            first.push(count);
            count += node.meta.outputs.len();
        }
        first.push(count);
        let slot = |out: NodeOutput| first[(out.node.seq() - base) as usize] + out.index as usize;
        let pointwise = |node: &Node| matches!(node.op, RegionOp::Aten(op) if op.is_pointwise());
        let mut last_read: Vec<Option<usize>> = vec![None; count];
        let mut read_by_other = vec![false; count];
        let mut external_last_read: HashMap<ExternalId, usize> = HashMap::default();
        let mut values = Vec::with_capacity(count + ops);
        for (p, node) in self.pending.iter().enumerate() {
            let reader_pointwise = pointwise(node);
            let mut scalar_bytes = 0;
            for input in &node.inputs {
                match input.value {
                    ValueRef::Pending(out) => {
                        let s = slot(out);
                        last_read[s] = Some(p);
                        read_by_other[s] |= !reader_pointwise || input.view.is_some();
                    }
                    ValueRef::External(e) => {
                        external_last_read.insert(e, p);
                    }
                }
                if input.offset.is_some() {
                    scalar_bytes += DType::I64.size_bytes() as u64;
                }
            }
            scalar_bytes += node
                .meta
                .scalar_dtypes
                .iter()
                .take(node.scalars.len())
                .map(|d| d.size_bytes() as u64)
                .sum::<u64>();
            if scalar_bytes > 0 {
                values.push(ValueLife {
                    bytes: scalar_bytes,
                    def: p,
                    last_read: Some(p),
                    role: MemoryRole::Scalars,
                });
            }
        }
        // Externals a storage holds (or whose buffer an in-place result takes over) outlive
        // the pending ops; the others die once their last reader has run.
        let mut held_externals: HashSet<ExternalId> = HashSet::default();
        for (&(storage, version), &e) in &self.external_of {
            if let Some(st) = self.storages.get(&storage) {
                if st.version == version || self.overwritten.get(&storage) == Some(&e) {
                    held_externals.insert(e);
                }
            }
        }
        for (e, &last) in &external_last_read {
            if held_externals.contains(e) {
                continue;
            }
            if let Some(ext) = self.externals.get(e) {
                values.push(ValueLife {
                    bytes: ext.ty.nbytes(),
                    def: 0,
                    last_read: Some(last),
                    role: MemoryRole::Argument,
                });
            }
        }
        for (p, node) in self.pending.iter().enumerate() {
            for (k, ty) in node.meta.outputs.iter().enumerate() {
                let out = node.id.output(k as u32);
                let s = first[p] + k;
                let role = match self.holders.get(&out) {
                    Some(list)
                        if self.donate
                            && list.len() == 1
                            && self.overwritten.contains_key(&list[0]) =>
                    {
                        MemoryRole::DonatedOutput
                    }
                    Some(_) => MemoryRole::Output,
                    None if node.is_side_effecting() => MemoryRole::Output,
                    None => MemoryRole::Temp {
                        materialized: !pointwise(node) || read_by_other[s],
                    },
                };
                values.push(ValueLife {
                    bytes: ty.nbytes(),
                    def: p,
                    last_read: last_read[s],
                    role,
                });
            }
        }
        plan_cuts(&values, ops)
    }

    /// A cut after the pending ops that repeat the known block: those from `anchor` on, or,
    /// when the whole list is as long as the block, the whole list repeating it from another of
    /// its ops. That is a loop starting anew (after a sync) that was found mid-body: the block
    /// is re-aligned to where the user's loop starts, so its cuts match the syncs (one program
    /// whether or not the loop syncs) and a sync leaves no partial block behind.
    fn known_block_cut(&mut self, anchor: usize) -> Option<usize> {
        let len = self.known_block.len();
        let total = self.pending.len();
        if len == 0 || total < len {
            return None;
        }
        let known = &self.known_block;
        let at = |i: usize| self.pending[i].repeat_digest;
        if total - anchor == len && (0..len).all(|i| at(anchor + i) == known[i]) {
            return Some(total);
        }
        if total != len {
            return None;
        }
        // The block, or a rotation of it, that starts with this list's first op; a handful are
        // tried at most.
        let first = at(0);
        let rotation = (0..len)
            .filter(|&r| known[r] == first)
            .take(8)
            .find(|&r| (0..len).all(|i| at(i) == known[(i + r) % len]))?;
        self.known_block.rotate_left(rotation);
        Some(total)
    }

    /// The node's own digests: structure (shapeless) and sizes (dims), with inputs described
    /// relative to the pending list so one program shape gives one key wherever it starts.
    fn node_digests(
        node: &Node,
        position: usize,
        base_seq: u64,
        arg_numbers: &mut HashMap<ExternalId, u32>,
        externals: &HashMap<ExternalId, External<V>>,
    ) -> (u64, u64) {
        let inputs = node.inputs.iter().map(|input| InputDigest {
            source: match input.value {
                ValueRef::Pending(out) => InputSource::Pending {
                    back: (position - (out.node.seq() - base_seq) as usize) as u64,
                    index: out.index,
                },
                ValueRef::External(e) => {
                    let next = arg_numbers.len() as u32;
                    InputSource::Argument {
                        number: *arg_numbers.entry(e).or_insert(next),
                        stored: externals.get(&e).map(|ext| &ext.ty),
                    }
                }
            },
            reshape_to: input.reshape_to.as_deref().map(|shape| shape.as_slice()),
            view: input.view.as_deref(),
        });
        op_digests(&node.op, &node.params, &node.scalars, inputs, &node.meta)
    }

    /// Recomputes every pending node's digests (after a partial flush moved the list's start).
    fn rehash_pending(&mut self) {
        self.arg_numbers.clear();
        self.repeat_anchor = 0;
        let Some(base) = self.pending.front().map(|n| n.id.seq()) else {
            return;
        };
        let (mut prev_s, mut prev_d) = (0, 0);
        for position in 0..self.pending.len() {
            let (s, d) = Self::node_digests(
                &self.pending[position],
                position,
                base,
                &mut self.arg_numbers,
                &self.externals,
            );
            prev_s = fuse::combine(prev_s, s);
            prev_d = fuse::combine(prev_d, d);
            let node = &mut self.pending[position];
            node.prefix_shapeless = prev_s;
            node.prefix_dims = prev_d;
            self.track_repeats(position);
        }
    }

    fn write_pending(&mut self, storage: StorageId, out: NodeOutput) {
        let entry = self.storages.get_mut(&storage).expect("checked storage");
        let old = std::mem::replace(&mut entry.value, StorageValue::Pending { out });
        let old_version = entry.version;
        entry.version += 1;
        match old {
            StorageValue::Pending { out: old_out, .. } => self.drop_holder(old_out, storage),
            StorageValue::Device { .. } => {
                if self.donate {
                    let shared = self.shared_values.remove(&storage);
                    match self.external_of.get(&(storage, old_version)) {
                        Some(&e) if !shared => self.overwritten.insert(storage, e),
                        _ => self.overwritten.remove(&storage),
                    };
                }
            }
            StorageValue::Uninit => {}
        }
        self.holders.entry(out).or_default().push(storage);
    }

    /// A new storage holding pending value `out` (an op's fresh result): made with its value
    /// in one step rather than made unwritten and then written.
    fn new_pending_storage(&mut self, nbytes: u64, native: DType, out: NodeOutput) -> StorageId {
        // Version 1: one write, as `write_pending` would count it.
        let id = self.insert_storage(nbytes, Some(native), StorageValue::Pending { out }, 1);
        self.holders.entry(out).or_default().push(id);
        id
    }

    /// The type of a pending value: its producer's meta says it.
    fn pending_type(&self, out: NodeOutput) -> &TensorType {
        let base = self
            .pending
            .front()
            .expect("a pending value has a pending producer")
            .id
            .seq();
        &self.pending[(out.node.seq() - base) as usize].meta.outputs[out.index as usize]
    }

    fn drop_holder(&mut self, out: NodeOutput, storage: StorageId) {
        if let Some(list) = self.holders.get_mut(&out) {
            list.retain(|s| *s != storage);
            if list.is_empty() {
                self.holders.remove(&out);
            }
        }
    }

    // ----- host transfers -----

    /// Where the bytes of tensor `t` come from; `None` means a flush of its storage is needed
    /// first.
    pub fn read_source(&mut self, t: &TensorRef) -> Result<Option<ReadSource<V>>, EngineError> {
        if !self.placement(&"reading a pjrt tensor", t)?.whole {
            return Err(EngineError::runtime(
                "internal error: a strided tensor was read directly; copy it first",
            ));
        }
        Ok(match &self.storage(t.storage)?.value {
            StorageValue::Uninit => Some(ReadSource::Zeros),
            StorageValue::Device { value, ty } => {
                Some(ReadSource::Device(value.clone(), ty.clone()))
            }
            StorageValue::Pending { .. } => None,
        })
    }

    /// Gives tensor `t`'s storage a new device value (an upload from the host).
    pub fn write_device(&mut self, t: &TensorRef, value: V) -> Result<(), EngineError> {
        if !self.placement(&"writing a pjrt tensor", t)?.whole {
            return Err(EngineError::runtime(
                "internal error: a strided tensor was written directly; write through a copy",
            ));
        }
        let storage = self.storages.get_mut(&t.storage).unwrap();
        let old = std::mem::replace(
            &mut storage.value,
            StorageValue::Device { value, ty: t.ty() },
        );
        storage.version += 1;
        if let StorageValue::Pending { out, .. } = old {
            self.drop_holder(out, t.storage);
        }
        self.overwritten.remove(&t.storage);
        self.shared_values.remove(&t.storage);
        Ok(())
    }

    /// Whether any of these storages holds a pending value.
    pub fn any_pending(&self, storages: &[StorageId]) -> bool {
        storages.iter().any(|s| {
            matches!(
                self.storages.get(s).map(|st| &st.value),
                Some(StorageValue::Pending { .. })
            )
        })
    }

    // ----- flush -----

    /// Plans a materialization: chooses the region (ordered materialization), builds it, and
    /// installs a new output value (from `make_output`) into every storage holding an output.
    /// Returns `None` when nothing needs to run.
    pub fn flush(
        &mut self,
        request: FlushRequest<'_>,
        make_output: impl FnMut(&TensorType) -> V,
    ) -> Result<Option<Flush<V>>, EngineError> {
        self.flush_with(request, make_output, |_, _, _| false)
    }

    /// [`Graph::flush`], asking `has_program(shapeless, dims, ops)` once the key is known: when it
    /// answers yes, the region's source is not assembled (a warm flush needs only the key, the
    /// arguments and the outputs).
    pub fn flush_with(
        &mut self,
        request: FlushRequest<'_>,
        mut make_output: impl FnMut(&TensorType) -> V,
        has_program: impl FnOnce(u64, u64, usize) -> bool,
    ) -> Result<Option<Flush<V>>, EngineError> {
        if self.pending.is_empty() {
            return Ok(None);
        }
        let requested: Vec<ValueRef>;
        let liveness_request = match request {
            FlushRequest::All => Request::All,
            FlushRequest::Prefix(len) => Request::Prefix(len),
            FlushRequest::Storages(storages) => {
                requested = storages
                    .iter()
                    .filter_map(|s| match self.storages.get(s).map(|st| &st.value) {
                        Some(StorageValue::Pending { out, .. }) => Some(ValueRef::Pending(*out)),
                        _ => None,
                    })
                    .collect();
                if requested.is_empty() {
                    return Ok(None);
                }
                Request::Values(&requested)
            }
        };
        let holders = &self.holders;
        let plan = match (liveness_request, self.pending.front()) {
            // One pending op, flushed whole (every op in the op-by-op modes): the plan is that
            // op and its held outputs, which is what `liveness::plan` would compute for it.
            (Request::All, Some(node)) if self.pending.len() == 1 => {
                let plan = single_node_plan(node, |out| holders.contains_key(&out));
                debug_assert_eq!(
                    Some(&plan),
                    liveness::plan(&self.pending, Request::All, |out| holders
                        .contains_key(&out))
                    .ok()
                    .map(RegionPlan::from)
                    .as_ref()
                );
                plan
            }
            _ => liveness::plan(&self.pending, liveness_request, |out| {
                holders.contains_key(&out)
            })
            .map(RegionPlan::from)
            .map_err(|e| EngineError::runtime(format!("internal error planning a region: {e}")))?,
        };
        if plan.region_len() == 0 {
            return Ok(None);
        }
        if plan.kept.is_empty() {
            // Every op of the region is dead: drop them; nothing runs.
            self.pending.drain(..plan.region_len());
            self.stats.dropped_ops += plan.dropped as u64;
            self.forget_unread_externals();
            return Ok(None);
        }
        let base = self.pending.front().unwrap().id.seq();
        let position = |id: NodeId| (id.seq() - base) as usize;

        // Externals numbered by first use, operands resolved, scalars gathered; the nodes
        // themselves become the region source below, untouched.
        let mut arg_types: SmallVec<[TensorType; 2]> = SmallVec::new();
        let mut args: SmallVec<[V; 4]> = SmallVec::new();
        let mut arg_index = SmallMap::default();
        // By pending position (the region is a prefix of the pending list, ids contiguous).
        let mut region_index: SmallVec<[u32; 8]> = SmallVec::from_elem(u32::MAX, plan.region_len());
        let mut operands: SmallVec<[Operand; 4]> = SmallVec::new();
        let mut scalars: SmallVec<[(ScalarArg, DType); 4]> = SmallVec::new();
        for (k, &id) in plan.kept.iter().enumerate() {
            let node = &self.pending[position(id)];
            for input in &node.inputs {
                operands.push(match input.value {
                    ValueRef::Pending(out) => Operand::Node {
                        node: region_index[position(out.node)],
                        output: out.index,
                    },
                    ValueRef::External(e) => Operand::Arg(arg_index.number(e, || {
                        let ext = &self.externals[&e];
                        arg_types.push(ext.ty.clone());
                        args.push(ext.value.clone());
                    })),
                });
                if let Some(offset) = input.offset {
                    scalars.push((ScalarArg::int(offset), DType::I64));
                }
            }
            for (scalar, dtype) in node.scalars.iter().zip(&node.meta.scalar_dtypes) {
                scalars.push((*scalar, *dtype));
            }
            region_index[position(id)] = k as u32;
        }
        let (slots, packs) = fuse::pack_scalars(&scalars);

        // Outputs and the key (prefix digest of the region, then the outputs).
        let last = self.pending[plan.region_len() - 1].clone_digests();
        let mut key_s = StableHasher::new();
        let mut key_d = StableHasher::new();
        key_s.u64(last.0).u64(plan.outputs.len() as u64);
        key_d.u64(last.1);
        let mut region_outputs: SmallVec<[Operand; 2]> =
            SmallVec::with_capacity(plan.outputs.len());
        let mut output_types: SmallVec<[TensorType; 2]> =
            SmallVec::with_capacity(plan.outputs.len());
        let pending = &self.pending;
        // Makes `out` a region output: keyed by its position, typed by its producer's meta.
        let mut add_output = |out: NodeOutput, key_s: &mut StableHasher| {
            let at = position(out.node);
            key_s.u64(at as u64).u32(out.index);
            region_outputs.push(Operand::Node {
                node: region_index[at],
                output: out.index,
            });
            output_types.push(pending[at].meta.outputs[out.index as usize].clone());
        };
        for output in &plan.outputs {
            add_output(output.value, &mut key_s);
        }
        // Side-effecting ops are kept even when nothing reads them; their results (check
        // verdicts) leave the region so the engine can act on them.
        let mut check_outputs: Vec<(NodeOutput, String)> = Vec::new();
        let mut checks_in_outputs: Vec<(usize, String)> = Vec::new();
        for &id in &plan.kept {
            let node = &pending[position(id)];
            if !node.is_side_effecting() {
                continue;
            }
            for k in 0..node.meta.outputs.len() as u32 {
                let out = id.output(k);
                match plan.output_position(out) {
                    Some(i) => checks_in_outputs.push((i, node.op.name().to_string())),
                    None => check_outputs.push((out, node.op.name().to_string())),
                }
            }
        }
        key_s.u64(check_outputs.len() as u64);
        for (out, _) in &check_outputs {
            add_output(*out, &mut key_s);
        }
        let dims = key_d.finish();

        // Install the new values.
        let outputs: SmallVec<[V; 2]> = output_types.iter().map(&mut make_output).collect();
        let checks: Vec<(V, String)> = checks_in_outputs
            .into_iter()
            .map(|(i, label)| (outputs[i].clone(), label))
            .chain(
                check_outputs
                    .into_iter()
                    .enumerate()
                    .map(|(i, (_, label))| (outputs[plan.outputs.len() + i].clone(), label)),
            )
            .collect();
        let mut replacement: HashMap<NodeOutput, ExternalId> = HashMap::default();
        // (external the storage held before, output index) for the donation decision below.
        let mut successors: SmallVec<[(ExternalId, u32); 4]> = SmallVec::new();
        for (j, ((output, value), ty)) in plan
            .outputs
            .iter()
            .zip(&outputs)
            .zip(&output_types)
            .enumerate()
        {
            if let Some(list) = self.holders.remove(&output.value) {
                let shared = list.len() > 1;
                for storage in list {
                    if let Some(e) = self.overwritten.remove(&storage) {
                        if !shared {
                            successors.push((e, j as u32));
                        }
                    }
                    if shared && self.donate {
                        self.shared_values.insert(storage);
                    }
                    if let Some(st) = self.storages.get_mut(&storage) {
                        st.value = StorageValue::Device {
                            value: value.clone(),
                            ty: ty.clone(),
                        };
                    }
                }
            }
            if output.read_by_pending {
                let e = ExternalId(self.next_external);
                self.next_external += 1;
                self.externals.insert(
                    e,
                    External {
                        value: value.clone(),
                        ty: ty.clone(),
                    },
                );
                replacement.insert(output.value, e);
            }
        }
        let region_len = plan.region_len();
        let nodes: SmallVec<[Node; 1]> = if region_len == 1 && plan.kept.len() == 1 {
            // One kept op: moved once, not through a draining filter (a node is large).
            let mut one = SmallVec::new();
            one.push(self.pending.pop_front().expect("a region of one op"));
            one
        } else {
            let mut kept = plan.kept.iter().peekable();
            self.pending
                .drain(..region_len)
                .filter(|node| kept.next_if(|&&id| id == node.id).is_some())
                .collect()
        };
        for node in self.pending.iter_mut() {
            for input in node.inputs.iter_mut() {
                if let ValueRef::Pending(out) = input.value {
                    if let Some(e) = replacement.get(&out) {
                        input.value = ValueRef::External(*e);
                    }
                }
            }
        }
        self.forget_unread_externals();

        // Donation is decided last: only now have the pending ops let go of what they no longer
        // read. An argument is paired with the output that replaced it in its storage (same
        // type): naming the pair, rather than letting the compiler match donors to outputs by
        // shape, keeps it from giving a parameter's buffer to, say, its gradient and copying the
        // parameter aside.
        let mut aliases: SmallVec<[(u32, u32); 2]> = SmallVec::new();
        for &(e, j) in &successors {
            let Some(i) = arg_index.get(e) else { continue };
            if output_types[j as usize] == arg_types[i as usize]
                && !self.externals.contains_key(&e)
                && !aliases.iter().any(|&(a, o)| a == i || o == j)
            {
                aliases.push((i, j));
            }
        }
        aliases.sort_unstable();
        let shapeless = finish_shapeless_key(&mut key_s, &aliases);
        #[cfg(debug_assertions)]
        if let Some(expected) = self.direct_key_check.take() {
            debug_assert_eq!(
                expected,
                (shapeless, dims),
                "the direct path keyed {} differently from its flush",
                region_label(&nodes)
            );
        }

        let label = match nodes.as_slice() {
            [node] => {
                let name = node.op.name();
                self.op_labels
                    .entry(name)
                    .or_insert_with(|| Arc::from(name))
                    .clone()
            }
            nodes => Arc::from(region_label(nodes)),
        };
        let ops = nodes.len();
        let region = (!has_program(shapeless, dims, ops)).then(|| {
            Box::new(RegionSource {
                nodes,
                operands,
                arg_types,
                slots,
                scalar_packs: packs.iter().map(|p| (p.dtype, p.count)).collect(),
                outputs: region_outputs,
                aliases: aliases.clone(),
            })
        });
        self.stats.materializations += 1;
        self.stats.regions += 1;
        self.stats.region_ops += plan.kept.len() as u64;
        self.stats.dropped_ops += plan.dropped as u64;
        self.stats.largest_region = self.stats.largest_region.max(plan.kept.len() as u64);
        Ok(Some(Flush {
            shapeless,
            dims,
            region,
            ops,
            aliases,
            args,
            scalar_packs: packs,
            outputs,
            label,
            dropped_ops: plan.dropped,
            checks,
        }))
    }

    /// Drops the device values no pending op reads any more, and re-keys what stays pending
    /// (its positions moved).
    fn forget_unread_externals(&mut self) {
        if self.pending.is_empty() {
            self.repeat_anchor = 0;
            // `clear` sweeps a map's whole capacity: skip the empty ones, as after every op
            // in the op-by-op modes.
            clear_if_any(&mut self.externals);
            clear_if_any(&mut self.external_of);
            clear_if_any(&mut self.arg_numbers);
            return;
        }
        let mut used = rustc_hash::FxHashSet::default();
        for node in &self.pending {
            for input in &node.inputs {
                if let ValueRef::External(e) = input.value {
                    used.insert(e);
                }
            }
        }
        self.externals.retain(|e, _| used.contains(e));
        self.external_of.retain(|_, e| used.contains(e));
        self.rehash_pending();
    }

    /// Counts a captured op as deferred (DeferAndFuse) rather than run at once.
    pub fn note_deferred(&mut self) {
        self.stats.deferred_ops += 1;
    }
}

impl Node {
    fn clone_digests(&self) -> (u64, u64) {
        (self.prefix_shapeless, self.prefix_dims)
    }
}

/// Numbers externals by first use. Regions read few of them, and most flushes run one op: a
/// short list searched in order beats hashing, and spills to a map for large regions.
#[derive(Default)]
struct SmallMap {
    list: SmallVec<[(ExternalId, u32); 8]>,
    map: HashMap<ExternalId, u32>,
}

impl SmallMap {
    /// `e`'s number, if it has one.
    fn get(&self, e: ExternalId) -> Option<u32> {
        if self.map.is_empty() {
            self.list.iter().find(|(x, _)| *x == e).map(|&(_, n)| n)
        } else {
            self.map.get(&e).copied()
        }
    }

    /// `e`'s number, assigning the next one (and calling `on_new`) the first time.
    fn number(&mut self, e: ExternalId, on_new: impl FnOnce()) -> u32 {
        let next = (self.list.len() + self.map.len()) as u32;
        if self.map.is_empty() {
            if let Some(&(_, n)) = self.list.iter().find(|(x, _)| *x == e) {
                return n;
            }
            if self.list.len() < 8 {
                self.list.push((e, next));
                on_new();
                return next;
            }
            self.map.extend(self.list.drain(..));
        }
        match self.map.entry(e) {
            std::collections::hash_map::Entry::Occupied(o) => *o.get(),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(next);
                on_new();
                next
            }
        }
    }
}

/// The plan of flushing a pending list of exactly one node whole: no request, no pending
/// reader, so its outputs are the held ones and it is kept when one is held or it has side
/// effects.
fn single_node_plan(node: &Node, mut is_held: impl FnMut(NodeOutput) -> bool) -> RegionPlan {
    let outputs: SmallVec<[liveness::Output; 2]> = (0..node.num_outputs())
        .map(|index| node.id.output(index))
        .filter(|&value| is_held(value))
        .map(|value| liveness::Output {
            value,
            requested: false,
            held_by_storage: true,
            read_by_pending: false,
        })
        .collect();
    let keep = node.is_side_effecting() || !outputs.is_empty();
    RegionPlan {
        kept: if keep {
            SmallVec::from_elem(node.id, 1)
        } else {
            SmallVec::new()
        },
        outputs,
        dropped: usize::from(!keep),
    }
}

/// Ends a region's shapeless key with its (argument, output) aliases, sorted: the last part of
/// the key, the same for a flush and for Strict's direct path.
fn finish_shapeless_key(key_s: &mut StableHasher, aliases: &[(u32, u32)]) -> u64 {
    key_s.u64(aliases.len() as u64);
    for &(i, j) in aliases {
        key_s.u32(i).u32(j);
    }
    key_s.finish()
}

/// What an op's digests need of one of its inputs.
struct InputDigest<'a> {
    source: InputSource<'a>,
    reshape_to: Option<&'a [i64]>,
    view: Option<&'a InputView>,
}

enum InputSource<'a> {
    /// Output `index` of the op `back` places earlier in the pending list.
    Pending { back: u64, index: u32 },
    /// Region argument `number` (numbered by first use), of the stored type when known.
    Argument {
        number: u32,
        stored: Option<&'a TensorType>,
    },
}

/// What a node computes (op, lowering variant, params, scalar count, result types), blind to
/// where its inputs come from: the same op of every repetition of a loop body has the same
/// digest whether the repetition before it is still pending or already materialized. It only
/// picks cut points (a collision costs a cut that does not repeat, never a wrong result), so
/// it is a quick multiply-rotate mix rather than the key's hash.
fn repeat_digest(node: &Node) -> u64 {
    fn mix(h: u64, x: u64) -> u64 {
        (h.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95)
    }
    let mut h = match &node.op {
        RegionOp::Aten(op) => mix(op.id() as u64, node.meta.variant as u64),
        RegionOp::WriteView(w) => mix(0xffff, w.base_len as u64),
    };
    for &p in &node.params {
        h = mix(h, p as u64);
    }
    h = mix(h, node.scalars.len() as u64);
    for out in &node.meta.outputs {
        h = mix(h, out.dtype.code() as u64);
        for &size in &out.shape {
            h = mix(h, size as u64);
        }
    }
    h
}

/// An op's own digests: structure (shapeless) and sizes (dims). Shared by capture and by
/// Strict's direct path, which must key a one-op region exactly as a flush of it would.
/// Inlined into both: it runs on every captured op.
#[inline(always)]
fn op_digests<'a>(
    op: &RegionOp,
    params: &[i64],
    scalars: &[ScalarArg],
    inputs: impl ExactSizeIterator<Item = InputDigest<'a>>,
    meta: &Meta,
) -> (u64, u64) {
    let outputs = &meta.outputs[..];
    let mut s = StableHasher::new();
    let mut d = StableHasher::new();
    match op {
        RegionOp::Aten(op) => {
            s.u32(op.id() as u32);
            // Most ops have no value-picked lowering; skipping the word keeps their keys as
            // they were. Op ids sit below 0x10000, so the tagged word can't read as another op's.
            if meta.variant != 0 {
                s.u32(0x1_0000 | meta.variant as u32);
            }
        }
        RegionOp::WriteView(w) => {
            s.u32(0xffff)
                .dtype(w.view_dtype)
                .dtype(w.base_dtype)
                .u32(u32::from(w.window.is_some()));
            d.i64(w.base_len).i64(w.window.unwrap_or(-1));
            views::hash_write_program_split(&w.program, &mut s, &mut d);
        }
    }
    let sizes_from = match op {
        RegionOp::Aten(op) => op.first_size_param(),
        RegionOp::WriteView(_) => None,
    };
    match sizes_from {
        Some(k) if k <= params.len() => {
            s.i64s(&params[..k]).u64(params.len() as u64);
            d.i64s(&params[k..]);
        }
        _ => {
            s.i64s(params);
        }
    }
    s.u64(scalars.len() as u64);
    for scalar in scalars {
        s.scalar_kind(scalar);
    }
    s.u64(inputs.len() as u64);
    for input in inputs {
        match input.source {
            InputSource::Pending { back, index } => {
                s.u32(1).u64(back).u32(index);
            }
            InputSource::Argument { number, stored } => {
                s.u32(2).u32(number);
                if let Some(ty) = stored {
                    s.dtype(ty.dtype);
                    d.i64s(&ty.shape);
                }
            }
        }
        match (input.reshape_to, input.view) {
            (_, Some(view)) => {
                s.u32(2)
                    .dtype(view.view_dtype)
                    .dtype(view.base_dtype)
                    .u32(u32::from(view.window.is_some()));
                d.i64(view.window.unwrap_or(-1));
                views::hash_chain_split(&view.chain, &mut s, &mut d);
            }
            (Some(shape), None) => {
                s.u32(1);
                d.i64s(shape);
            }
            (None, None) => {
                s.u32(0);
            }
        }
    }
    for out in outputs {
        s.dtype(out.dtype);
        d.i64s(&out.shape);
    }
    (s.finish(), d.finish())
}

fn clear_if_any<K, T>(map: &mut HashMap<K, T>) {
    if !map.is_empty() {
        map.clear();
    }
}

/// A [`liveness::Plan`] in inline lists: a one-op region, planned for every op in the op-by-op
/// modes, then needs no allocation.
#[derive(Debug, PartialEq)]
struct RegionPlan {
    kept: SmallVec<[NodeId; 1]>,
    outputs: SmallVec<[liveness::Output; 2]>,
    /// How many ops of the region are dropped (the region is `kept` and these, in a prefix).
    dropped: usize,
}

impl RegionPlan {
    fn region_len(&self) -> usize {
        self.kept.len() + self.dropped
    }

    fn output_position(&self, value: NodeOutput) -> Option<usize> {
        self.outputs.iter().position(|output| output.value == value)
    }
}

impl From<liveness::Plan> for RegionPlan {
    fn from(plan: liveness::Plan) -> Self {
        RegionPlan {
            kept: plan.kept.into(),
            outputs: plan.outputs.into(),
            dropped: plan.dropped.len(),
        }
    }
}

/// PyTorch's `canCast`: a result may be written into an output of a lower category only from
/// bool, never float into integral or anything but bool into bool.
fn can_cast(from: DType, to: DType) -> bool {
    if from.is_float() && !to.is_float() {
        return false;
    }
    !(from != DType::Bool && to == DType::Bool)
}

/// `t` with every stride-0 dim shrunk to one element: the distinct elements of an expanded view.
fn collapse_expanded(t: &TensorRef) -> TensorRef {
    let mut collapsed = t.clone();
    for (size, &stride) in collapsed.sizes.iter_mut().zip(&t.strides) {
        if stride == 0 && *size > 1 {
            *size = 1;
        }
    }
    collapsed
}

/// Names an op's operand in errors; formatted only when an error is raised.
struct OperandName(OpId, &'static str, usize);

impl std::fmt::Display for OperandName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.0.name(), self.1, self.2)
    }
}

fn unknown_storage(id: StorageId) -> EngineError {
    EngineError::runtime(format!(
        "pjrt storage {} does not exist (it was released, or never allocated by this engine); \
         this tensor can no longer be used",
        id.0
    ))
}
