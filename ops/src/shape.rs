//! Shape and indexing ops: cat, stack, flip, roll, pad, repeat, tril/triu, gather, scatter,
//! index_select, embedding, expand, sum_to_size and the primitive view ops.

use crate::dtype::{DType, Shape, TensorType};
use crate::emitter::{bracket_list, i64_array, Cmp, Emitter, Value};
use crate::error::{ensure, OpError};
use crate::param_layout as layout;
use crate::params::{wrap_dim, wrap_dims, Params};
use crate::promote::{result_type, Operand};
use crate::{single, LowerArgs, Meta, MetaArgs, OpId, OpRule};

fn fmt_shape(s: &[i64]) -> String {
    format!("{s:?}")
}

/// `tensor.expand(to)` is valid (PyTorch's expand message otherwise).
pub(crate) fn check_expand(from: &[i64], to: &[i64]) -> Result<(), OpError> {
    ensure!(
        to.len() >= from.len(),
        "expand: the number of sizes provided ({}) must be greater or equal to the number of dimensions in the tensor ({})",
        to.len(),
        from.len()
    );
    let offset = to.len() - from.len();
    for (i, &d) in from.iter().enumerate() {
        let t = to[i + offset];
        ensure!(
            d == t || d == 1,
            "The expanded size of the tensor ({t}) must match the existing size ({d}) at non-singleton dimension {}.  Target sizes: {}.  Tensor sizes: {}",
            i + offset,
            fmt_shape(to),
            fmt_shape(from)
        );
    }
    Ok(())
}

/// PyTorch checks the index dtype of gather/scatter only when the index has elements.
fn index_dtype_check(op: &str, index: &TensorType) -> Result<(), OpError> {
    ensure!(
        index.numel() == 0 || matches!(index.dtype, DType::I64 | DType::I32),
        "{op}(): Expected dtype int32/int64 for index"
    );
    Ok(())
}

// ---- rules: each op's meta beside its lowering --------------------------------------------

/// `cat`: tensors joined along a dim, promoted together (1-D empty tensors skipped, as
/// PyTorch's legacy rule has it).
pub(crate) struct Cat;

impl OpRule for Cat {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        if i.is_empty() {
            return Err(OpError::value(
                "torch.cat(): expected a non-empty list of Tensors",
            ));
        }
        a.expect_counts(1..=usize::MAX, 0..=0)?;
        for (pos, t) in i.iter().enumerate() {
            ensure!(
                t.rank() > 0,
                "zero-dimensional tensor (at position {pos}) cannot be concatenated"
            );
        }
        let dtype = result_type(&i.iter().map(Operand::Tensor).collect::<Vec<_>>());
        // Legacy: 1-D empty tensors are skipped.
        let kept: Vec<&TensorType> = i
            .iter()
            .filter(|t| !(t.rank() == 1 && t.shape[0] == 0))
            .collect();
        let Some(first) = kept.first() else {
            return single(TensorType::new(dtype, &[0]));
        };
        let dim = wrap_dim(layout::Dim::decode(&a.params)?.dim, first.rank())?;
        let mut shape = first.shape.clone();
        shape[dim] = 0;
        for (n, t) in i.iter().enumerate() {
            if t.rank() == 1 && t.shape[0] == 0 {
                continue;
            }
            ensure!(
                t.rank() == first.rank(),
                "Tensors must have same number of dimensions: got {} and {}",
                first.rank(),
                t.rank()
            );
            for d in 0..t.rank() {
                ensure!(
                        d == dim || t.shape[d] == first.shape[d],
                        "Sizes of tensors must match except in dimension {dim}. Expected size {} but got size {} for tensor number {n} in the list.",
                        first.shape[d],
                        t.shape[d]
                    );
            }
            shape[dim] = shape[dim].checked_add(t.shape[dim]).ok_or_else(|| {
                OpError::runtime(format!(
                    "cat(): the sizes of the tensors in dimension {dim} add up to more than {}; expected a total size that fits in int64",
                    i64::MAX
                ))
            })?;
        }
        single(TensorType { dtype, shape })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let parts: Vec<Value> = a
            .inputs
            .iter()
            .filter(|&&v| !(e.rank(v) == 1 && e.shape(v)[0] == 0))
            .copied()
            .collect::<Vec<_>>()
            .into_iter()
            .map(|v| e.cast(v, out.dtype))
            .collect();
        let v = if parts.is_empty() {
            e.constant(out.clone(), crate::ScalarValue::Int(0))
        } else {
            let dim = wrap_dim(layout::Dim::decode(&a.params)?.dim, out.rank())?;
            e.concatenate(&parts, dim)
        };
        Ok(vec![v])
    }
}

/// `stack`: same-shaped tensors joined along a new dim, promoted together.
pub(crate) struct Stack;

