//! Builds the StableHLO module of a region: arguments (the region's external values, then one
//! packed buffer per scalar dtype), every op lowered through `ops`, and the live outputs.

use crate::remat::RematPlan;
use crate::scalars::{ScalarPack, ScalarSlot};
use crate::view_lowering::{lower_read, lower_write};
use ops::{DType, Emitter, Meta, OpError, OpId, Shape, TensorType, Value};
use smallvec::SmallVec;
use std::sync::Arc;

/// Where an op input comes from inside a region.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Operand {
    /// The region's `n`th external argument.
    Arg(u32),
    /// Output `output` of the region's `node`th op.
    Node { node: u32, output: u32 },
}

/// A strided read of a storage's value: the flat base (of `base_dtype`) through a view chain.
#[derive(Clone, Debug, PartialEq)]
pub struct InputView {
    pub chain: views::Chain,
    pub view_dtype: DType,
    pub base_dtype: DType,
    /// When set, the chain reads a window of this many base elements starting at a runtime
    /// offset (a lifted i64 scalar: `InputRef::offset`), so views that differ only in their
    /// storage offset — the batches of a training loop — share one program.
    pub window: Option<i64>,
}

/// An op input: its source, then either a reshape (a contiguous read with another shape of the
/// same element count: storages hold values in the shape their producer gave them) or a view.
#[derive(Clone, Debug, PartialEq)]
pub struct InputRef {
    pub operand: Operand,
    pub reshape_to: Option<Shape>,
    pub view: Option<Arc<InputView>>,
    /// The lifted storage offset of a windowed view.
    pub offset: Option<crate::ScalarSlot>,
}

impl InputRef {
    pub fn plain(operand: Operand) -> Self {
        InputRef {
            operand,
            reshape_to: None,
            view: None,
            offset: None,
        }
    }
}

/// A write through a view: inputs are the old flat base and the update (the view's shape);
/// the output is the new flat base.
#[derive(Clone, Debug, PartialEq)]
pub struct WriteView {
    pub program: views::WriteProgram,
    pub view_dtype: DType,
    pub base_dtype: DType,
    pub base_len: i64,
    /// When set, the program writes into a window of this many elements at a runtime offset
    /// (the node's one lifted i64 scalar), then the window goes back into the base.
    pub window: Option<i64>,
}

/// What a region node computes.
#[derive(Clone, Debug, PartialEq)]
pub enum RegionOp {
    Aten(OpId),
    WriteView(Arc<WriteView>),
    /// An op on operands padded to a bucket along one growing extent (`ops::padding`); its
    /// last scalar is the extent's true length.
    Padded(Arc<PaddedOp>),
    /// `cat([a, b], dim)` along a padded extent; its one scalar is `a`'s true length.
    Append(Arc<AppendOp>),
}

/// An op run at its operands' padded sizes, by its plan.
#[derive(Clone, Debug, PartialEq)]
pub struct PaddedOp {
    pub op: OpId,
    pub plan: ops::padding::PaddedPlan,
}

/// An append along a padded extent into a buffer of `out_bucket` elements along `dim`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendOp {
    pub dim: usize,
    pub out_bucket: i64,
}

impl RegionOp {
    pub fn name(&self) -> &'static str {
        match self {
            RegionOp::Aten(op) => op.name(),
            RegionOp::WriteView(_) => "write_through_view",
            RegionOp::Padded(p) => p.op.name(),
            RegionOp::Append(_) => "cat",
        }
    }
}

/// One op of a region.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionNode {
    pub op: RegionOp,
    pub params: SmallVec<[i64; 4]>,
    pub inputs: SmallVec<[InputRef; 3]>,
    pub scalars: SmallVec<[ScalarSlot; 2]>,
    pub meta: Meta,
}

/// A region ready to be emitted: what a materialization runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Region {
    pub args: Vec<TensorType>,
    pub nodes: Vec<RegionNode>,
    pub outputs: Vec<Operand>,
    /// One packed scalar buffer per dtype, passed after `args`.
    pub scalar_packs: Vec<(ops::DType, u32)>,
    /// (index into `args`, index into `outputs`): the argument's buffer becomes the output's
    /// (nothing else refers to the argument once the region runs; same type).
    pub aliases: Vec<(u32, u32)>,
}

