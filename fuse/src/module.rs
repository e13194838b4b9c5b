//! Builds the StableHLO module of a region: arguments (the region's external values, then one
//! packed buffer per scalar dtype), every op lowered through `ops`, and the live outputs.

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
}

impl RegionOp {
    pub fn name(&self) -> &'static str {
        match self {
            RegionOp::Aten(op) => op.name(),
            RegionOp::WriteView(_) => "write_through_view",
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
    let mut results: Vec<SmallVec<[Value; 1]>> = Vec::with_capacity(region.nodes.len());
    let resolve =
        |results: &Vec<SmallVec<[Value; 1]>>, operand: Operand| -> Result<Value, OpError> {
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
                 {} ops emitted so far)",
                args.len(),
                results.len()
            ))
            })
        };
    let scalar = |e: &mut Emitter, slot: &crate::ScalarSlot| -> Result<Value, OpError> {
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
    };
    for node in &region.nodes {
        let mut inputs: SmallVec<[Value; 3]> = SmallVec::new();
        for input in &node.inputs {
            let mut v = resolve(&results, input.operand)?;
            if let Some(view) = &input.view {
                if let (Some(len), Some(slot)) = (view.window, &input.offset) {
                    let offset = scalar(&mut e, slot)?;
                    v = dynamic_window(&mut e, v, offset, len);
                }
                v = lower_read(&mut e, v, &view.chain, view.view_dtype, view.base_dtype);
            } else if let Some(shape) = &input.reshape_to {
                if e.shape(v) != shape.as_slice() {
                    v = e.reshape(v, shape);
                }
            }
            inputs.push(v);
        }
        let mut scalars: SmallVec<[Value; 2]> = SmallVec::new();
        for slot in &node.scalars {
            scalars.push(scalar(&mut e, slot)?);
        }
        let outs: SmallVec<[Value; 1]> = match &node.op {
            RegionOp::Aten(op) => {
                ops::lower(*op, &mut e, &inputs, &scalars, &node.params, &node.meta)?
                    .into_iter()
                    .collect()
            }
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
                        let window = dynamic_window(&mut e, base, offset, len);
                        let written = lower_write(
                            &mut e,
                            window,
                            inputs[1],
                            &w.program,
                            w.view_dtype,
                            w.base_dtype,
                        );
                        let written = e.reshape(written, &[len]);
                        crate::view_lowering::blend_update_slice(&mut e, base, written, &[offset])
                    }
                    _ => {
                        let new_base = lower_write(
                            &mut e,
                            base,
                            inputs[1],
                            &w.program,
                            w.view_dtype,
                            w.base_dtype,
                        );
                        e.reshape(new_base, &[w.base_len])
                    }
                };
                SmallVec::from_elem(flat, 1)
            }
        };
        results.push(outs);
    }
    let outputs: Vec<Value> = region
        .outputs
        .iter()
        .map(|&o| resolve(&results, o))
        .collect::<Result<_, _>>()?;
    Ok(e.finish(&outputs))
}