impl OpRule for Stack {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        ensure!(!i.is_empty(), "stack expects a non-empty TensorList");
        for (n, t) in i.iter().enumerate() {
            ensure!(
                    t.shape == i[0].shape,
                    "stack expects each tensor to be equal size, but got {} at entry 0 and {} at entry {n}",
                    fmt_shape(&i[0].shape),
                    fmt_shape(&t.shape)
                );
        }
        let dim = wrap_dim(layout::Dim::decode(&a.params)?.dim, i[0].rank() + 1)?;
        let mut shape = i[0].shape.clone();
        shape.insert(dim, i.len() as i64);
        let dtype = result_type(&i.iter().map(Operand::Tensor).collect::<Vec<_>>());
        single(TensorType { dtype, shape })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let dim = wrap_dim(layout::Dim::decode(&a.params)?.dim, out.rank())?;
        let parts: Vec<Value> = a
            .inputs
            .iter()
            .map(|&v| {
                let c = e.cast(v, out.dtype);
                let mut s = e.shape(c).to_vec();
                s.insert(dim, 1);
                e.reshape(c, &s)
            })
            .collect();
        Ok(vec![e.concatenate(&parts, dim)])
    }
}

/// `flip`: the input reversed along each of a list of dims.
pub(crate) struct Flip;

impl OpRule for Flip {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(1..=1, 0..=0)?;
        wrap_dims(layout::Dims::decode(&a.params)?.dims, i[0].rank())?;
        single(i[0].clone())
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        // No dims flips nothing (wrap_dims reads an empty list as every dim, as reductions do).
        let v = match layout::Dims::decode(&a.params)?.dims {
            [] => a.inputs[0],
            dims => {
                let dims = wrap_dims(dims, out.rank())?;
                e.reverse(a.inputs[0], &dims)
            }
        };
        Ok(vec![v])
    }
}

/// `roll`: the input shifted circularly along dims (or flattened, for no dims).
pub(crate) struct Roll;

impl OpRule for Roll {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(1..=1, 0..=0)?;
        let layout::RollShifts { shifts, dims } = layout::RollShifts::decode(&a.params)?;
        ensure!(!shifts.is_empty(), "`shifts` required");
        ensure!(
            dims.is_empty() || dims.len() == shifts.len(),
            "shifts and dimensions must align. shifts: {}, dims:{}",
            shifts.len(),
            dims.len()
        );
        for &d in dims {
            wrap_dim(d, i[0].rank())?;
        }
        single(i[0].clone())
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let layout::RollShifts { shifts, dims } = layout::RollShifts::decode(&a.params)?;
        Ok(vec![lower_roll(e, a.inputs[0], shifts, dims)])
    }
}

/// `constant_pad_nd`: the trailing dims padded (or cropped, by negative widths) with a value
/// scalar, 0 by default.
pub(crate) struct ConstantPad;

impl OpRule for ConstantPad {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(1..=1, 0..=1)?;
        let shape = padded_shape(&i[0], layout::PadWidths::decode(&a.params)?.pad)?;
        Ok(Meta::single(
            TensorType {
                dtype: i[0].dtype,
                shape,
            },
            vec![i[0].dtype; a.scalars.len()],
        ))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let x = a.inputs[0];
        let rank = out.rank();
        let (mut low, mut high) = (vec![0; rank], vec![0; rank]);
        for (j, pair) in layout::PadWidths::decode(&a.params)?
            .pad
            .chunks(2)
            .enumerate()
        {
            low[rank - 1 - j] = pair[0];
            high[rank - 1 - j] = pair[1];
        }
        let value = match a.scalars.first() {
            Some(&s) => e.cast(s, out.dtype),
            None => e.scalar_constant(out.dtype, crate::ScalarValue::Int(0)),
        };
        Ok(vec![e.pad(x, value, &low, &high, &vec![0; rank])])
    }
}

/// `repeat`: the input tiled by a repeat count per dim (more counts than dims add leading
/// dims).
pub(crate) struct Repeat;

impl OpRule for Repeat {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(1..=1, 0..=0)?;
        let reps = layout::Repeats::decode(&a.params)?.repeats;
        ensure!(
                reps.len() >= i[0].rank(),
                "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor"
            );
        let padded = padded_front(&i[0].shape, reps.len());
        let shape = padded
            .iter()
            .zip(reps)
            .enumerate()
            .map(|(d, (&s, &r))| {
                s.checked_mul(r).ok_or_else(|| {
                    OpError::runtime(format!(
                        "repeat: size {s} repeated {r} times overflows int64 at dimension {d} (sizes {}, repeats {}); expected each size times its repeat count to be at most {}",
                        fmt_shape(&padded),
                        fmt_shape(reps),
                        i64::MAX
                    ))
                })
            })
            .collect::<Result<Shape, OpError>>()?;
        single(TensorType {
            dtype: i[0].dtype,
            shape,
        })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let reps = layout::Repeats::decode(&a.params)?.repeats;
        let padded = padded_front(e.shape(a.inputs[0]), reps.len());
        let x = e.reshape(a.inputs[0], &padded);
        // [s0, s1] -> broadcast to [r0, s0, r1, s1] -> reshape [r0*s0, r1*s1].
        let mut wide = Vec::new();
        let mut dims = Vec::new();
        for (i, (&s, &r)) in padded.iter().zip(reps).enumerate() {
            wide.push(r);
            wide.push(s);
            dims.push(2 * i + 1);
        }
        let b = e.broadcast_in_dim(x, &wide, &dims);
        Ok(vec![e.reshape(b, &out.shape)])
    }
}

