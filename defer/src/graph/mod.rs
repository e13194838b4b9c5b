//! The deferred-op graph: storages and their values, and capture (meta at once, views decomposed,
//! writes through views, node appended with its digests). The rest of `Graph` lives beside it,
//! one concern a module: `key` (digests and region keys), `flush` (planning a region), `region`
//! (its source), `direct` (Strict's direct path), `repeat` and `memory` (where DeferAndFuse cuts).

use crate::memory_cut::{plan_cuts, Role as MemoryRole, ValueLife};
use crate::signature::{
    self, InputOrigin, InputSignature, OpSignature, RegionSignature, ScalarKind,
};
use crate::storage::{Storage, StorageId, StorageSlots, StorageValue};
use fuse::{InputRef, InputView, Operand, Region, RegionNode, RegionOp, StableHasher, WriteView};
use liveness::{ExternalId, NodeId, NodeIdSequence, NodeOutput, PendingNode, Request, ValueRef};
use ops::param_layout as layout;
pub use ops::ErrorKind;
use ops::{typed, DType, Meta, OpError, OpId, ScalarArg, Shape, TensorType};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::Arc;

mod direct;
mod flush;
mod isolate;
mod key;
mod known;
mod memory;
mod padded;
mod prologue;
mod region;
mod repeat;

pub use isolate::{isolation_cuts, PlannedRegion};
use key::*;
pub(crate) use known::KnownValues;
pub use padded::Regrow;
pub use prologue::Prologue;
pub use region::RegionSource;
use region::*;

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
    /// The storage's value is padded (`crate::bucket`): never whole, read through `padded`.
    padded: bool,
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

/// How big a region is, for choosing how hard to compile it: its ops, and the elements they
/// produce (a function of the region's key, so one key always gets one choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionSize {
    pub ops: usize,
    pub work: u64,
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
    /// Elements the ops that run produce.
    pub work: u64,
    /// (argument, output) pairs: the output is the argument's storage's new value, and the
    /// argument's buffer is donated to it.
    pub aliases: SmallVec<[(u32, u32); 2]>,
    pub args: SmallVec<[V; 4]>,
    pub scalar_packs: fuse::ScalarPacks,
    pub outputs: SmallVec<[V; 2]>,
    /// Shared: a one-op region's label is the op's name, made once per op.
    pub label: Arc<str>,
    /// The digests chained over the region's ops (its ops and sizes, before outputs and
    /// aliases): what [`Graph::planned_region`] reports for the same region before it is flushed.
    pub prefix: (u64, u64),
    pub dropped_ops: usize,
    /// Verdicts of the region's side-effecting checks (`_assert_async`): 0-d bools that must be
    /// true, each with the op that produced it. They are extra outputs no storage holds.
    pub checks: Vec<(V, CheckSite)>,
    /// The device the region runs on: its arguments are there and its results go there.
    pub device: u32,
}

/// Where a check verdict comes from: the checking op, and the user's line that queued it when
/// op lines are recorded ([`Graph::set_capture_location`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckSite {
    pub op: &'static str,
    pub location: Option<Arc<str>>,
}

impl CheckSite {
    /// `message`, followed by where the check was queued when that is known.
    pub fn locate(&self, message: &str) -> String {
        match &self.location {
            Some(at) => format!("{message} (checked by {} queued at {at})", self.op),
            None => message.to_string(),
        }
    }
}

/// A view's elements within its storage's whole value, for a read gathered on the host:
/// sizes, and strides and offset in elements of the value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostGather {
    pub sizes: Shape,
    pub strides: SmallVec<[i64; 6]>,
    pub offset: i64,
}