impl Region {
    /// The packs' dtypes and counts, in argument order.
    pub fn set_scalar_packs(&mut self, packs: &[ScalarPack]) {
        self.scalar_packs = packs.iter().map(|p| (p.dtype, p.count)).collect();
    }

    /// A short description for errors and dumps: "add" or "region of 12 ops: add, mul, ...".
    pub fn label(&self) -> String {
        match self.nodes.len() {
            0 => "empty region".to_string(),
            1 => self.nodes[0].op.name().to_string(),
            n => {
                let mut names: Vec<&str> = self.nodes.iter().take(6).map(|n| n.op.name()).collect();
                if n > 6 {
                    names.push("...");
                }
                format!("region of {n} ops: {}", names.join(", "))
            }
        }
    }
}

/// The order a region's ops are emitted in, and what each write into a donated buffer waits
/// for, so that XLA can update donated buffers in place.
///
/// An argument donated to an output (`Region::aliases`) is written where it lies. XLA keeps that
/// write in place only if its data dependencies prove that every other read of the argument
/// happens first; otherwise it copies the whole argument at the start. A read it cannot order
/// is one whose result only reaches outputs the write does not depend on: the loss reads the
/// last layer's bias, the backward pass of an SGD step reads a weight the update then writes.
/// So the outputs that read donated arguments and depend on no write ("settled" outputs) are
/// computed first, and each write reads its argument through a data dependency on the settled
/// outputs it does not already depend on (`after`: an `or` with a zero XLA cannot fold;
/// `optimization_barrier` would not do, XLA CPU drops it before ordering anything). The
/// producers of settled outputs are emitted first, the other ops after them, each group in
/// capture order (the first group holds all its members' producers).
#[derive(Debug, Default, PartialEq)]
struct WriteOrder {
    /// Node indices in emission order.
    emission: Vec<u32>,
    /// Position in `emission` of the first op after the settled outputs; past the end: none.
    writes_from: usize,
    /// Each donated argument read after `writes_from`, with the settled outputs its reads
    /// there wait for (never empty).
    waits: Vec<(u32, Vec<Operand>)>,
}

