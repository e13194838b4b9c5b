//! Primitive view ops, shaped like the StableHLO ops they lower to, and chains of them.

use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::layout::{push_all, Dims};

/// One StableHLO-shaped op on a statically shaped array.
///
/// Every op maps one-to-one onto a StableHLO op; attribute names follow StableHLO's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ViewOp {
    /// `stablehlo.reshape` to `shape` (row-major; same element count).
    Reshape { shape: Dims },
    /// `stablehlo.transpose`: result dim `i` is operand dim `permutation[i]`.
    Transpose { permutation: Dims },
    /// `stablehlo.broadcast_in_dim`: operand dim `k` becomes result dim
    /// `broadcast_dimensions[k]` (strictly increasing); an operand dim of size 1 is repeated.
    BroadcastInDim {
        shape: Dims,
        broadcast_dimensions: Dims,
    },
    /// `stablehlo.slice`: result dim `d` has `ceil((limit - start) / stride)` elements taken at
    /// `start_indices[d] + k * strides[d]`.
    Slice {
        start_indices: Dims,
        limit_indices: Dims,
        strides: Dims,
    },
    /// `stablehlo.pad` with a zero padding value and no interior padding.
    Pad {
        edge_padding_low: Dims,
        edge_padding_high: Dims,
    },
    /// `stablehlo.bitcast_convert` between element types of different byte sizes. To a smaller
    /// type it appends a dim of `from / to` elements; to a larger type it removes the last dim,
    /// which must have `to / from` elements. Bytes are read in the platform's order
    /// (little-endian), as PyTorch's `view(dtype)` reads memory.
    Bitcast {
        from_elem_size: usize,
        to_elem_size: usize,
    },
    /// `stablehlo.gather` of single elements from a 1-D operand, then a reshape: element `i`
    /// (row-major) of the result is operand element `indices[i]`. The last resort for layouts
    /// no short chain expresses. Lowers to a constant `tensor<Nx1xi64>` of indices and a gather
    /// with `offset_dims = []`, `collapsed_slice_dims = [0]`, `start_index_map = [0]`,
    /// `index_vector_dim = 1`, `slice_sizes = [1]`, then a reshape to `shape`.
    Gather { indices: Arc<[i64]>, shape: Dims },
}

/// A shape mismatch between an op and its operand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeError(pub String);

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ShapeError {}

fn shape_error(op: &ViewOp, operand: &[i64], why: &str) -> ShapeError {
    ShapeError(format!("{op} cannot apply to shape {operand:?}: {why}"))
}