/// `tril` and `triu`: the lower or upper triangle of each matrix from a diagonal, the rest
/// zeros.
pub(crate) struct TrilTriu;

impl OpRule for TrilTriu {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(1..=1, 0..=0)?;
        ensure!(
            i[0].rank() >= 2,
            "{}: input tensor must have at least 2 dimensions",
            a.op.name()
        );
        single(i[0].clone())
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let x = a.inputs[0];
        let diagonal = layout::Diagonal::decode(&a.params)?.diagonal;
        let shape = out.shape.to_vec();
        let r = shape.len();
        let ity = TensorType::new(DType::I64, &shape);
        let rows = e.iota(ity.clone(), r - 2);
        let cols = e.iota(ity, r - 1);
        let diff = e.sub(cols, rows);
        let dconst = e.full_like(diff, diagonal as f64);
        let keep = if a.op == OpId::Tril {
            e.compare(Cmp::Le, diff, dconst)
        } else {
            e.compare(Cmp::Ge, diff, dconst)
        };
        let zero = e.full_like(x, 0.0);
        let zero = if out.dtype == DType::Bool {
            e.cast(zero, DType::Bool)
        } else {
            zero
        };
        Ok(vec![e.select(keep, x, zero)])
    }
}

/// `gather`: the input's elements at an index tensor's positions along a dim, in the index's
/// shape.
pub(crate) struct Gather;

impl OpRule for Gather {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(2..=2, 0..=0)?;
        let (x, index) = (&i[0], &i[1]);
        let dim = wrap_dim(layout::Dim::decode(&a.params)?.dim, x.rank())?;
        index_dtype_check("gather", index)?;
        // PyTorch checks shapes only for a non-empty index, counting a 0-d tensor as 1-d.
        if index.numel() != 0 {
            ensure!(
                index.rank().max(1) == x.rank().max(1),
                "Index tensor must have the same number of dimensions as input tensor"
            );
            for d in 0..index.rank() {
                ensure!(
                        d == dim || index.shape[d] <= x.shape.get(d).copied().unwrap_or(1),
                        "Size does not match at dimension {d} expected index {} to be no larger than self {} apart from dimension {dim}",
                        fmt_shape(&index.shape),
                        fmt_shape(&x.shape)
                    );
            }
        }
        single(TensorType {
            dtype: x.dtype,
            shape: index.shape.clone(),
        })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let (x, index) = (a.inputs[0], a.inputs[1]);
        let dim = wrap_dim(layout::Dim::decode(&a.params)?.dim, e.rank(x))?;
        if e.rank(index) == 0 && e.rank(x) > 0 {
            // A 0-d index into a 1-d input counts as 1-d (meta checked the ranks): one element,
            // returned 0-d as PyTorch does.
            let index = e.reshape(index, &[1]);
            let v = gather_along(e, x, index, dim);
            return Ok(vec![e.reshape(v, &[])]);
        }
        Ok(vec![gather_along(e, x, index, dim)])
    }
}

/// `index_select`: the input's slices at a 1-D index along a dim.
pub(crate) struct IndexSelect;

impl OpRule for IndexSelect {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(2..=2, 0..=0)?;
        let (x, index) = (&i[0], &i[1]);
        let dim = wrap_dim(layout::Dim::decode(&a.params)?.dim, x.rank())?;
        ensure!(
            matches!(index.dtype, DType::I32 | DType::I64),
            "index_select(): Expected dtype int32 or int64 for index"
        );
        if index.rank() > 1 {
            return Err(OpError::index(
                "index_select(): Index is supposed to be a vector",
            ));
        }
        let mut shape = x.shape.clone();
        if x.rank() > 0 {
            shape[dim] = index.numel();
        }
        single(TensorType {
            dtype: x.dtype,
            shape,
        })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let x = a.inputs[0];
        let v = if e.rank(x) == 0 {
            let n = e.ty(a.inputs[1]).numel();
            if n == 0 {
                e.constant(out.clone(), crate::ScalarValue::Int(0))
            } else {
                x
            }
        } else {
            let dim = wrap_dim(layout::Dim::decode(&a.params)?.dim, e.rank(x))?;
            let n = e.ty(a.inputs[1]).numel();
            let idx = e.reshape(a.inputs[1], &[n]);
            index_select(e, x, idx, dim)
        };
        Ok(vec![v])
    }
}