impl WriteOrder {
    fn plan(region: &Region) -> WriteOrder {
        let n = region.nodes.len();
        let in_order = WriteOrder {
            emission: (0..n as u32).collect(),
            writes_from: usize::MAX,
            ..WriteOrder::default()
        };
        let node_of = |o: Operand| match o {
            Operand::Node { node, .. } => Some(node as usize),
            Operand::Arg(_) => None,
        };
        let inputs_of = |i: usize| {
            region.nodes[i]
                .inputs
                .iter()
                .filter_map(|r| node_of(r.operand))
        };
        // The node that writes each donated argument, and whether each node is such a write.
        let mut write_of: Vec<Option<usize>> = vec![None; region.args.len()];
        let mut is_write = vec![false; n];
        for &(arg, output) in &region.aliases {
            if let Some(node) = region
                .outputs
                .get(output as usize)
                .and_then(|&o| node_of(o))
            {
                write_of[arg as usize] = Some(node);
                is_write[node] = true;
            }
        }
        if write_of.iter().all(Option::is_none) {
            return in_order;
        }
        let donated = |a: u32| write_of[a as usize].is_some();
        // Forward: which nodes depend on a write, and which on a read of a donated argument.
        let mut after_write = vec![false; n];
        let mut after_read = vec![false; n];
        for (i, node) in region.nodes.iter().enumerate() {
            let mut w = is_write[i];
            let mut r = node
                .inputs
                .iter()
                .any(|input| matches!(input.operand, Operand::Arg(a) if donated(a)));
            for j in inputs_of(i) {
                w |= after_write[j];
                r |= after_read[j];
            }
            after_write[i] = w;
            after_read[i] = r;
        }
        let aliased_outputs: Vec<u32> = region.aliases.iter().map(|&(_, o)| o).collect();
        let mut settled: Vec<Operand> = Vec::new();
        for (index, &o) in region.outputs.iter().enumerate() {
            let Some(node) = node_of(o) else { continue };
            if !after_write[node]
                && after_read[node]
                && !aliased_outputs.contains(&(index as u32))
                && !settled.contains(&o)
            {
                settled.push(o);
            }
        }
        if settled.is_empty() {
            return in_order;
        }
        // Backward: every producer of a settled output goes first.
        let mut before = vec![false; n];
        for &o in &settled {
            before[node_of(o).unwrap()] = true;
        }
        for i in (0..n).rev() {
            if before[i] {
                for j in inputs_of(i) {
                    before[j] = true;
                }
            }
        }
        let mut waits: Vec<(u32, Vec<Operand>)> = Vec::new();
        for (a, write) in write_of.iter().enumerate() {
            let Some(write) = *write else { continue };
            let read_after = region.nodes.iter().enumerate().any(|(i, node)| {
                !before[i]
                    && node
                        .inputs
                        .iter()
                        .any(|input| input.operand == Operand::Arg(a as u32))
            });
            if !read_after {
                continue;
            }
            // The nodes whose XLA fusion may read `a`: its readers, and the consumers a
            // pointwise reader may be duplicated into (not a product taking it as a matrix
            // operand: a dot's operands are computed before it).
            let mut may_read = vec![false; n];
            for (i, node) in region.nodes.iter().enumerate() {
                may_read[i] =
                    node.inputs
                        .iter()
                        .enumerate()
                        .any(|(k, input)| match input.operand {
                            Operand::Arg(x) => x == a as u32,
                            Operand::Node { node: j, .. } => {
                                may_read[j as usize]
                                    && matches!(region.nodes[j as usize].op,
                                    RegionOp::Aten(op) if op.is_pointwise())
                                    && !is_product_operand(&node.op, k)
                            }
                        });
            }
            // Those the write does not depend on, and what depends on them.
            let mut feeds_write = vec![false; n];
            feeds_write[write] = true;
            for i in (0..=write).rev() {
                if feeds_write[i] {
                    for j in inputs_of(i) {
                        feeds_write[j] = true;
                    }
                }
            }
            let mut unordered_read = vec![false; n];
            for i in 0..n {
                unordered_read[i] =
                    (may_read[i] && !feeds_write[i]) || inputs_of(i).any(|j| unordered_read[j]);
            }
            let unordered: Vec<Operand> = settled
                .iter()
                .copied()
                .filter(|&o| unordered_read[node_of(o).unwrap()])
                .collect();
            if !unordered.is_empty() {
                waits.push((a as u32, unordered));
            }
        }
        if waits.is_empty() {
            return in_order;
        }
        let mut emission: Vec<u32> = (0..n as u32).filter(|&i| before[i as usize]).collect();
        let writes_from = emission.len();
        emission.extend((0..n as u32).filter(|&i| !before[i as usize]));
        WriteOrder {
            emission,
            writes_from,
            waits,
        }
    }
}

/// Whether input `k` of `op` is a matrix operand of a product ([`ops::OpFacts`]).
fn is_product_operand(op: &RegionOp, k: usize) -> bool {
    matches!(op, RegionOp::Aten(op) if op.is_product_operand(k))
}

/// An `i32` zero that XLA cannot fold away, computed from `v`'s first element: a data
/// dependency on `v` that changes no value. (`optimization_barrier` does not order anything: XLA
/// CPU drops it before scheduling.) `None` for an empty `v`.
fn runtime_zero(e: &mut Emitter, v: Value) -> Option<Value> {
    let numel = e.ty(v).numel();
    if numel == 0 {
        return None;
    }
    let flat = e.reshape(v, &[numel]);
    let first = e.slice(flat, &[0], &[1], &[1]);
    let first = e.reshape(first, &[]);
    let first = e.real(first);
    let bits = match e.dtype(first) {
        DType::F32 => bitcast(e, first, DType::I32),
        DType::F64 => bitcast(e, first, DType::I64),
        DType::F16 | DType::BF16 => bitcast(e, first, DType::I16),
        _ => first,
    };
    let bits = e.convert(bits, DType::I32);
    // Two logical shifts by 16 clear all 32 bits.
    let sixteen = e.scalar_constant(DType::I32, ops::ScalarValue::Int(16));
    let half = e.binary("stablehlo.shift_right_logical", bits, sixteen);
    Some(e.binary("stablehlo.shift_right_logical", half, sixteen))
}