impl ViewOp {
    /// The result shape of the op on an operand of shape `operand`, checking StableHLO's
    /// constraints.
    pub fn result_shape(&self, operand: &[i64]) -> Result<Dims, ShapeError> {
        let rank = operand.len();
        match self {
            ViewOp::Reshape { shape } => {
                if shape.iter().any(|&d| d < 0) {
                    return Err(shape_error(self, operand, "negative dimension"));
                }
                if shape.iter().product::<i64>() != operand.iter().product::<i64>() {
                    return Err(shape_error(self, operand, "element counts differ"));
                }
                Ok(shape.clone())
            }
            ViewOp::Transpose { permutation } => {
                let mut seen: SmallVec<[bool; 8]> = SmallVec::from_elem(false, rank);
                if permutation.len() != rank {
                    return Err(shape_error(self, operand, "permutation length"));
                }
                let mut shape = Dims::with_capacity(rank);
                for &p in permutation {
                    if p < 0 || p as usize >= rank || seen[p as usize] {
                        return Err(shape_error(self, operand, "not a permutation"));
                    }
                    seen[p as usize] = true;
                    shape.push(operand[p as usize]);
                }
                Ok(shape)
            }
            ViewOp::BroadcastInDim {
                shape,
                broadcast_dimensions,
            } => {
                if broadcast_dimensions.len() != rank {
                    return Err(shape_error(self, operand, "one result dim per operand dim"));
                }
                let mut previous = -1;
                for (&dim, &size) in broadcast_dimensions.iter().zip(operand) {
                    if dim <= previous || dim as usize >= shape.len() {
                        return Err(shape_error(self, operand, "dims not increasing"));
                    }
                    previous = dim;
                    if size != 1 && size != shape[dim as usize] {
                        return Err(shape_error(self, operand, "size neither 1 nor equal"));
                    }
                }
                Ok(shape.clone())
            }
            ViewOp::Slice {
                start_indices,
                limit_indices,
                strides,
            } => {
                if start_indices.len() != rank
                    || limit_indices.len() != rank
                    || strides.len() != rank
                {
                    return Err(shape_error(self, operand, "one bound per dim"));
                }
                let mut shape = Dims::with_capacity(rank);
                for d in 0..rank {
                    let (start, limit, step) = (start_indices[d], limit_indices[d], strides[d]);
                    if start < 0 || start > limit || limit > operand[d] || step < 1 {
                        return Err(shape_error(self, operand, "bounds"));
                    }
                    shape.push((limit - start + step - 1) / step);
                }
                Ok(shape)
            }
            ViewOp::Pad {
                edge_padding_low,
                edge_padding_high,
            } => {
                if edge_padding_low.len() != rank || edge_padding_high.len() != rank {
                    return Err(shape_error(self, operand, "one padding per dim"));
                }
                let mut shape = Dims::with_capacity(rank);
                for d in 0..rank {
                    if edge_padding_low[d] < 0 || edge_padding_high[d] < 0 {
                        return Err(shape_error(self, operand, "negative padding"));
                    }
                    shape.push(operand[d] + edge_padding_low[d] + edge_padding_high[d]);
                }
                Ok(shape)
            }
            ViewOp::Bitcast {
                from_elem_size,
                to_elem_size,
            } => {
                let (from, to) = (*from_elem_size, *to_elem_size);
                if from == 0 || to == 0 {
                    return Err(shape_error(self, operand, "zero-byte element"));
                }
                let mut shape = Dims::from_slice(operand);
                if from > to {
                    if from % to != 0 {
                        return Err(shape_error(self, operand, "sizes do not divide"));
                    }
                    shape.push((from / to) as i64);
                } else if to > from && (to % from != 0 || shape.pop() != Some((to / from) as i64)) {
                    return Err(shape_error(self, operand, "last dim must be the ratio"));
                }
                Ok(shape)
            }
            ViewOp::Gather { indices, shape } => {
                if rank != 1 {
                    return Err(shape_error(self, operand, "operand must be 1-D"));
                }
                if shape.iter().product::<i64>() != indices.len() as i64 {
                    return Err(shape_error(self, operand, "one index per result element"));
                }
                if indices.iter().any(|&i| i < 0 || i >= operand[0]) {
                    return Err(shape_error(self, operand, "index out of range"));
                }
                Ok(shape.clone())
            }
        }
    }

    /// Short name of the StableHLO op this lowers to.
    pub fn name(&self) -> &'static str {
        match self {
            ViewOp::Reshape { .. } => "reshape",
            ViewOp::Transpose { .. } => "transpose",
            ViewOp::BroadcastInDim { .. } => "broadcast_in_dim",
            ViewOp::Slice { .. } => "slice",
            ViewOp::Pad { .. } => "pad",
            ViewOp::Bitcast { .. } => "bitcast_convert",
            ViewOp::Gather { .. } => "gather",
        }
    }
}

fn write_dims(f: &mut fmt::Formatter<'_>, dims: &[i64]) -> fmt::Result {
    f.write_str("[")?;
    for (i, d) in dims.iter().enumerate() {
        if i > 0 {
            f.write_str(",")?;
        }
        write!(f, "{d}")?;
    }
    f.write_str("]")
}

