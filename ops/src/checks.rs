//! Assertion ops: side-effecting checks whose verdict the engine reads after running them.
//!
//! `_assert_async` is PyTorch's own. `index_check` guards the indexing ops: gather, scatter,
//! embedding and friends would otherwise clamp an out-of-range index silently (StableHLO's
//! gather and scatter do), where PyTorch raises. Reading the indices on the host would cost a
//! sync per op, so the check runs on the device next to the op and its verdict is read at the
//! next materialization point (RFC 0012).

use smallvec::SmallVec;

use crate::emitter::Emitter;
use crate::param_layout as layout;
use crate::params::{wrap_dim, Params};
use crate::{
    Cmp, DType, ErrorKind, LowerArgs, Meta, MetaArgs, OpError, OpId, OpRule, ScalarValue,
    TensorType, Value,
};

/// How an out-of-range index is reported: PyTorch's exception type and message differ by op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i64)]
pub enum IndexStyle {
    /// `IndexError: index 7 is out of bounds for dimension 0 with size 5` (`index`,
    /// `index_put_`).
    Bounds = 0,
    /// The same message as a `RuntimeError` (`gather`, `scatter`, `index_add`).
    BoundsRuntime = 1,
    /// `IndexError: index out of range in self` (`embedding`, `index_select`).
    OutOfRangeInSelf = 2,
    /// `RuntimeError: INDICES element is out of DATA bounds, id=7 axis_dim=5` (`index_select`
    /// along dim 1, which PyTorch's CPU kernel checks on its own path).
    DataBounds = 3,
    /// `IndexError: Target 7 is out of bounds.` (`nll_loss`).
    Target = 4,
    /// `RuntimeError: repeats can not be negative` (`repeat_interleave` with an
    /// `output_size`, checked by `repeats_check`).
    NegativeRepeats = 5,
    /// `RuntimeError: allocated size does not match required size` (`repeat_interleave`
    /// whose `output_size` is not the sum of its repeats).
    RepeatsTotal = 6,
}

impl IndexStyle {
    fn from_i64(v: i64) -> Option<IndexStyle> {
        Some(match v {
            0 => IndexStyle::Bounds,
            1 => IndexStyle::BoundsRuntime,
            2 => IndexStyle::OutOfRangeInSelf,
            3 => IndexStyle::DataBounds,
            4 => IndexStyle::Target,
            5 => IndexStyle::NegativeRepeats,
            6 => IndexStyle::RepeatsTotal,
            _ => return None,
        })
    }
}

/// One `index_check` to capture after an indexing op: which of the op's inputs holds the
/// indices, and the check's params.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IndexCheck {
    pub input: usize,
    pub bounds: layout::IndexBounds<'static>,
}

impl IndexCheck {
    /// The check's params, encoded.
    pub fn params(&self) -> SmallVec<[i64; 6]> {
        crate::typed::IndexCheck.encode(self.bounds).params
    }
}

/// The elements of an `index_check` verdict.
pub const INDEX_VERDICT_LEN: usize = 5;

fn check(
    input: usize,
    size: i64,
    negative_ok: bool,
    dim: i64,
    style: IndexStyle,
    ignore: Option<i64>,
) -> IndexCheck {
    IndexCheck {
        input,
        bounds: layout::IndexBounds {
            size,
            negative_ok,
            dim,
            style: style as i64,
            ignore,
        },
    }
}