/// `v` unchanged, bit for bit, but computed after `zero` (an `i32` zero from `runtime_zero`).
fn after(e: &mut Emitter, v: Value, zero: Value) -> Value {
    let dtype = e.dtype(v);
    if dtype.is_complex() {
        let re = e.real(v);
        let im = e.imag(v);
        let re = after(e, re, zero);
        let im = after(e, im, zero);
        return e.complex(re, im);
    }
    let shape = e.shape(v).to_vec();
    let as_int = match dtype {
        DType::F32 => Some(DType::I32),
        DType::F64 => Some(DType::I64),
        DType::F16 | DType::BF16 => Some(DType::I16),
        _ => None,
    };
    let int = as_int.map_or(v, |int| bitcast(e, v, int));
    let z = e.convert(zero, e.dtype(int));
    let z = e.broadcast_to(z, &shape);
    let tied = e.or(int, z);
    if as_int.is_some() {
        bitcast(e, tied, dtype)
    } else {
        tied
    }
}

fn bitcast(e: &mut Emitter, v: Value, to: DType) -> Value {
    let ty = e.ty(v).with_dtype(to);
    e.op("stablehlo.bitcast_convert", &[v], "", ty)
}

/// `len` elements of the flat `base` from the runtime `offset` (always in bounds: the view was
/// checked against the storage at capture).
fn dynamic_window(e: &mut Emitter, base: Value, offset: Value, len: i64) -> Value {
    let n = e.ty(base).numel();
    let flat = e.reshape(base, &[n]);
    let ty = e.ty(flat).with_shape(&[len]);
    e.op(
        "stablehlo.dynamic_slice",
        &[flat, offset],
        &format!("slice_sizes = array<i64: {len}>"),
        ty,
    )
}

/// One packed scalar, as a 0-d value.
fn read_scalar(
    e: &mut Emitter,
    packs: &[(DType, Value)],
    slot: &crate::ScalarSlot,
) -> Result<Value, OpError> {
    let pack = packs
        .iter()
        .find(|(d, _)| *d == slot.dtype)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            OpError::runtime(format!(
                "internal error: no packed scalar buffer of dtype {}",
                slot.dtype.name()
            ))
        })?;
    let i = slot.index as i64;
    let one = e.slice(pack, &[i], &[i + 1], &[1]);
    Ok(e.reshape(one, &[]))
}

/// The shape a pointwise node can compute in without reshaping its operands: the one shape all
/// its tensor operands have (the reshapes it reads them through all start from it), when that
/// is not its own. A product's `[rows, n]` result read as `[batch, seq, n]` is the usual case.
/// Computed in the operands' shape, XLA can write the result into an operand's buffer; across
/// a reshape it allocates another (GELU's gradient: a second activation-sized buffer at the
/// start of each block's backward pass).
fn unreshaped_shape(e: &Emitter, node: &RegionNode, operands: &[Value]) -> Option<Shape> {
    let RegionOp::Aten(op) = node.op else {
        return None;
    };
    let layout_op = matches!(
        op,
        OpId::Expand
            | OpId::Reshape
            | OpId::Permute
            | OpId::Transpose
            | OpId::Slice
            | OpId::Select
            | OpId::MaskedFill
    );
    if !op.is_pointwise() || layout_op || node.inputs.len() != operands.len() {
        return None;
    }
    let out = node.meta.outputs.first()?;
    if node.meta.outputs.iter().any(|t| t.shape != out.shape) {
        return None;
    }
    let mut shape: Option<Shape> = None;
    let mut reshaped = false;
    for (input, &v) in node.inputs.iter().zip(operands) {
        if input.view.is_some() || input.offset.is_some() {
            return None;
        }
        let s = e.shape(v);
        let read_as = input.reshape_to.as_ref().map_or(s, |r| r.as_slice());
        if s.is_empty() && read_as.is_empty() {
            continue; // a 0-d tensor broadcasts in either shape
        }
        if read_as != out.shape.as_slice() {
            return None;
        }
        reshaped |= s != read_as;
        match &shape {
            Some(known) if known.as_slice() != s => return None,
            Some(_) => {}
            None => shape = Some(Shape::from_slice(s)),
        }
    }
    shape.filter(|s| reshaped && s.as_slice() != out.shape.as_slice())
}

/// `op` of `node` lowered on `inputs` of `shape` (see `unreshaped_shape`), its results
/// reshaped to the node's own shape.
fn lower_in_shape(
    e: &mut Emitter,
    op: OpId,
    node: &RegionNode,
    inputs: &[Value],
    scalars: &[Value],
    shape: &Shape,
) -> Result<SmallVec<[Value; 1]>, OpError> {
    let mut meta = node.meta.clone();
    for t in &mut meta.outputs {
        *t = t.with_shape(shape);
    }
    let results = ops::lower(op, e, inputs, scalars, &node.params, &meta)?;
    Ok(results
        .into_iter()
        .zip(&node.meta.outputs)
        .map(|(r, t)| e.reshape(r, &t.shape))
        .collect())
}