impl fmt::Display for ViewOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ", self.name())?;
        match self {
            ViewOp::Reshape { shape } => write_dims(f, shape),
            ViewOp::Transpose { permutation } => write_dims(f, permutation),
            ViewOp::BroadcastInDim {
                shape,
                broadcast_dimensions,
            } => {
                write_dims(f, shape)?;
                f.write_str(" dims ")?;
                write_dims(f, broadcast_dimensions)
            }
            ViewOp::Slice {
                start_indices,
                limit_indices,
                strides,
            } => {
                f.write_str("[")?;
                for d in 0..start_indices.len() {
                    if d > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{}:{}", start_indices[d], limit_indices[d])?;
                    if strides[d] != 1 {
                        write!(f, ":{}", strides[d])?;
                    }
                }
                f.write_str("]")
            }
            ViewOp::Pad {
                edge_padding_low,
                edge_padding_high,
            } => {
                f.write_str("low ")?;
                write_dims(f, edge_padding_low)?;
                f.write_str(" high ")?;
                write_dims(f, edge_padding_high)
            }
            ViewOp::Bitcast {
                from_elem_size,
                to_elem_size,
            } => write!(f, "{from_elem_size}B->{to_elem_size}B"),
            ViewOp::Gather { indices, shape } => {
                write!(f, "{} indices to ", indices.len())?;
                write_dims(f, shape)
            }
        }
    }
}

/// Ops applied in order to a value of shape `input`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Chain {
    /// Shape of the value the chain starts from.
    pub input: Dims,
    pub ops: SmallVec<[ViewOp; 3]>,
}

impl Chain {
    /// The identity chain on a value of shape `input`.
    #[inline]
    pub fn identity(input: &[i64]) -> Self {
        Chain {
            input: Dims::from_slice(input),
            ops: SmallVec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Whether the chain falls back to an explicit gather.
    pub fn has_gather(&self) -> bool {
        self.ops
            .iter()
            .any(|op| matches!(op, ViewOp::Gather { .. }))
    }

    /// Shape of the chain's result, checking every op against its operand.
    pub fn output_shape(&self) -> Result<Dims, ShapeError> {
        let mut shape = self.input.clone();
        for op in &self.ops {
            shape = op.result_shape(&shape)?;
        }
        Ok(shape)
    }

    /// The StableHLO op names, in order (handy for asserting on a chain's form).
    pub fn op_names(&self) -> Vec<&'static str> {
        self.ops.iter().map(ViewOp::name).collect()
    }
}

impl fmt::Display for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_dims(f, &self.input)?;
        for op in &self.ops {
            write!(f, " | {op}")?;
        }
        Ok(())
    }
}

/// Builds a chain while tracking shapes, dropping no-op steps and fusing neighbours, so that
/// the decomposition code can emit the general form and still get short chains.
///
/// It appends to a chain owned by the caller, so that the (large, inline) chain is built where
/// it will be returned instead of being moved around.
pub(crate) struct ChainBuilder<'a> {
    chain: &'a mut Chain,
    /// Shape of the chain's result so far.
    shape: Dims,
}

fn bitcast_shape(operand: &[i64], from_elem_size: usize, to_elem_size: usize) -> Dims {
    let mut shape = Dims::from_slice(operand);
    if from_elem_size > to_elem_size {
        shape.push((from_elem_size / to_elem_size) as i64);
    } else {
        shape.pop();
    }
    shape
}

impl<'a> ChainBuilder<'a> {
    /// Appends to `chain`, which must be empty.
    pub(crate) fn new(chain: &'a mut Chain) -> Self {
        debug_assert!(chain.ops.is_empty());
        let shape = chain.input.clone();
        ChainBuilder { chain, shape }
    }

    #[inline]
    pub(crate) fn shape(&self) -> &Dims {
        &self.shape
    }

    /// The operand shape of the last op (replayed: needed only when fusing ops, which is rare).
    fn shape_before_last(&self) -> Dims {
        let mut shape = self.chain.input.clone();
        for op in &self.chain.ops[..self.chain.ops.len() - 1] {
            shape = op
                .result_shape(&shape)
                .expect("builder chains are well shaped");
        }
        shape
    }

    /// Appends `op`, whose result shape the caller already knows (checked in debug builds).
    fn push_raw(&mut self, op: ViewOp, result: Dims) {
        debug_assert_eq!(
            op.result_shape(self.shape()).as_ref(),
            Ok(&result),
            "views built an ill-shaped chain"
        );
        self.chain.ops.push(op);
        self.shape = result;
    }