/// The range checks for the indices `op` reads, given its inputs' shapes and its params (a call
/// the op's meta refuses may get none). Empty index tensors need no check. Backward ops are not
/// checked: their indices were checked by the forward op.
pub fn index_checks(op: OpId, shapes: &[&[i64]], params: &[i64]) -> SmallVec<[IndexCheck; 1]> {
    use OpId::*;
    let mut out = SmallVec::new();
    if shapes.is_empty() {
        // Not a call the op's meta accepts: it raises the error.
        return out;
    }
    let size_at = |shape: &[i64], dim: usize| shape.get(dim).copied().unwrap_or(1);
    let nonempty = |i: usize| {
        shapes
            .get(i)
            .is_some_and(|s| s.iter().product::<i64>() != 0)
    };
    let params = Params::new(op, params);
    match op {
        Index | IndexPut => {
            let (first, dims, accumulate) = if op == Index {
                let Ok(l) = layout::IndexedDims::decode(&params) else {
                    return out;
                };
                (1, l.indexed_dims, 0)
            } else {
                let Ok(l) = layout::IndexPutDims::decode(&params) else {
                    return out;
                };
                (2, l.indexed_dims, l.accumulate)
            };
            // index_add reaches index_put with accumulate = 2: its errors are RuntimeErrors
            // that name the real dim, index_put's IndexErrors the index's position.
            let index_add = accumulate == 2;
            for (k, &dim) in dims.iter().enumerate() {
                let input = first + k;
                if !nonempty(input) || dim < 0 {
                    continue;
                }
                let size = size_at(shapes[0], dim as usize);
                out.push(if index_add {
                    check(input, size, false, dim, IndexStyle::BoundsRuntime, None)
                } else {
                    check(input, size, true, k as i64, IndexStyle::Bounds, None)
                });
            }
        }
        Gather | Scatter | ScatterAdd | ScatterReduce | IndexSelect => {
            let rank = shapes[0].len();
            let dim = if op == ScatterReduce {
                layout::ScatterCombine::decode(&params).map(|l| l.dim)
            } else {
                layout::Dim::decode(&params).map(|l| l.dim)
            };
            let Ok(raw) = dim else {
                return out;
            };
            let Ok(dim) = wrap_dim(raw, rank) else {
                return out;
            };
            if !nonempty(1) {
                return out;
            }
            let size = size_at(shapes[0], dim);
            let style = match op {
                IndexSelect if dim == 1 && rank > 1 => IndexStyle::DataBounds,
                IndexSelect => IndexStyle::OutOfRangeInSelf,
                _ => IndexStyle::BoundsRuntime,
            };
            out.push(check(1, size, false, dim as i64, style, None));
        }
        Embedding if nonempty(1) => {
            out.push(check(
                1,
                size_at(shapes[0], 0),
                false,
                0,
                IndexStyle::OutOfRangeInSelf,
                None,
            ));
        }
        NllLoss | NllLoss2d if nonempty(1) => {
            let classes = size_at(shapes[0], if shapes[0].len() >= 2 { 1 } else { 0 });
            // Targets equal to ignore_index are skipped, whatever their value.
            let ignore = layout::NllLossReduction::decode(&params).map_or(-100, |l| l.ignore_index);
            out.push(check(
                1,
                classes,
                false,
                1,
                IndexStyle::Target,
                Some(ignore),
            ));
        }
        _ => {}
    }
    out
}

/// The verdict an `index_check` with `params` gives for index values the host knows (in
/// row-major order): the device lowering's rule, `[bad, first bad index, size, dim, style]`, so
/// [`index_check_error`] words both alike. The engine asks this at capture when the indices came
/// from host memory, so PyTorch's error is raised at the op in every mode.
pub fn host_index_verdict(
    params: &[i64],
    values: &[i64],
) -> Result<[i64; INDEX_VERDICT_LEN], OpError> {
    let layout::IndexBounds {
        size,
        negative_ok,
        dim,
        style,
        ignore,
    } = layout::IndexBounds::decode(&Params::new(OpId::IndexCheck, params))?;
    let lowest = if negative_ok { -size } else { 0 };
    let first_bad = values
        .iter()
        .copied()
        .find(|&v| (v < lowest || v >= size) && Some(v) != ignore);
    Ok(match first_bad {
        Some(value) => [1, value, size, dim, style],
        None => [0, 0, size, dim, style],
    })
}