/// Emits one node from the values of its operands (each read through its view or reshape);
/// with `tie`, the first input is read after that runtime zero (see `after`).
fn emit_node(
    e: &mut Emitter,
    node: &RegionNode,
    operands: &[Value],
    packs: &[(DType, Value)],
    tie: Option<Value>,
) -> Result<SmallVec<[Value; 1]>, OpError> {
    let unreshaped = unreshaped_shape(e, node, operands);
    let mut inputs: SmallVec<[Value; 3]> = SmallVec::new();
    for (input, &operand) in node.inputs.iter().zip(operands) {
        let mut v = operand;
        if unreshaped.is_some() {
            // Every operand is read in the shape it has.
        } else if let Some(view) = &input.view {
            if let (Some(len), Some(slot)) = (view.window, &input.offset) {
                let offset = read_scalar(e, packs, slot)?;
                v = dynamic_window(e, v, offset, len);
            }
            v = lower_read(e, v, &view.chain, view.view_dtype, view.base_dtype);
        } else if let Some(shape) = &input.reshape_to {
            if e.shape(v) != shape.as_slice() {
                v = e.reshape(v, shape);
            }
        }
        inputs.push(v);
    }
    if let (Some(zero), Some(first)) = (tie, inputs.first_mut()) {
        *first = after(e, *first, zero);
    }
    let mut scalars: SmallVec<[Value; 2]> = SmallVec::new();
    for slot in &node.scalars {
        scalars.push(read_scalar(e, packs, slot)?);
    }
    Ok(match &node.op {
        RegionOp::Aten(op) => match &unreshaped {
            Some(shape) => lower_in_shape(e, *op, node, &inputs, &scalars, shape)?,
            None => ops::lower(*op, e, &inputs, &scalars, &node.params, &node.meta)?
                .into_iter()
                .collect(),
        },
        RegionOp::WriteView(w) => {
            if inputs.len() != 2 {
                return Err(OpError::runtime(format!(
                    "internal error: a write through a view takes 2 inputs, got {}",
                    inputs.len()
                )));
            }
            let base = e.reshape(inputs[0], &[w.base_len]);
            let flat = match (w.window, scalars.first()) {
                (Some(len), Some(&offset)) => {
                    let window = dynamic_window(e, base, offset, len);
                    let written =
                        lower_write(e, window, inputs[1], &w.program, w.view_dtype, w.base_dtype);
                    let written = e.reshape(written, &[len]);
                    crate::view_lowering::blend_update_slice(e, base, written, &[offset])
                }
                _ => {
                    let new_base =
                        lower_write(e, base, inputs[1], &w.program, w.view_dtype, w.base_dtype);
                    e.reshape(new_base, &[w.base_len])
                }
            };
            SmallVec::from_elem(flat, 1)
        }
        RegionOp::Padded(p) => {
            let (&len, op_scalars) = scalars.split_last().ok_or_else(|| {
                OpError::runtime("internal error: a padded op has no length scalar")
            })?;
            ops::padding::lower_padded(p.op, e, &inputs, len, op_scalars, &node.params, &p.plan)?
                .into_iter()
                .collect()
        }
        RegionOp::Append(a) => {
            let out = match (inputs.as_slice(), scalars.as_slice()) {
                // A sequence's first entry: its value padded to the bucket.
                ([first], [_]) => ops::padding::pad_to_bucket(e, *first, a.dim, a.out_bucket),
                ([a_value, b], [a_len]) => {
                    ops::padding::lower_append(e, *a_value, *b, a.dim, *a_len, a.out_bucket)
                }
                _ => {
                    return Err(OpError::runtime(
                        "internal error: an append takes 1 or 2 inputs and a length",
                    ))
                }
            };
            SmallVec::from_elem(out, 1)
        }
    })
}

/// The value of `operand`: an argument, or an output of a node emitted already.
fn resolve(
    results: &[SmallVec<[Value; 1]>],
    args: &[Value],
    operand: Operand,
) -> Result<Value, OpError> {
    match operand {
        Operand::Arg(i) => args.get(i as usize).copied(),
        Operand::Node { node, output } => results
            .get(node as usize)
            .and_then(|outs| outs.get(output as usize))
            .copied(),
    }
    .ok_or_else(|| {
        OpError::runtime(format!(
            "internal error: region operand {operand:?} refers to nothing (region has {} args, \
             {} ops)",
            args.len(),
            results.len()
        ))
    })
}