/// `scatter` (from a tensor or a value scalar), `scatter_add` and `scatter_reduce`: the input
/// with elements at an index tensor's positions along a dim replaced or combined.
pub(crate) struct Scatter;

impl OpRule for Scatter {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        let has_src = i.len() == 3;
        if has_src {
            a.expect_counts(3..=3, 0..=0)?;
        } else {
            ensure!(a.op == OpId::Scatter, "scatter_add: expected a src tensor");
            a.expect_counts(2..=2, 1..=1)?;
        }
        let (x, index) = (&i[0], &i[1]);
        let dim = wrap_dim(scatter_dim(&a.params)?, x.rank())?;
        index_dtype_check("scatter", index)?;
        if has_src {
            ensure!(
                i[2].dtype == x.dtype,
                "scatter(): Expected self.dtype to be equal to src.dtype"
            );
        }
        if index.numel() == 0 {
            return Ok(Meta::single(x.clone(), vec![x.dtype; a.scalars.len()]));
        }
        // A 0-d tensor counts as 1-d, as PyTorch's ensure_nonempty_dim has it.
        ensure!(
            index.rank().max(1) == x.rank().max(1),
            "Index tensor must have the same number of dimensions as self tensor"
        );
        if has_src {
            ensure!(
                index.rank().max(1) == i[2].rank().max(1),
                "Index tensor must have the same number of dimensions as src tensor"
            );
        }
        for d in 0..index.rank() {
            let too_big_self = d != dim && index.shape[d] > x.shape.get(d).copied().unwrap_or(1);
            let too_big_src = has_src && index.shape[d] > i[2].shape.get(d).copied().unwrap_or(1);
            if too_big_self || too_big_src {
                let src = if has_src {
                    format!(
                        " and to be no larger size than src {}",
                        fmt_shape(&i[2].shape)
                    )
                } else {
                    String::new()
                };
                return Err(OpError::runtime(format!(
                        "Expected index {} to be no larger than self {} apart from dimension {dim}{src}",
                        fmt_shape(&index.shape),
                        fmt_shape(&x.shape)
                    )));
            }
        }
        Ok(Meta::single(x.clone(), vec![x.dtype; a.scalars.len()]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let p = &a.params;
        let x = a.inputs[0];
        let mut index = a.inputs[1];
        if e.ty(index).numel() == 0 {
            return Ok(vec![x]);
        }
        let dim = wrap_dim(scatter_dim(p)?, e.rank(x))?;
        // A 0-d index or src stands for a 1-d one (PyTorch's ensure_nonempty_dim).
        if e.rank(index) == 0 {
            index = e.reshape(index, &[1]);
        }
        let index_shape = e.shape(index).to_vec();
        let updates = if a.inputs.len() == 3 {
            let mut src = a.inputs[2];
            if e.rank(src) == 0 {
                src = e.reshape(src, &vec![1; index_shape.len()]);
            }
            let zeros = vec![0; index_shape.len()];
            let ones = vec![1; index_shape.len()];
            if e.shape(src) == index_shape.as_slice() {
                src
            } else {
                e.slice(src, &zeros, &index_shape, &ones)
            }
        } else {
            let v = e.cast(a.scalars[0], out.dtype);
            e.broadcast_to(v, &index_shape)
        };
        let combiner = match a.op {
            OpId::ScatterAdd => Combiner::Sum,
            OpId::ScatterReduce => match layout::ScatterCombine::decode(p)?.combiner {
                1 => Combiner::Prod,
                2 => Combiner::Max,
                3 => Combiner::Min,
                c => {
                    return Err(OpError::runtime(format!(
                        "scatter_reduce: unknown combiner {c}"
                    )))
                }
            },
            _ => Combiner::Replace,
        };
        Ok(vec![scatter_along(e, x, index, updates, dim, combiner)])
    }
}

/// `embedding`: the weight's rows at each index, in the indices' shape plus the row.
pub(crate) struct Embedding;

impl OpRule for Embedding {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(2..=2, 0..=0)?;
        let (w, idx) = (&i[0], &i[1]);
        ensure!(w.rank() == 2, "'weight' must be 2-D");
        ensure!(
                matches!(idx.dtype, DType::I32 | DType::I64),
                "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; but got torch.{}Tensor instead (while checking arguments for embedding)",
                idx.dtype.scalar_type_name()
            );
        let mut shape = idx.shape.clone();
        shape.push(w.shape[1]);
        single(TensorType {
            dtype: w.dtype,
            shape,
        })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let (w, idx) = (a.inputs[0], a.inputs[1]);
        let n = e.ty(idx).numel();
        let flat = e.reshape(idx, &[n]);
        let rows = index_select(e, w, flat, 0);
        Ok(vec![e.reshape(rows, &out.shape)])
    }
}