/// The error an `index_check` verdict stands for, if any.
pub fn index_check_error(verdict: &[i64]) -> Option<OpError> {
    let &[bad, value, size, dim, style] = verdict else {
        return Some(OpError::runtime(format!(
            "index_check: malformed verdict {verdict:?}"
        )));
    };
    if bad == 0 {
        return None;
    }
    let bounds = format!("index {value} is out of bounds for dimension {dim} with size {size}");
    let (kind, message) = match IndexStyle::from_i64(style) {
        Some(IndexStyle::Bounds) => (ErrorKind::Index, bounds),
        Some(IndexStyle::BoundsRuntime) => (ErrorKind::Runtime, bounds),
        Some(IndexStyle::OutOfRangeInSelf) => {
            (ErrorKind::Index, "index out of range in self".to_string())
        }
        Some(IndexStyle::DataBounds) => (
            ErrorKind::Runtime,
            format!("INDICES element is out of DATA bounds, id={value} axis_dim={size}"),
        ),
        Some(IndexStyle::Target) => (
            ErrorKind::Index,
            format!("Target {value} is out of bounds."),
        ),
        Some(IndexStyle::NegativeRepeats) => (
            ErrorKind::Runtime,
            "repeats can not be negative".to_string(),
        ),
        Some(IndexStyle::RepeatsTotal) => (
            ErrorKind::Runtime,
            "allocated size does not match required size".to_string(),
        ),
        None => (ErrorKind::Runtime, bounds),
    };
    Some(OpError::new(kind, message))
}

/// `_assert_async`: whether the one value of `self` is nonzero, read by the engine later.
pub(crate) struct AssertAsync;

impl OpRule for AssertAsync {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let numel = a.inputs[0].numel();
        if numel == 0 {
            return Err(OpError::runtime(
                "Boolean value of Tensor with no values is ambiguous",
            ));
        }
        if numel > 1 {
            return Err(OpError::runtime(
                "Boolean value of Tensor with more than one value is ambiguous",
            ));
        }
        Ok(Meta::single(TensorType::scalar(DType::Bool), Vec::new()))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let x = e.reshape(a.inputs[0], &[]);
        let zero = e.scalar_constant(e.dtype(x), ScalarValue::Int(0));
        Ok(vec![e.compare(Cmp::Ne, x, zero)])
    }
}

/// `index_check`: the verdict on the indices an indexing op read.
pub(crate) struct IndexCheckOp;

impl OpRule for IndexCheckOp {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=1)?;
        let p = &a.params;
        if !matches!(a.inputs[0].dtype, DType::I32 | DType::I64) {
            return Err(p.invalid("the indices must be int32 or int64"));
        }
        let style = layout::IndexBounds::decode(p)?.style;
        if IndexStyle::from_i64(style).is_none() {
            return Err(p.invalid("style must be an index error style"));
        }
        // A size given as a scalar (a padded extent's true length) is read at run time.
        let scalar_dtypes = if a.scalars.is_empty() {
            Vec::new()
        } else {
            vec![DType::I64]
        };
        Ok(Meta::single(
            TensorType::new(DType::I64, &[INDEX_VERDICT_LEN as i64]),
            scalar_dtypes,
        ))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![lower_index_check(e, a)?])
    }
}

/// `repeats_check`: the verdict on `repeat_interleave`'s repeats against its `output_size`.
pub(crate) struct RepeatsCheck;

impl OpRule for RepeatsCheck {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 1..=1)?;
        let repeats = &a.inputs[0];
        if repeats.rank() != 1 || !matches!(repeats.dtype, DType::I32 | DType::I64) {
            return Err(OpError::runtime(format!(
                "repeats_check: expected 1-d int32 or int64 repeats, got {} of shape {:?}",
                repeats.dtype.name(),
                repeats.shape
            )));
        }
        Ok(Meta::single(
            TensorType::new(DType::I64, &[INDEX_VERDICT_LEN as i64]),
            vec![DType::I64],
        ))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![lower_repeats_check(e, a)])
    }
}