/// Emits node `j` again for its late reader `reader` at emission `position` (see
/// `RematPlan`). The copy is computed after a value the reader waits for anyway (its other
/// operand, else the op emitted before it), so XLA neither merges it with the original nor
/// computes it early.
#[allow(clippy::too_many_arguments)]
fn emit_copy(
    e: &mut Emitter,
    region: &Region,
    emitted: &[u32],
    results: &[SmallVec<[Value; 1]>],
    args: &[Value],
    packs: &[(DType, Value)],
    reader: &RegionNode,
    j: u32,
    reads_copy: impl Fn(u32) -> bool,
) -> Result<SmallVec<[Value; 1]>, OpError> {
    let other = reader.inputs.iter().find_map(|other| match other.operand {
        Operand::Node { node: k, .. } if k != j && !reads_copy(k) => Some(other.operand),
        _ => None,
    });
    let tie = match other {
        Some(o) => Some(resolve(results, args, o)?),
        None => emitted
            .iter()
            .rev()
            .find_map(|&p| results[p as usize].first().copied()),
    };
    let zero = tie.and_then(|t| runtime_zero(e, t));
    let source = &region.nodes[j as usize];
    let mut operands: SmallVec<[Value; 3]> = SmallVec::new();
    for input in &source.inputs {
        operands.push(resolve(results, args, input.operand)?);
    }
    emit_node(e, source, &operands, packs, zero)
}