/// `expand`: the input broadcast to sizes (`-1` keeps a dim).
pub(crate) struct Expand;

impl OpRule for Expand {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(1..=1, 0..=0)?;
        let x = &i[0];
        let sizes = layout::Sizes::decode(&a.params)?.sizes;
        ensure!(
                sizes.len() >= x.rank(),
                "expand(torch.{}Tensor{{{}}}, size={}): the number of sizes provided ({}) must be greater or equal to the number of dimensions in the tensor ({})",
                x.dtype.scalar_type_name(),
                fmt_shape(&x.shape),
                fmt_shape(sizes),
                sizes.len(),
                x.rank()
            );
        let shape = expand_target(&x.shape, sizes);
        check_expand(&x.shape, &shape)?;
        // PyTorch walks the sizes from the last: the new leading dims come after the existing.
        let offset = sizes.len() - x.rank();
        if let Some(d) = sizes[..offset].iter().rposition(|&s| s == -1) {
            return Err(OpError::runtime(format!(
                "The expanded size of the tensor (-1) isn't allowed in a leading, non-existing dimension {d}"
            )));
        }
        single(x.with_shape(&shape))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        Ok(vec![e.broadcast_to(a.inputs[0], &out.shape)])
    }
}

/// `sum_to_size`: the input summed down to sizes it expands to.
pub(crate) struct SumToSize;

impl OpRule for SumToSize {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(1..=1, 0..=0)?;
        let x = &i[0];
        let sizes = layout::Sizes::decode(&a.params)?.sizes;
        let ok = sizes.len() <= x.rank()
            && sizes
                .iter()
                .rev()
                .zip(x.shape.iter().rev())
                .all(|(&s, &d)| s == d || s == 1);
        ensure!(
            ok,
            "size {{{}}} is not expandable to size {{{}}}.",
            fmt_shape(sizes),
            fmt_shape(&x.shape)
        );
        single(x.with_shape(sizes))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        Ok(vec![sum_to_size(e, a.inputs[0], &out.shape)])
    }
}

/// `reshape`: the input in new sizes of the same element count (one may be `-1`).
pub(crate) struct Reshape;

impl OpRule for Reshape {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(1..=1, 0..=0)?;
        let shape = infer_size(layout::Sizes::decode(&a.params)?.sizes, i[0].numel())?;
        single(i[0].with_shape(&shape))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        Ok(vec![e.reshape(a.inputs[0], &out.shape)])
    }
}

/// `permute`: the input's dims reordered.
pub(crate) struct Permute;

impl OpRule for Permute {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(1..=1, 0..=0)?;
        let x = &i[0];
        let dims = layout::Dims::decode(&a.params)?.dims;
        ensure!(
            dims.len() == x.rank(),
            "permute(sparse_coo): number of dimensions in the tensor input does not match the length of the desired ordering of dimensions i.e. input.dim() = {} is not equal to len(dims) = {}",
            x.rank(),
            dims.len()
        );
        let perm = permutation(dims, x.rank())?;
        let shape: Shape = perm.iter().map(|&d| x.shape[d]).collect();
        single(x.with_shape(&shape))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let perm = permutation(layout::Dims::decode(&a.params)?.dims, out.rank())?;
        Ok(vec![e.transpose(a.inputs[0], &perm)])
    }
}

/// `transpose`: two of the input's dims swapped.
pub(crate) struct Transpose;

impl OpRule for Transpose {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(1..=1, 0..=0)?;
        let x = &i[0];
        let layout::TransposeDims { dim0, dim1 } = layout::TransposeDims::decode(&a.params)?;
        let (d0, d1) = (wrap_dim(dim0, x.rank())?, wrap_dim(dim1, x.rank())?);
        let mut shape = x.shape.clone();
        if x.rank() > 0 {
            shape.swap(d0, d1);
        }
        single(x.with_shape(&shape))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let r = out.rank();
        let v = if r == 0 {
            a.inputs[0]
        } else {
            let layout::TransposeDims { dim0, dim1 } = layout::TransposeDims::decode(&a.params)?;
            let (d0, d1) = (wrap_dim(dim0, r)?, wrap_dim(dim1, r)?);
            let mut perm: Vec<usize> = (0..r).collect();
            perm.swap(d0, d1);
            e.transpose(a.inputs[0], &perm)
        };
        Ok(vec![v])
    }
}

/// `slice`: a strided range of the input along a dim, its bounds clamped as Python's are.
pub(crate) struct Slice;