/// `[any index out of range, the first such index in row-major order, size, dim, style]`.
fn lower_index_check(e: &mut Emitter, a: &LowerArgs) -> Result<Value, OpError> {
    let layout::IndexBounds {
        size,
        negative_ok,
        dim,
        style,
        ignore,
    } = layout::IndexBounds::decode(&a.params)?;
    let n = e.ty(a.inputs[0]).numel();
    // The size: the param, or the scalar that overrides it (a padded extent's true length).
    let runtime_size = a.scalars.first().map(|&s| {
        let s = e.convert(s, DType::I64);
        e.reshape(s, &[])
    });
    let fixed = match runtime_size {
        Some(size) => {
            let size = e.reshape(size, &[1]);
            let rest = e.dense_i64(TensorType::new(DType::I64, &[2]), &[dim, style]);
            e.concatenate(&[size, rest], 0)
        }
        None => e.dense_i64(TensorType::new(DType::I64, &[3]), &[size, dim, style]),
    };
    if n == 0 {
        let none = e.dense_i64(TensorType::new(DType::I64, &[2]), &[0, 0]);
        return Ok(e.concatenate(&[none, fixed], 0));
    }
    let flat_ty = TensorType::new(DType::I64, &[n]);
    let wide = e.convert(a.inputs[0], DType::I64);
    let flat = e.reshape(wide, &[n]);
    let int = |e: &mut Emitter, v: i64| e.constant(flat_ty.clone(), ScalarValue::Int(v));
    let (lo, hi) = match runtime_size {
        Some(size) => {
            let hi = e.broadcast_in_dim(size, &[n], &[]);
            let lo = if negative_ok { e.neg(hi) } else { int(e, 0) };
            (lo, hi)
        }
        None => (int(e, if negative_ok { -size } else { 0 }), int(e, size)),
    };
    let below = e.compare(Cmp::Lt, flat, lo);
    let above = e.compare(Cmp::Ge, flat, hi);
    let mut bad = e.or(below, above);
    if let Some(ignore) = ignore {
        let skipped = int(e, ignore);
        let counted = e.compare(Cmp::Ne, flat, skipped);
        bad = e.and(bad, counted);
    }
    // The first bad position (n when none), then the index found there.
    let iota = e.iota(flat_ty.clone(), 0);
    let none = int(e, n);
    let positions = e.select(bad, iota, none);
    let first = e.reduce_with(positions, n as f64, &[0], "stablehlo.minimum");
    let first_all = e.broadcast_in_dim(first, &[n], &[]);
    let at_first = e.compare(Cmp::Eq, iota, first_all);
    let zeros = int(e, 0);
    let picked = e.select(at_first, flat, zeros);
    let value = e.reduce_sum(picked, &[0]);
    let n0 = e.scalar_constant(DType::I64, ScalarValue::Int(n));
    let any = e.compare(Cmp::Lt, first, n0);
    let any = e.convert(any, DType::I64);
    let any = e.reshape(any, &[1]);
    let value = e.reshape(value, &[1]);
    Ok(e.concatenate(&[any, value, fixed], 0))
}