/// Emits the region as one `func.func public @main` module.
pub fn build_module(region: &Region) -> Result<String, OpError> {
    let mut e = Emitter::new();
    let args: Vec<Value> = region
        .args
        .iter()
        .enumerate()
        .map(
            |(i, t)| match region.aliases.iter().find(|&&(arg, _)| arg == i as u32) {
                Some(&(_, output)) => e.argument_with_attrs(
                    t.clone(),
                    &format!("tf.aliasing_output = {output} : i32"),
                ),
                None => e.argument(t.clone()),
            },
        )
        .collect();
    let packs: Vec<(ops::DType, Value)> = region
        .scalar_packs
        .iter()
        .map(|&(dtype, count)| (dtype, e.argument(TensorType::new(dtype, &[count as i64]))))
        .collect();
    let order = WriteOrder::plan(region);
    let mut results: Vec<SmallVec<[Value; 1]>> = vec![SmallVec::new(); region.nodes.len()];
    let mut resolved_args = args.clone();
    let remat = RematPlan::plan(region, &order.emission);
    let mut copies: Vec<Option<SmallVec<[Value; 1]>>> = vec![None; region.nodes.len()];
    for (position, &index) in order.emission.iter().enumerate() {
        if position == order.writes_from {
            // Each write into a donated buffer waits for the settled outputs it does not
            // already depend on (see `WriteOrder`); one zero per distinct set.
            let mut zeros: Vec<(&[Operand], Option<Value>)> = Vec::new();
            for (a, outputs) in order.waits.iter() {
                let zero = match zeros.iter().find(|(set, _)| *set == outputs.as_slice()) {
                    Some(&(_, zero)) => zero,
                    None => {
                        let mut zero: Option<Value> = None;
                        for &o in outputs {
                            let v = resolve(&results, &args, o)?;
                            if let Some(z) = runtime_zero(&mut e, v) {
                                zero = Some(match zero {
                                    Some(acc) => e.or(acc, z),
                                    None => z,
                                });
                            }
                        }
                        zeros.push((outputs, zero));
                        zero
                    }
                };
                if let Some(zero) = zero {
                    resolved_args[*a as usize] = after(&mut e, args[*a as usize], zero);
                }
            }
        }
        let node = &region.nodes[index as usize];
        // Nodes emitted after the barrier read donated arguments through it.
        let node_args: &[Value] = if position >= order.writes_from {
            &resolved_args
        } else {
            &args
        };
        let mut operands: SmallVec<[Value; 3]> = SmallVec::new();
        for input in &node.inputs {
            let v = match input.operand {
                Operand::Node { node: j, output } if remat.reads_copy(j, position) => {
                    if copies[j as usize].is_none() {
                        copies[j as usize] = Some(emit_copy(
                            &mut e,
                            region,
                            &order.emission[..position],
                            &results,
                            node_args,
                            &packs,
                            node,
                            j,
                            |k| remat.reads_copy(k, position),
                        )?);
                    }
                    copies[j as usize]
                        .as_ref()
                        .and_then(|outs| outs.get(output as usize))
                        .copied()
                        .ok_or_else(|| {
                            OpError::runtime(format!(
                                "internal error: recomputed node {j} has no output {output}"
                            ))
                        })?
                }
                operand => resolve(&results, node_args, operand)?,
            };
            operands.push(v);
        }
        results[index as usize] = emit_node(&mut e, node, &operands, &packs, None)?;
    }
    let outputs: Vec<Value> = region
        .outputs
        .iter()
        .map(|&o| resolve(&results, &args, o))
        .collect::<Result<_, _>>()?;
    Ok(e.finish(&outputs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ops::TensorType;
    use smallvec::smallvec;

    fn f32s(shape: &[i64]) -> TensorType {
        TensorType::new(DType::F32, shape)
    }

    fn node(op: OpId, inputs: Vec<InputRef>, input_types: &[TensorType]) -> RegionNode {
        RegionNode {
            op: RegionOp::Aten(op),
            params: smallvec![],
            inputs: inputs.into_iter().collect(),
            scalars: smallvec![],
            meta: ops::meta(op, input_types, &[], &[]).unwrap(),
        }
    }

    fn read_as(operand: Operand, shape: &[i64]) -> InputRef {
        InputRef {
            reshape_to: Some(Shape::from_slice(shape)),
            ..InputRef::plain(operand)
        }
    }

    /// The line of `module` that applies `op`.
    fn line_of<'m>(module: &'m str, op: &str) -> &'m str {
        module.lines().find(|l| l.contains(op)).unwrap()
    }

    /// A `[32, 64]` product, then `op` on it (and on `other`) read as `[4, 8, 64]`.
    fn product_then(op: OpId, other: Option<InputRef>) -> Region {
        let batched = f32s(&[4, 8, 64]);
        let product = Operand::Node { node: 0, output: 0 };
        let mut inputs = vec![read_as(product, &[4, 8, 64])];
        inputs.extend(other);
        let types = vec![batched.clone(); inputs.len()];
        Region {
            args: vec![f32s(&[32, 16]), f32s(&[16, 64]), f32s(&[4, 8, 64])],
            nodes: vec![
                node(
                    OpId::Mm,
                    vec![
                        InputRef::plain(Operand::Arg(0)),
                        InputRef::plain(Operand::Arg(1)),
                    ],
                    &[f32s(&[32, 16]), f32s(&[16, 64])],
                ),
                node(op, inputs, &types),
            ],
            outputs: vec![Operand::Node { node: 1, output: 0 }],
            ..Region::default()
        }
    }

    #[test]
    fn a_pointwise_op_on_a_reshaped_product_computes_in_the_products_shape() {
        let module = build_module(&product_then(OpId::Tanh, None)).unwrap();
        let tanh_line = line_of(&module, "stablehlo.tanh");
        assert!(
            tanh_line.contains("(tensor<32x64xf32>) -> tensor<32x64xf32>"),
            "{module}"
        );
        // Two operands reshaped from the same shape: still computed in it.
        let product = Operand::Node { node: 0, output: 0 };
        let both = product_then(OpId::Mul, Some(read_as(product, &[4, 8, 64])));
        let module = build_module(&both).unwrap();
        let mul_line = line_of(&module, "stablehlo.multiply");
        assert!(mul_line.contains("tensor<32x64xf32>"), "{mul_line}");
    }

    #[test]
    fn operands_of_other_shapes_keep_the_op_in_its_own_shape() {
        // The second operand is an argument already `[4, 8, 64]`: no common operand shape.
        let mixed = product_then(OpId::Mul, Some(InputRef::plain(Operand::Arg(2))));
        let module = build_module(&mixed).unwrap();
        let mul_line = line_of(&module, "stablehlo.multiply");
        assert!(mul_line.contains("tensor<4x8x64xf32>"), "{mul_line}");
        // A product is not pointwise: it reads its reshaped operands as they are read.
        assert!(unreshaped_shape(&Emitter::new(), &mixed.nodes[0], &[]).is_none());
    }
}