    /// Whether the last two ops are a reshape of a 1-D array followed by a bitcast.
    fn grouped_from_flat(&self) -> bool {
        let ops = &self.chain.ops;
        let n = ops.len();
        if n < 2 || !matches!(ops[n - 2], ViewOp::Reshape { .. }) {
            return false;
        }
        let operand_rank = match n {
            2 => self.chain.input.len(),
            _ => match &ops[n - 3] {
                ViewOp::Reshape { shape } | ViewOp::BroadcastInDim { shape, .. } => shape.len(),
                ViewOp::Transpose { permutation } => permutation.len(),
                ViewOp::Slice { start_indices, .. } => start_indices.len(),
                ViewOp::Pad {
                    edge_padding_low, ..
                } => edge_padding_low.len(),
                ViewOp::Gather { shape, .. } => shape.len(),
                ViewOp::Bitcast { .. } => return false,
            },
        };
        operand_rank == 1
    }

    fn pop(&mut self) -> ViewOp {
        self.shape = self.shape_before_last();
        self.chain.ops.pop().expect("pop on an empty chain")
    }

    fn push_bitcast(&mut self, from_elem_size: usize, to_elem_size: usize) {
        let result = bitcast_shape(self.shape(), from_elem_size, to_elem_size);
        self.push_raw(
            ViewOp::Bitcast {
                from_elem_size,
                to_elem_size,
            },
            result,
        );
    }

    pub(crate) fn reshape(&mut self, shape: &[i64]) {
        if self.shape().as_slice() == shape {
            return;
        }
        match self.chain.ops.last() {
            Some(ViewOp::Reshape { .. }) => {
                self.pop();
                self.reshape(shape);
            }
            Some(&ViewOp::Bitcast {
                from_elem_size,
                to_elem_size,
            }) if to_elem_size > from_elem_size
                && matches!(
                    self.chain.ops.iter().rev().nth(1),
                    Some(ViewOp::Reshape { .. })
                ) =>
            {
                // reshape(bitcast(reshape(x, [n, r])), s) == bitcast(reshape(x, s ++ [r])).
                let ratio = (to_elem_size / from_elem_size) as i64;
                self.pop();
                let mut grouped = Dims::from_slice(shape);
                grouped.push(ratio);
                self.reshape(&grouped);
                self.push_bitcast(from_elem_size, to_elem_size);
            }
            _ => {
                let shape = Dims::from_slice(shape);
                self.push_raw(
                    ViewOp::Reshape {
                        shape: shape.clone(),
                    },
                    shape,
                )
            }
        }
    }

    pub(crate) fn bitcast(&mut self, from_elem_size: usize, to_elem_size: usize) {
        if from_elem_size == to_elem_size {
            return;
        }
        if to_elem_size < from_elem_size
            && matches!(self.chain.ops.last(), Some(ViewOp::Reshape { .. }))
        {
            // bitcast(reshape(x, s)) == reshape(bitcast(x), s ++ [r]) when splitting elements.
            let reshaped = self.shape().clone();
            self.pop();
            self.push_bitcast(from_elem_size, to_elem_size);
            let mut split = reshaped;
            split.push((from_elem_size / to_elem_size) as i64);
            self.reshape(&split);
            return;
        }
        self.push_bitcast(from_elem_size, to_elem_size);
    }

