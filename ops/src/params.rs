//! Encoding and typed decoding of an op's static params (`&[i64]`).

use crate::dtype::DType;
use crate::error::OpError;
use crate::op_id::OpId;

/// Encode an f64 static value as a param (by bits, so NaN and -0.0 survive).
pub fn f64_param(x: f64) -> i64 {
    x.to_bits() as i64
}

/// Encode an optional dtype as a param (-1 = none).
pub fn dtype_param(dtype: Option<DType>) -> i64 {
    dtype.map_or(-1, |d| d.code() as i64)
}

/// Rounding modes of `div`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundingMode {
    True = 0,
    Trunc = 1,
    Floor = 2,
}

/// Reductions of `nll_loss`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    None = 0,
    Mean = 1,
    Sum = 2,
}

/// Where an optional operand of `where`/`clamp` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandKind {
    Absent = 0,
    Tensor = 1,
    Scalar = 2,
}

/// A typed reader over one op's params; errors name the op and its documented layout.
#[derive(Clone, Copy)]
pub struct Params<'a> {
    op: OpId,
    values: &'a [i64],
}

impl<'a> Params<'a> {
    pub fn new(op: OpId, values: &'a [i64]) -> Self {
        Params { op, values }
    }

    pub fn op(&self) -> OpId {
        self.op
    }

    /// The raw values; read them by name through the op's layout struct instead.
    pub fn values(&self) -> &'a [i64] {
        self.values
    }

    pub fn invalid(&self, what: &str) -> OpError {
        OpError::runtime(format!(
            "{}: invalid static params {:?} ({what}); expected the layout {}",
            self.op.name(),
            self.values,
            self.op.param_layout().describe()
        ))
    }
}

/// PyTorch's dim wrapping: `dim` in `[-rank, rank)` (a 0-d tensor accepts -1 and 0).
pub fn wrap_dim(dim: i64, rank: usize) -> Result<usize, OpError> {
    let r = rank.max(1) as i64;
    if dim < -r || dim >= r {
        return Err(OpError::index(format!(
            "Dimension out of range (expected to be in range of [{}, {}], but got {dim})",
            -r,
            r - 1
        )));
    }
    Ok(if dim < 0 {
        (dim + r) as usize
    } else {
        dim as usize
    })
}

/// Wrap a dim list; an empty list means every dim. Repeated dims are an error, as in PyTorch.
pub fn wrap_dims(dims: &[i64], rank: usize) -> Result<Vec<usize>, OpError> {
    if dims.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut seen = vec![false; rank.max(1)];
    let mut out = Vec::with_capacity(dims.len());
    for &d in dims {
        let w = wrap_dim(d, rank)?;
        if seen[w] {
            return Err(OpError::runtime(format!(
                "dim {w} appears multiple times in the list of dims"
            )));
        }
        seen[w] = true;
        if w < rank {
            out.push(w);
        }
    }
    out.sort_unstable();
    Ok(out)
}