impl OpRule for Slice {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(1..=1, 0..=0)?;
        let x = &i[0];
        ensure!(x.rank() > 0, "slice() cannot be applied to a 0-dim tensor.");
        let (dim, start, end, step) = slice_bounds(a, x)?;
        let mut shape = x.shape.clone();
        // The ceiling of (end - start) / step, written not to overflow for a step near i64::MAX.
        shape[dim] = if end > start {
            (end - start - 1) / step + 1
        } else {
            0
        };
        single(x.with_shape(&shape))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let x = a.inputs[0];
        let in_ty = e.ty(x).clone();
        let meta_args = MetaArgs {
            op: a.op,
            inputs: std::slice::from_ref(&in_ty),
            scalars: &[],
            params: a.params,
        };
        let (dim, start, end, step) = slice_bounds(&meta_args, &in_ty)?;
        let end = end.max(start);
        // XLA sizes a slice as (end - start + step - 1) / step in int64, which overflows for a
        // step near i64::MAX: such a step takes only the first element, as the extent does.
        let extent = end - start;
        let step = if extent > 0 && step - 1 > i64::MAX - extent {
            extent
        } else {
            step
        };
        Ok(vec![e.slice_dim(x, dim, start, end, step)])
    }
}

/// `select`: the input at one index along a dim, that dim removed.
pub(crate) struct Select;

impl OpRule for Select {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(1..=1, 0..=0)?;
        let x = &i[0];
        ensure!(
            x.rank() > 0,
            "select() cannot be applied to a 0-dim tensor."
        );
        let layout::SelectIndex {
            dim: raw_dim,
            index,
        } = layout::SelectIndex::decode(&a.params)?;
        let dim = wrap_dim(raw_dim, x.rank())?;
        let size = x.shape[dim];
        if index < -size || index >= size {
            return Err(OpError::index(format!(
                "select(): index {index} out of range for tensor of size {} at dimension {}",
                fmt_shape(&x.shape),
                raw_dim
            )));
        }
        let mut shape = x.shape.clone();
        shape.remove(dim);
        single(x.with_shape(&shape))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let x = a.inputs[0];
        let layout::SelectIndex { dim, mut index } = layout::SelectIndex::decode(&a.params)?;
        let dim = wrap_dim(dim, e.rank(x))?;
        let size = e.shape(x)[dim];
        if index < 0 {
            index += size;
        }
        let s = e.slice_dim(x, dim, index, index + 1, 1);
        Ok(vec![e.reshape(s, &out.shape)])
    }
}

/// The dim of `scatter`, `scatter_add` (layout `Dim`) or `scatter_reduce` (`ScatterCombine`).
fn scatter_dim(p: &Params) -> Result<i64, OpError> {
    if p.op() == OpId::ScatterReduce {
        Ok(layout::ScatterCombine::decode(p)?.dim)
    } else {
        Ok(layout::Dim::decode(p)?.dim)
    }
}

fn padded_front(shape: &[i64], rank: usize) -> Vec<i64> {
    let mut v = vec![1; rank - shape.len()];
    v.extend_from_slice(shape);
    v
}

fn expand_target(shape: &[i64], sizes: &[i64]) -> Shape {
    let offset = sizes.len() - shape.len();
    sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            if s == -1 && i >= offset {
                shape[i - offset]
            } else {
                s
            }
        })
        .collect()
}

fn infer_size(sizes: &[i64], numel: i64) -> Result<Shape, OpError> {
    let mut infer = None;
    let mut known = 1i64;
    for (i, &s) in sizes.iter().enumerate() {
        if s == -1 {
            ensure!(infer.is_none(), "only one dimension can be inferred");
            infer = Some(i);
        } else {
            ensure!(s >= 0, "invalid shape dimension {s}");
            known = known.checked_mul(s).ok_or_else(|| {
                OpError::runtime(format!(
                    "shape '{}' has more than {} elements (numel: integer multiplication overflow); expected sizes whose product fits in int64",
                    fmt_shape(sizes),
                    i64::MAX
                ))
            })?;
        }
    }
    let mut shape = Shape::from_slice(sizes);
    let invalid = || {
        OpError::runtime(format!(
            "shape '{}' is invalid for input of size {numel}",
            fmt_shape(sizes)
        ))
    };
    match infer {
        Some(_) if numel == 0 && known == 0 => {
            return Err(OpError::runtime(format!(
                "cannot reshape tensor of 0 elements into shape {} because the unspecified dimension size -1 can be any value and is ambiguous",
                fmt_shape(sizes)
            )))
        }
        Some(i) => {
            if known == 0 || numel % known != 0 {
                return Err(invalid());
            }
            shape[i] = numel / known;
        }
        None if known != numel => return Err(invalid()),
        None => {}
    }
    Ok(shape)
}

fn permutation(dims: &[i64], rank: usize) -> Result<Vec<usize>, OpError> {
    let mut seen = vec![false; rank];
    let mut perm = Vec::with_capacity(rank);
    for &d in dims {
        let w = wrap_dim(d, rank)?;
        ensure!(!seen[w], "permute(): duplicate dims are not allowed.");
        seen[w] = true;
        perm.push(w);
    }
    Ok(perm)
}