/// `[bad, the repeats' sum, total, 0, style]`: PyTorch's order of checks, the sum against the
/// total first (`RepeatsTotal`), then each repeat's sign (`NegativeRepeats`).
fn lower_repeats_check(e: &mut Emitter, a: &LowerArgs) -> Value {
    let repeats = e.convert(a.inputs[0], DType::I64);
    let total = e.convert(a.scalars[0], DType::I64);
    let total = e.reshape(total, &[]);
    let sum = e.reduce_sum(repeats, &[0]);
    let highest = e.scalar_constant(DType::I64, ScalarValue::Int(i64::MAX));
    let lowest = e.reduce(&[repeats], &[highest], &[0], |e, args| {
        vec![e.min(args[0], args[1])]
    })[0];
    let mismatch = e.compare(Cmp::Ne, sum, total);
    let negative = e.compare_const(Cmp::Lt, lowest, 0.0);
    let bad = e.or(mismatch, negative);
    let total_style = e.scalar_constant(
        DType::I64,
        ScalarValue::Int(IndexStyle::RepeatsTotal as i64),
    );
    let sign_style = e.scalar_constant(
        DType::I64,
        ScalarValue::Int(IndexStyle::NegativeRepeats as i64),
    );
    let style = e.select(mismatch, total_style, sign_style);
    let bad = e.convert(bad, DType::I64);
    let zero = e.scalar_constant(DType::I64, ScalarValue::Int(0));
    let parts: Vec<Value> = [bad, sum, total, zero, style]
        .into_iter()
        .map(|v| e.reshape(v, &[1]))
        .collect();
    e.concatenate(&parts, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta;

    #[test]
    fn checks_follow_each_ops_rules() {
        let c = index_checks(OpId::Gather, &[&[5, 3], &[2, 3]], &[-2]);
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].input, c[0].params().as_slice()),
            (1, &[5, 0, 0, 1][..])
        );
        let c = index_checks(OpId::Index, &[&[4, 5, 6], &[2], &[2]], &[0, 2]);
        assert_eq!(c[1].params().as_slice(), &[6, 1, 1, 0]);
        let c = index_checks(OpId::IndexPut, &[&[4, 5], &[1, 5], &[1]], &[2, 0]);
        assert_eq!(c[0].params().as_slice(), &[4, 0, 0, 1]);
        let c = index_checks(OpId::IndexSelect, &[&[4, 5], &[1]], &[1]);
        assert_eq!(c[0].bounds.style, IndexStyle::DataBounds as i64);
        let c = index_checks(OpId::NllLoss, &[&[2, 7], &[2]], &[1, -100]);
        assert_eq!(c[0].params().as_slice(), &[7, 0, 1, 4, -100]);
        assert!(index_checks(OpId::Embedding, &[&[4, 5], &[0]], &[]).is_empty());
        assert!(index_checks(OpId::Add, &[&[4], &[4]], &[]).is_empty());
    }

    #[test]
    fn verdicts_become_pytorchs_errors() {
        assert!(index_check_error(&[0, 0, 5, 0, 0]).is_none());
        let e = index_check_error(&[1, 7, 5, 0, 0]).unwrap();
        assert_eq!(e.kind, ErrorKind::Index);
        assert_eq!(
            e.message,
            "index 7 is out of bounds for dimension 0 with size 5"
        );
        let e = index_check_error(&[1, -6, 5, 1, 1]).unwrap();
        assert_eq!(e.kind, ErrorKind::Runtime);
        assert_eq!(
            e.message,
            "index -6 is out of bounds for dimension 1 with size 5"
        );
        assert_eq!(
            index_check_error(&[1, 9, 5, 0, 2]).unwrap().message,
            "index out of range in self"
        );
        assert_eq!(
            index_check_error(&[1, 9, 5, 1, 4]).unwrap().message,
            "Target 9 is out of bounds."
        );
    }

    #[test]
    fn host_verdicts_follow_the_device_rule() {
        // index_put_ along position 1 of a size-5 dim: -5..5 is in range.
        let wraps = [5, 1, 1, 0];
        assert_eq!(host_index_verdict(&wraps, &[0, -5, 4]).unwrap()[0], 0);
        assert_eq!(
            host_index_verdict(&wraps, &[1, 5, -6]).unwrap(),
            [1, 5, 5, 1, 0]
        );
        // gather: no wrapping, the first bad index in row-major order.
        let gather = [5, 0, 0, 1];
        assert_eq!(
            host_index_verdict(&gather, &[2, -1, 9]).unwrap(),
            [1, -1, 5, 0, 1]
        );
        // nll_loss: the ignored target is never reported.
        let targets = [7, 0, 1, 4, -100];
        assert_eq!(host_index_verdict(&targets, &[-100, 6]).unwrap()[0], 0);
        let e = index_check_error(&host_index_verdict(&targets, &[-100, 7]).unwrap()).unwrap();
        assert_eq!(e.message, "Target 7 is out of bounds.");
        assert_eq!(host_index_verdict(&gather, &[]).unwrap()[0], 0);
        assert!(host_index_verdict(&[5], &[1]).is_err());
    }

    #[test]
    fn the_check_lowers() {
        for (dtype, shape, params) in [
            (DType::I64, vec![2, 3], vec![5, 1, 0, 0]),
            (DType::I32, vec![], vec![5, 0, 0, 2]),
            (DType::I64, vec![0], vec![5, 0, 0, 2]),
            (DType::I64, vec![4], vec![5, 0, 1, 4, -100]),
        ] {
            let t = TensorType::new(dtype, &shape);
            let (text, m) = crate::lower_single(OpId::IndexCheck, &[t], &[], &params).unwrap();
            assert_eq!(m.outputs[0].shape.as_slice(), &[5]);
            assert!(text.contains("stablehlo.concatenate"), "{text}");
        }
        let f = TensorType::new(DType::F32, &[2]);
        assert!(meta(OpId::IndexCheck, &[f], &[], &[5, 0, 0, 0]).is_err());
    }
}