impl HostGather {
    /// Copies the view's elements (`element` bytes each) out of `value`, the whole value's
    /// bytes, into `dst` in row-major order; `false` when the view reaches past `value`.
    pub fn copy(&self, value: &[u8], element: usize, dst: &mut [u8]) -> bool {
        let numel: i64 = self.sizes.iter().product();
        if numel <= 0 {
            return true;
        }
        let last = self.offset
            + self
                .sizes
                .iter()
                .zip(&self.strides)
                .map(|(&n, &s)| (n - 1) * s)
                .sum::<i64>();
        if self.offset < 0 || (last as usize + 1) * element > value.len() {
            return false;
        }
        if dst.len() != numel as usize * element {
            return false;
        }
        // The innermost dimension moves in one copy when it is contiguous.
        let rank = self.sizes.len();
        let (inner, inner_stride) = match rank {
            0 => (1, 1),
            _ => (self.sizes[rank - 1], self.strides[rank - 1]),
        };
        let outer_rank = rank.saturating_sub(1);
        let mut index: SmallVec<[i64; 6]> = SmallVec::from_elem(0, outer_rank);
        let mut written = 0;
        loop {
            let base = self.offset
                + index
                    .iter()
                    .zip(&self.strides)
                    .map(|(&i, &s)| i * s)
                    .sum::<i64>();
            if inner_stride == 1 {
                let from = base as usize * element;
                let len = inner as usize * element;
                dst[written..written + len].copy_from_slice(&value[from..from + len]);
                written += len;
            } else {
                for k in 0..inner {
                    let from = (base + k * inner_stride) as usize * element;
                    dst[written..written + element].copy_from_slice(&value[from..from + element]);
                    written += element;
                }
            }
            // The next outer index, last dimension fastest.
            let mut d = outer_rank;
            loop {
                if d == 0 {
                    return true;
                }
                d -= 1;
                index[d] += 1;
                if index[d] < self.sizes[d] {
                    break;
                }
                index[d] = 0;
            }
        }
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
    /// Ops captured on padded values (bounded shapes: one program per bucket, not per size).
    pub padded_ops: u64,
    /// Padded values cut back to their true sizes for a reader that needs them exact.
    pub unpadded_values: u64,
    /// Padded device values given the next bucket before an append outgrew them.
    pub regrown_values: u64,
    /// Host uploads made padded along a dimension whose length changes (bounded shapes).
    pub padded_uploads: u64,
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
/// How a node reads tensor `t`, which is not its storage's whole value: the movements from the
/// value to it, and a window's offset (lifted to a runtime scalar) where it has one.
fn input_view(
    t: &TensorRef,
    placement: &Placement,
) -> Result<(Arc<InputView>, Option<i64>), EngineError> {
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
    let view = InputView {
        chain,
        view_dtype: t.dtype,
        base_dtype: placement.native,
        window,
    };
    Ok((Arc::new(view), offset))
}

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
    /// The user's line that captured it, when the engine records lines (see
    /// [`Graph::set_capture_location`]).
    location: Option<Arc<str>>,
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
    /// Storages whose value pending ops also read through an external of its own (a region
    /// output read by the ops left pending), until the pending list empties.
    read_elsewhere: HashSet<StorageId>,
    /// The (storage, version) of released storages whose value another storage or external
    /// held too: an append must not take over such a value's buffer (`append_donor`).
    released_shared: HashSet<(StorageId, u64)>,
    /// Memory cuts planned for whole flushes, by the flushed ops and what they leave held
    /// (see [`Graph::memory_cuts`]).
    memory_plans: HashMap<(u64, u64, u64), Vec<usize>>,
    /// The user's line of the op being captured, given to the nodes it makes.
    capture_location: Option<Arc<str>>,
    /// Labels of one-op regions by op name, so an op-by-op flush allocates no label.
    op_labels: HashMap<&'static str, Arc<str>>,
    /// The key [`Graph::run_if_compiled`] computed for an op it then left to capture and flush:
    /// checked against the flush's own key (debug builds), so the two keyings cannot drift.
    #[cfg(debug_assertions)]
    direct_key_check: Option<(u64, u64)>,
    /// Whether growing sequences are padded to buckets (see `set_bounded`).
    bounded: bool,
    /// Storages read before anything was written to them (read as zeros), since the last
    /// [`Graph::take_zero_filled`].
    zero_filled: Vec<StorageId>,
    /// Appends seen, to tell a growing sequence (see `crate::bucket::GrowthSites`).
    growth: crate::bucket::GrowthSites,
    /// Uploads seen, to tell a batch whose length changes (see `crate::bucket::UploadSites`).
    uploads: crate::bucket::UploadSites,
    counts: crate::bucket::CountSites,
    /// The true length and bucket of the latest append into a padded value (or padded upload):
    /// tensors made from nothing at that length are made padded too (`creation_padded`).
    last_extent: Option<(i64, i64)>,
    /// The device the pending ops run on (an index among the process's devices): the engine
    /// launches them before it captures an op of another device, so a region never mixes
    /// devices, and the storages an op makes are on it.
    device: u32,
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
            read_elsewhere: HashSet::default(),
            released_shared: HashSet::default(),
            memory_plans: HashMap::default(),
            op_labels: HashMap::default(),
            capture_location: None,
            zero_filled: Vec::new(),
            #[cfg(debug_assertions)]
            direct_key_check: None,
            bounded: true,
            growth: Default::default(),
            uploads: Default::default(),
            counts: Default::default(),
            last_extent: None,
            device: 0,
        }
    }

    /// The device the pending ops run on, and that the storages ops make are on.
    pub fn device(&self) -> u32 {
        self.device
    }

    /// Makes `device` the one later ops run on; refused while ops of another device are
    /// pending (the engine launches them first).
    pub fn set_device(&mut self, device: u32) -> Result<(), EngineError> {
        if device != self.device && !self.pending.is_empty() {
            return Err(EngineError::new(
                ErrorKind::Runtime,
                format!(
                    "internal error: ops of device {} are pending while ops of device {device} \
                     arrive",
                    self.device
                ),
            ));
        }
        self.device = device;
        Ok(())
    }

    /// The device that holds a storage's value.
    pub fn storage_device(&self, id: StorageId) -> Result<u32, EngineError> {
        Ok(self.storage(id)?.device)
    }

    /// The first device other than `device` that holds one of `tensors`' storages: an op
    /// reading or writing it would mix devices.
    pub fn other_device(
        &self,
        tensors: &[TensorRef],
        device: u32,
    ) -> Result<Option<u32>, EngineError> {
        for t in tensors {
            let other = self.storage(t.storage)?.device;
            if other != device {
                return Ok(Some(other));
            }
        }
        Ok(None)
    }

    /// Whether a sequence seen growing by appends is kept padded to a bucket (bounded shapes,
    /// RFC 0029), so its readers compile once per bucket rather than once per length.
    pub fn set_bounded(&mut self, enabled: bool) {
        self.bounded = enabled;
    }

    /// Enables input donation: a region argument that was a storage's value until the region
    /// overwrote it, and that no other storage and no op left pending reads, is aliased to the
    /// output that becomes the storage's new value (the executable updates it in place). The
    /// decision rests on the graph alone, so a repeated program always gets the same aliases
    /// (and executable); a holder outside the graph at run time (a read in flight) makes the
    /// execution copy the argument instead (`ExecJob` checks).
    /// Names the user's line that the next captures come from (`None`: unknown); the nodes
    /// they make keep it, and a recompile's explanation names it.
    pub fn set_capture_location(&mut self, location: Option<Arc<str>>) {
        self.capture_location = location;
    }

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

    /// A new, unwritten storage of `nbytes` bytes on `device`.
    pub fn new_storage_on(&mut self, nbytes: u64, device: u32) -> StorageId {
        let id = self.new_storage_of(nbytes, None);
        if let Some(storage) = self.storages.get_mut(&id) {
            storage.device = device;
        }
        id
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
            device: self.device,
            native,
            value,
            version,
            padding: None,
            known: None,
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
        if self.shared_values.remove(&id) | self.read_elsewhere.remove(&id) {
            self.released_shared.insert((id, storage.version));
        }
        Ok(())
    }

    pub fn storage_nbytes(&self, id: StorageId) -> Result<u64, EngineError> {
        Ok(self.storage(id)?.nbytes)
    }

    /// Changes a storage's byte size (`resize_`); only an unwritten storage can change size so far.
    pub fn resize_storage(&mut self, id: StorageId, nbytes: u64) -> Result<(), EngineError> {
        if self.is_padded(id) {
            self.unpad(id)?;
        }
        let storage = self
            .storages
            .get_mut(&id)
            .ok_or_else(|| unknown_storage(id))?;
        if storage.nbytes == nbytes {
            return Ok(());
        }
        // Some resizes change the bytes without a write (an unwritten storage's size).
        storage.known = None;
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
            padded: false,
        };
        let input = self.read_for_node(&old, &placement)?;
        let call = if new_len > old_len {
            typed::ConstantPadNd.encode(layout::PadWidths {
                pad: &[0, new_len - old_len],
            })
        } else {
            typed::Slice.encode(layout::SliceRange {
                dim: 0,
                start: 0,
                end: new_len,
                step: 1,
            })
        };
        let meta = ops::meta(
            call.op,
            &[TensorType::new(native, &[old_len])],
            &[],
            &call.params,
        )?;
        let node = self.push_node(
            RegionOp::Aten(call.op),
            &call.params,
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
        let padded = storage.padding.is_some();
        let whole =
            !padded && t.offset == 0 && t.dtype == native && t.contiguous_numel() == Some(base_len);
        if !whole {
            views::check_in_bounds(base_len, native.size_bytes(), &t.layout())?;
        }
        Ok(Placement {
            native,
            base_len,
            whole,
            padded,
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
        // Read before the capture: a write through a view keeps the rest of the old value.
        let known = self.known_write(op, inputs, scalars, params, outs);
        let captured = self.capture_op(op, inputs, scalars, params, outs)?;
        if let Some(write) = known {
            self.remember_known(write, &captured);
        }
        if op == OpId::Cat && inputs.len() == 2 && outs.is_empty() {
            if let Some(&(storage, _)) = captured.outputs.first() {
                let first = inputs[0].sizes.as_slice() == [0];
                self.growth.note_result(storage, first);
            }
        }
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
        check_out_dtypes(op, outs, &meta)?;
        if outs.len() <= 1 && self.may_create_padded(op, inputs, &meta) {
            let true_ty = &meta.outputs[0];
            if let Some(captured) = self.creation_padded(op, true_ty, scalars, params, outs)? {
                return Ok(captured);
            }
        }
        if placements.iter().any(|p| p.padded) || outs.iter().any(|o| self.is_padded(o.storage)) {
            return self.capture_padded(op, inputs, scalars, params, outs, &types);
        }
        if outs.is_empty() {
            if let Some(captured) = self.window_padded(op, inputs, scalars, params, &types)? {
                return Ok(captured);
            }
        }
        if let Some(dim) = self.first_entry_dim(op, inputs, outs, &types, params) {
            return self.first_entry(inputs, &types, dim);
        }
        if op == OpId::Cat && inputs.len() == 2 && outs.is_empty() && self.bounded {
            if let Some(captured) = self.start_append(inputs, params, &types, &placements)? {
                return Ok(captured);
            }
        }
        if outs.is_empty() {
            if let Some(captured) = self.count_padded(op, inputs, params, &types, &placements)? {
                return Ok(captured);
            }
        }
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
                    let convert = typed::Convert.encode(layout::ConvertTo { dtype: out.dtype });
                    let cast_meta = ops::meta(
                        convert.op,
                        std::slice::from_ref(produced),
                        &[],
                        &convert.params,
                    )?;
                    let input = NodeInput::plain(ValueRef::Pending(value));
                    let cast = self.push_node(
                        RegionOp::Aten(convert.op),
                        &convert.params,
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
            float_default: None,
            matmul_precision: None,
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
                if self.zero_filled.len() < 1024 {
                    self.zero_filled.push(t.storage);
                }
                let zeros = typed::Zeros.encode(layout::Creation {
                    dtype: placement.native,
                    sizes: &[placement.base_len],
                });
                let meta = ops::meta(zeros.op, &[], &[], &zeros.params)?;
                let same_shape = meta.outputs[0].shape == t.sizes;
                let id = self.push_node(
                    RegionOp::Aten(zeros.op),
                    &zeros.params,
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
        let (view, offset) = input_view(t, placement)?;
        Ok(NodeInput {
            value,
            reshape_to: None,
            view: Some(view),
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
            location: self.capture_location.clone(),
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

    fn write_pending(&mut self, storage: StorageId, out: NodeOutput) {
        let entry = self.storages.get_mut(&storage).expect("checked storage");
        entry.padding = None;
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

    /// How the host can read view `t` out of its storage's whole value instead of a device
    /// copy (a program per view shape): when the storage holds at most `limit_bytes`, or
    /// little more than the view, in `t`'s dtype. A view of a padded storage is read through
    /// the padded value, so reading a padded result compiles nothing either.
    pub fn host_gather(
        &mut self,
        t: &TensorRef,
        limit_bytes: u64,
    ) -> Result<Option<HostGather>, EngineError> {
        let view_bytes = t.numel().max(0) as u64 * t.dtype.size_bytes() as u64;
        let storage = self.storage(t.storage)?;
        if storage.native != Some(t.dtype)
            || (storage.nbytes > limit_bytes && storage.nbytes > 4 * view_bytes)
            || t.sizes.len() != t.strides.len()
            || t.strides.iter().any(|&s| s < 0)
        {
            return Ok(None);
        }
        let layout = match storage.padding.clone() {
            Some(padding) => {
                let Some(view) = padding.translate(&t.sizes, &t.strides, t.offset) else {
                    return Ok(None);
                };
                // The true sizes, at the padded value's strides. A padded dimension that merges
                // the extent with dimensions outside it holds runs of the bucket: it is read
                // as two, the runs and the true elements of each, in the same order.
                let len = padding.true_len();
                let mut sizes = Shape::new();
                let mut strides: SmallVec<[i64; 6]> = SmallVec::new();
                for (d, (&size, &stride)) in t.sizes.iter().zip(&view.strides).enumerate() {
                    let runs = size / len;
                    if view.dims.contains(&d) && runs > 1 {
                        sizes.extend([runs, len]);
                        strides.extend([stride * padding.bucket, stride]);
                    } else {
                        sizes.push(size);
                        strides.push(stride);
                    }
                }
                HostGather {
                    sizes,
                    strides,
                    offset: view.offset,
                }
            }
            None => {
                if self.placement(&"reading a pjrt tensor", t)?.whole {
                    // The plain read moves the whole buffer as it is.
                    return Ok(None);
                }
                HostGather {
                    sizes: t.sizes.clone(),
                    strides: t.strides.iter().copied().collect(),
                    offset: t.offset,
                }
            }
        };
        Ok(Some(layout))
    }

    /// Where the bytes of storage `id`'s whole value (padded, when it is) come from; `None`
    /// means a flush is needed first.
    pub fn storage_source(&self, id: StorageId) -> Result<Option<ReadSource<V>>, EngineError> {
        Ok(match &self.storage(id)?.value {
            StorageValue::Uninit => Some(ReadSource::Zeros),
            StorageValue::Device { value, ty } => {
                Some(ReadSource::Device(value.clone(), ty.clone()))
            }
            StorageValue::Pending { .. } => None,
        })
    }

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
        self.write_device_as(t, value, None)
    }

    /// Writes `value`, the padded value of whole tensor `t` that `padding` describes (an
    /// upload padded along a dimension whose length changes: `upload_padding`).
    pub fn write_device_padded(
        &mut self,
        t: &TensorRef,
        value: V,
        padding: crate::bucket::Padding,
    ) -> Result<(), EngineError> {
        self.last_extent = Some((padding.true_len(), padding.bucket));
        self.stats.padded_uploads += 1;
        self.write_device_as(t, value, Some(padding))
    }

    fn write_device_as(
        &mut self,
        t: &TensorRef,
        value: V,
        padding: Option<crate::bucket::Padding>,
    ) -> Result<(), EngineError> {
        if !self.placement(&"writing a pjrt tensor", t)?.whole {
            return Err(EngineError::runtime(
                "internal error: a strided tensor was written directly; write through a copy",
            ));
        }
        let ty = match &padding {
            Some(p) => TensorType::new(t.dtype, &p.padded_sizes()),
            None => t.ty(),
        };
        let storage = self.storages.get_mut(&t.storage).unwrap();
        storage.padding = padding.map(Arc::new);
        let old = std::mem::replace(&mut storage.value, StorageValue::Device { value, ty });
        storage.version += 1;
        if let StorageValue::Pending { out, .. } = old {
            self.drop_holder(out, t.storage);
        }
        self.overwritten.remove(&t.storage);
        self.shared_values.remove(&t.storage);
        Ok(())
    }

    /// The storages read as zeros (never written before) since the last call, at most 1024.
    pub fn take_zero_filled(&mut self) -> Vec<StorageId> {
        std::mem::take(&mut self.zero_filled)
    }

    /// The storages whose values the pending ops read (each as it was when read), with those
    /// values and their types: what the next region's arguments are made of.
    pub fn read_storages(&self) -> Vec<(StorageId, V, TensorType)> {
        self.external_of
            .iter()
            .filter_map(|(&(storage, _), e)| {
                let read = self.externals.get(e)?;
                Some((storage, read.value.clone(), read.ty.clone()))
            })
            .collect()
    }

    /// Whether storage `id` can take a whole value of type `ty` ([`Graph::install_value`]):
    /// it exists, is not padded, and its bytes and element type fit `ty`.
    pub fn can_install(&self, id: StorageId, ty: &TensorType) -> bool {
        self.storages.get(&id).is_some_and(|st| {
            st.padding.is_none()
                && st.nbytes >= ty.nbytes()
                && st.native.is_none_or(|native| native == ty.dtype)
        })
    }

    /// Gives storage `id` a whole new device value of type `ty`, as a region's output would:
    /// a replayed compiled-mode program installs its results this way. Check with
    /// [`Graph::can_install`] first.
    pub fn install_value(
        &mut self,
        id: StorageId,
        value: V,
        ty: TensorType,
    ) -> Result<(), EngineError> {
        if !self.can_install(id, &ty) {
            return Err(EngineError::runtime(format!(
                "internal error: storage {} cannot hold a value of {ty:?}",
                id.0
            )));
        }
        let storage = self.storages.get_mut(&id).unwrap();
        storage.native.get_or_insert(ty.dtype);
        let old = std::mem::replace(&mut storage.value, StorageValue::Device { value, ty });
        storage.version += 1;
        if let StorageValue::Pending { out, .. } = old {
            self.drop_holder(out, id);
        }
        self.overwritten.remove(&id);
        self.shared_values.remove(&id);
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

/// c10's `canCast`: no complex into a real type, no floating point into an integral type, and
/// nothing but bool into bool.
fn can_cast(from: DType, to: DType) -> bool {
    if from.is_complex() && !to.is_complex() {
        return false;
    }
    if from.is_float() && !(to.is_float() || to.is_complex()) {
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

/// PyTorch's rule for the destinations of its same-dtype ops ([`ops::OpFacts::out_dtype_exact`]):
/// an `out=` (or in-place) tensor of another dtype is refused rather than cast into.
pub(crate) fn check_out_dtypes(
    op: OpId,
    outs: &[TensorRef],
    meta: &ops::Meta,
) -> Result<(), EngineError> {
    if !op.facts().out_dtype_exact {
        return Ok(());
    }
    for (out, produced) in outs.iter().zip(&meta.outputs) {
        if out.dtype != produced.dtype {
            return Err(EngineError::runtime(format!(
                "{}: Found dtype {} but expected {}",
                op.name(),
                out.dtype.scalar_type_name(),
                produced.dtype.scalar_type_name()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