/// `(dim, start, end, step)` of a slice with Python's clamping.
fn slice_bounds(a: &MetaArgs, x: &TensorType) -> Result<(usize, i64, i64, i64), OpError> {
    let layout::SliceRange {
        dim,
        mut start,
        mut end,
        step,
    } = layout::SliceRange::decode(&a.params)?;
    let dim = wrap_dim(dim, x.rank())?;
    ensure!(step > 0, "slice step must be positive");
    let size = x.shape[dim];
    if start < 0 {
        start += size;
    }
    if end < 0 {
        end += size;
    }
    start = start.clamp(0, size);
    end = end.clamp(start, size);
    Ok((dim, start, end, step))
}

fn padded_shape(x: &TensorType, pad: &[i64]) -> Result<Shape, OpError> {
    ensure!(
        pad.len() & 1 == 0,
        "Length of pad must be even but instead it equals {}",
        pad.len()
    );
    ensure!(
        pad.len() / 2 <= x.rank(),
        "Length of pad should be no more than twice the number of dimensions of the input. Pad length is {}while the input has {}dimensions.",
        pad.len(),
        x.rank()
    );
    let mut shape = x.shape.clone();
    for (j, pair) in pad.chunks(2).enumerate() {
        let d = x.rank() - 1 - j;
        let wide = i128::from(shape[d]) + i128::from(pair[0]) + i128::from(pair[1]);
        let new = i64::try_from(wide).map_err(|_| {
            OpError::runtime(format!(
                "The input size {}, plus padding {} and {} resulted in an output size of {wide}, which overflows int64. Check dimension {d} of your input.",
                shape[d], pair[0], pair[1]
            ))
        })?;
        // PyTorch crops with narrow() before padding, which reports the negative length.
        ensure!(new >= 0, "narrow(): length must be non-negative.");
        shape[d] = new;
    }
    Ok(shape)
}

// ---- lowering ------------------------------------------------------------------------------

fn lower_roll(e: &mut Emitter, x: Value, shifts: &[i64], dims: &[i64]) -> Value {
    let shape = e.shape(x).to_vec();
    if dims.is_empty() {
        let n: i64 = shape.iter().product();
        let flat = e.reshape(x, &[n]);
        let r = roll_dim(e, flat, 0, shifts[0]);
        return e.reshape(r, &shape);
    }
    let mut v = x;
    for (&s, &d) in shifts.iter().zip(dims) {
        let d = wrap_dim(d, shape.len()).expect("meta checked");
        v = roll_dim(e, v, d, s);
    }
    v
}

fn roll_dim(e: &mut Emitter, x: Value, dim: usize, shift: i64) -> Value {
    let size = e.shape(x).get(dim).copied().unwrap_or(1);
    if size == 0 || e.rank(x) == 0 {
        return x;
    }
    let s = shift.rem_euclid(size);
    if s == 0 {
        return x;
    }
    let tail = e.slice_dim(x, dim, size - s, size, 1);
    let head = e.slice_dim(x, dim, 0, size - s, 1);
    e.concatenate(&[tail, head], dim)
}

/// `x` gathered with `index` (int) along `dim`: full index vectors built from iotas.
fn full_indices(e: &mut Emitter, index: Value, dim: usize) -> Value {
    let shape = e.shape(index).to_vec();
    let r = shape.len();
    let idx = e.convert(index, DType::I64);
    let mut ishape = shape.clone();
    ishape.push(1);
    let parts: Vec<Value> = (0..r)
        .map(|d| {
            let comp = if d == dim {
                idx
            } else {
                e.iota(TensorType::new(DType::I64, &shape), d)
            };
            e.reshape(comp, &ishape)
        })
        .collect();
    e.concatenate(&parts, r)
}

fn gather_along(e: &mut Emitter, x: Value, index: Value, dim: usize) -> Value {
    let r = e.rank(x);
    let out_shape = e.shape(index).to_vec();
    if out_shape.iter().product::<i64>() == 0 {
        let ty = e.ty(x).with_shape(&out_shape);
        return e.constant(ty, crate::ScalarValue::Int(0));
    }
    if r == 0 {
        let v = e.reshape(x, &vec![1; out_shape.len()]);
        return e.broadcast_to(v, &out_shape);
    }
    let indices = full_indices(e, index, dim);
    let all: Vec<i64> = (0..r as i64).collect();
    let attrs = format!(
        "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = {}, start_index_map = {}, index_vector_dim = {}>, indices_are_sorted = false, slice_sizes = {}",
        bracket_list(&all),
        bracket_list(&all),
        r,
        i64_array(&vec![1; r])
    );
    let ty = e.ty(x).with_shape(&out_shape);
    e.op("stablehlo.gather", &[x, indices], &attrs, ty)
}