    pub(crate) fn slice(&mut self, start: &[i64], limit: &[i64], step: &[i64]) {
        let shape = self.shape();
        let whole = (0..shape.len())
            .all(|d| start[d] == 0 && limit[d] == shape[d] && (step[d] == 1 || shape[d] <= 1));
        if whole {
            return;
        }
        match self.chain.ops.last() {
            Some(ViewOp::Slice {
                start_indices,
                limit_indices: _,
                strides,
            }) => {
                // A slice of a slice is one slice.
                let (outer_start, outer_step) = (start_indices.clone(), strides.clone());
                self.pop();
                let rank = start.len();
                let (mut first, mut last, mut stride) = (Dims::new(), Dims::new(), Dims::new());
                for d in 0..rank {
                    let count = (limit[d] - start[d] + step[d] - 1) / step[d];
                    let begin = outer_start[d] + start[d] * outer_step[d];
                    let (begin, step) = match count {
                        0 => (0, 1),
                        1 => (begin, 1),
                        _ => (begin, outer_step[d] * step[d]),
                    };
                    first.push(begin);
                    last.push(if count == 0 {
                        0
                    } else {
                        begin + (count - 1) * step + 1
                    });
                    stride.push(step);
                }
                self.slice(&first, &last, &stride);
                return;
            }
            Some(&ViewOp::Bitcast {
                from_elem_size,
                to_elem_size,
            }) if to_elem_size > from_elem_size
                && start.len() == 1
                && step[0] == 1
                && self.grouped_from_flat() =>
            {
                // Slicing whole elements of a 1-D array grouped then bitcast: slice the bytes
                // before grouping, so the slice can merge with an earlier one.
                let ratio = (to_elem_size / from_elem_size) as i64;
                self.pop();
                self.pop();
                self.slice(&[start[0] * ratio], &[limit[0] * ratio], &[1]);
                self.reshape(&[limit[0] - start[0], ratio]);
                self.push_bitcast(from_elem_size, to_elem_size);
                return;
            }
            _ => {}
        }
        let result =
            push_all((0..start.len()).map(|d| (limit[d] - start[d] + step[d] - 1) / step[d]));
        self.push_raw(
            ViewOp::Slice {
                start_indices: Dims::from_slice(start),
                limit_indices: Dims::from_slice(limit),
                strides: Dims::from_slice(step),
            },
            result,
        );
    }

    pub(crate) fn pad(&mut self, low: &[i64], high: &[i64]) {
        if low.iter().chain(high).all(|&p| p == 0) {
            return;
        }
        let result = self
            .shape()
            .iter()
            .zip(low.iter().zip(high))
            .map(|(&size, (&l, &h))| size + l + h)
            .collect();
        self.push_raw(
            ViewOp::Pad {
                edge_padding_low: Dims::from_slice(low),
                edge_padding_high: Dims::from_slice(high),
            },
            result,
        );
    }

    pub(crate) fn transpose(&mut self, permutation: &[i64]) {
        let shape = self.shape();
        let result: Dims = push_all(permutation.iter().map(|&p| shape[p as usize]));
        // Moving only size-1 dims around is a reshape; an identity is nothing.
        let mut last_moved = -1;
        let mut keeps_order = true;
        for &p in permutation {
            if shape[p as usize] != 1 {
                if p < last_moved {
                    keeps_order = false;
                    break;
                }
                last_moved = p;
            }
        }
        if keeps_order {
            self.reshape(&result);
            return;
        }
        self.push_raw(
            ViewOp::Transpose {
                permutation: Dims::from_slice(permutation),
            },
            result,
        );
    }

    pub(crate) fn broadcast_in_dim(&mut self, shape: &[i64], broadcast_dimensions: &[i64]) {
        let operand = self.shape();
        let mut expands = false;
        let mut mapped = 0usize;
        for (d, &size) in shape.iter().enumerate() {
            if mapped < broadcast_dimensions.len() && broadcast_dimensions[mapped] == d as i64 {
                expands |= operand[mapped] != size;
                mapped += 1;
            } else {
                expands |= size != 1;
            }
        }
        if !expands {
            self.reshape(shape);
            return;
        }
        let shape = Dims::from_slice(shape);
        self.push_raw(
            ViewOp::BroadcastInDim {
                shape: shape.clone(),
                broadcast_dimensions: Dims::from_slice(broadcast_dimensions),
            },
            shape,
        );
    }

    pub(crate) fn gather(&mut self, indices: Vec<i64>, shape: &[i64]) {
        let shape = Dims::from_slice(shape);
        self.push_raw(
            ViewOp::Gather {
                indices: indices.into(),
                shape: shape.clone(),
            },
            shape,
        );
    }
}