/// Rows `idx` (1-D, int) of `x` along `dim`.
fn index_select(e: &mut Emitter, x: Value, idx: Value, dim: usize) -> Value {
    let shape = e.shape(x).to_vec();
    let n = e.shape(idx)[0];
    let idx = e.convert(idx, DType::I64);
    let indices = e.reshape(idx, &[n, 1]);
    let mut out_shape = shape.clone();
    out_shape[dim] = n;
    if n == 0 {
        let ty = e.ty(x).with_shape(&out_shape);
        return e.constant(ty, crate::ScalarValue::Int(0));
    }
    let offset_dims: Vec<i64> = (0..shape.len() as i64)
        .filter(|&d| d != dim as i64)
        .collect();
    let mut slice_sizes = shape.clone();
    slice_sizes[dim] = 1;
    let attrs = format!(
        "dimension_numbers = #stablehlo.gather<offset_dims = {}, collapsed_slice_dims = [{dim}], start_index_map = [{dim}], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = {}",
        bracket_list(&offset_dims),
        i64_array(&slice_sizes)
    );
    let ty = e.ty(x).with_shape(&out_shape);
    e.op("stablehlo.gather", &[x, indices], &attrs, ty)
}

fn scatter_along(
    e: &mut Emitter,
    x: Value,
    index: Value,
    updates: Value,
    dim: usize,
    combiner: Combiner,
) -> Value {
    let r = e.rank(x);
    if e.ty(index).numel() == 0 {
        return x;
    }
    let dtype = e.dtype(x);
    if r == 0 {
        // Every index is 0: the updates fold into the scalar in order (scatter keeps the last
        // one, as the CPU kernel writes in order).
        let n = e.ty(updates).numel();
        let flat = e.reshape(updates, &[n]);
        if combiner == Combiner::Replace {
            let last = e.slice(flat, &[n - 1], &[n], &[1]);
            return e.reshape(last, &[]);
        }
        let mut acc = x;
        for k in 0..n {
            let one = e.slice(flat, &[k], &[k + 1], &[1]);
            let one = e.reshape(one, &[]);
            acc = combiner.combine(e, dtype, acc, one);
        }
        return acc;
    }
    let indices = full_indices(e, index, dim);
    let all: Vec<i64> = (0..r as i64).collect();
    let region = e.region(
        &[TensorType::scalar(dtype), TensorType::scalar(dtype)],
        |e, args| vec![combiner.combine(e, dtype, args[0], args[1])],
    );
    let attrs = format!(
        "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = {}, scatter_dims_to_operand_dims = {}, index_vector_dim = {}>, indices_are_sorted = false, unique_indices = false",
        bracket_list(&all),
        bracket_list(&all),
        r
    );
    let ty = e.ty(x).clone();
    e.op_with_regions(
        "stablehlo.scatter",
        &[x, indices, updates],
        &[region],
        &attrs,
        vec![ty],
    )[0]
}

/// How a scatter combines an update with the value already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Combiner {
    Replace,
    Sum,
    Prod,
    Max,
    Min,
}

impl Combiner {
    fn combine(self, e: &mut Emitter, dtype: DType, old: Value, new: Value) -> Value {
        match (self, dtype) {
            (Combiner::Replace, _) => new,
            (Combiner::Sum | Combiner::Max, DType::Bool) => e.or(old, new),
            (Combiner::Prod | Combiner::Min, DType::Bool) => e.and(old, new),
            (Combiner::Sum, _) => e.add(old, new),
            (Combiner::Prod, _) => e.mul(old, new),
            (Combiner::Max | Combiner::Min, _) => {
                let m = if self == Combiner::Max {
                    e.max(old, new)
                } else {
                    e.min(old, new)
                };
                if !dtype.is_float() {
                    return m;
                }
                // XLA CPU's fast max/min drops a NaN in its second operand; PyTorch's keep it.
                let new_nan = e.compare(Cmp::Ne, new, new);
                let m = e.select(new_nan, new, m);
                let old_nan = e.compare(Cmp::Ne, old, old);
                e.select(old_nan, old, m)
            }
        }
    }
}

/// Sum `x` down to `shape` (leading dims and dims where `shape` has 1).
pub(crate) fn sum_to_size(e: &mut Emitter, x: Value, shape: &[i64]) -> Value {
    let xs = e.shape(x).to_vec();
    if xs == shape {
        return x;
    }
    let lead = xs.len() - shape.len();
    let dims: Vec<usize> = (0..xs.len())
        .filter(|&d| d < lead || (shape[d - lead] == 1 && xs[d] != 1))
        .collect();
    let dtype = e.dtype(x);
    let acc = if dtype.is_float() {
        dtype.compute_dtype()
    } else {
        dtype
    };
    let xc = e.convert(x, acc);
    let s = if dtype == DType::Bool {
        e.reduce_with(xc, 0.0, &dims, "stablehlo.or")
    } else {
        e.reduce_sum(xc, &dims)
    };
    let s = e.convert(s, dtype);
    e.reshape(s, shape)
}
