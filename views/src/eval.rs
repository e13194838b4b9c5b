//! A host interpreter for chains and write programs on byte arrays, for tests and debugging.

use crate::invert::{WriteProgram, WriteStep};
use crate::layout::{contiguous_strides, Dims};
use crate::ops::{Chain, ShapeError, ViewOp};

/// A row-major array of `elem_size`-byte elements, stored as little-endian bytes so that a
/// bitcast only changes the shape, as on the devices the chains run on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostArray {
    pub elem_size: usize,
    pub shape: Dims,
    pub bytes: Vec<u8>,
}

impl HostArray {
    /// An array over `bytes`; panics unless they hold exactly the shape's elements.
    pub fn new(elem_size: usize, shape: &[i64], bytes: Vec<u8>) -> Self {
        let numel: i64 = shape.iter().product();
        assert_eq!(
            bytes.len() as i64,
            numel * elem_size as i64,
            "byte count does not match shape {shape:?} of {elem_size}-byte elements"
        );
        HostArray {
            elem_size,
            shape: Dims::from_slice(shape),
            bytes,
        }
    }

    /// An array whose elements are the low `elem_size` bytes of `words` (`elem_size` ≤ 8).
    pub fn from_words(elem_size: usize, shape: &[i64], words: &[u64]) -> Self {
        assert!(elem_size <= 8, "words hold at most 8 bytes");
        let bytes = words
            .iter()
            .flat_map(|w| w.to_le_bytes().into_iter().take(elem_size))
            .collect();
        HostArray::new(elem_size, shape, bytes)
    }

    /// The elements as words (`elem_size` ≤ 8).
    pub fn words(&self) -> Vec<u64> {
        assert!(self.elem_size <= 8, "words hold at most 8 bytes");
        self.bytes
            .chunks_exact(self.elem_size)
            .map(|chunk| {
                let mut word = [0u8; 8];
                word[..chunk.len()].copy_from_slice(chunk);
                u64::from_le_bytes(word)
            })
            .collect()
    }

    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
    }

    fn element(&self, index: i64) -> &[u8] {
        let start = index as usize * self.elem_size;
        &self.bytes[start..start + self.elem_size]
    }
}

/// Visits the row-major multi-indices of `shape` as flat offsets `base + Σ i_d * strides[d]`.
fn for_each_offset(shape: &[i64], strides: &[i64], base: i64, mut visit: impl FnMut(i64)) {
    if shape.contains(&0) {
        return;
    }
    let mut counter = Dims::from_elem(0, shape.len());
    let mut offset = base;
    loop {
        visit(offset);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            counter[d] += 1;
            offset += strides[d];
            if counter[d] < shape[d] {
                break;
            }
            offset -= strides[d] * shape[d];
            counter[d] = 0;
        }
    }
}

/// Reads `shape` elements of `source` at strided offsets.
fn read_strided(source: &HostArray, shape: Dims, strides: &[i64], base: i64) -> HostArray {
    let mut bytes = Vec::with_capacity(shape.iter().product::<i64>() as usize * source.elem_size);
    for_each_offset(&shape, strides, base, |offset| {
        bytes.extend_from_slice(source.element(offset))
    });
    HostArray {
        elem_size: source.elem_size,
        shape,
        bytes,
    }
}

/// Writes `values` (row-major, shape `shape`) into `target` at strided offsets.
fn write_strided(target: &mut HostArray, values: &HostArray, strides: &[i64], base: i64) {
    let elem_size = target.elem_size;
    let mut source = values.bytes.chunks_exact(elem_size);
    for_each_offset(&values.shape, strides, base, |offset| {
        let start = offset as usize * elem_size;
        let value = source.next().expect("as many values as offsets");
        target.bytes[start..start + elem_size].copy_from_slice(value);
    });
}

/// Applies one op to `operand`.
pub fn eval_op(op: &ViewOp, operand: &HostArray) -> Result<HostArray, ShapeError> {
    let shape = op.result_shape(&operand.shape)?;
    let strides = contiguous_strides(&operand.shape);
    Ok(match op {
        ViewOp::Reshape { .. } => HostArray {
            elem_size: operand.elem_size,
            shape,
            bytes: operand.bytes.clone(),
        },
        ViewOp::Transpose { permutation } => {
            let moved: Dims = permutation.iter().map(|&p| strides[p as usize]).collect();
            read_strided(operand, shape, &moved, 0)
        }
        ViewOp::BroadcastInDim {
            broadcast_dimensions,
            ..
        } => {
            let mut spread = Dims::from_elem(0, shape.len());
            for (k, &d) in broadcast_dimensions.iter().enumerate() {
                if operand.shape[k] != 1 {
                    spread[d as usize] = strides[k];
                }
            }
            read_strided(operand, shape, &spread, 0)
        }
        ViewOp::Slice {
            start_indices,
            strides: steps,
            ..
        } => {
            let stepped: Dims = strides.iter().zip(steps).map(|(s, g)| s * g).collect();
            let base = start_indices.iter().zip(&strides).map(|(a, s)| a * s).sum();
            read_strided(operand, shape, &stepped, base)
        }
        ViewOp::Pad {
            edge_padding_low, ..
        } => {
            let numel: i64 = shape.iter().product();
            let mut padded = HostArray {
                elem_size: operand.elem_size,
                bytes: vec![0; numel as usize * operand.elem_size],
                shape,
            };
            let out_strides = contiguous_strides(&padded.shape);
            let base = edge_padding_low
                .iter()
                .zip(&out_strides)
                .map(|(l, s)| l * s)
                .sum();
            write_strided(&mut padded, operand, &out_strides, base);
            padded
        }
        ViewOp::Bitcast { to_elem_size, .. } => HostArray {
            elem_size: *to_elem_size,
            shape,
            bytes: operand.bytes.clone(),
        },
        ViewOp::Gather { indices, .. } => {
            let mut bytes = Vec::with_capacity(indices.len() * operand.elem_size);
            for &index in indices.iter() {
                bytes.extend_from_slice(operand.element(index));
            }
            HostArray {
                elem_size: operand.elem_size,
                shape,
                bytes,
            }
        }
    })
}

/// Applies a chain to `input`, whose shape must be the chain's input shape.
pub fn eval_chain(chain: &Chain, input: &HostArray) -> Result<HostArray, ShapeError> {
    if input.shape != chain.input {
        return Err(ShapeError(format!(
            "chain expects shape {:?}, got {:?}",
            chain.input.as_slice(),
            input.shape.as_slice()
        )));
    }
    let mut value = input.clone();
    for op in &chain.ops {
        value = eval_op(op, &value)?;
    }
    Ok(value)
}

/// Runs a write program: the new base after writing `update` through the view.
pub fn eval_write(
    program: &WriteProgram,
    base: &HostArray,
    update: &HostArray,
) -> Result<HostArray, ShapeError> {
    let mut target = eval_chain(&program.base_ops, base)?;
    if program.step == WriteStep::Keep {
        return eval_chain(&program.restore_ops, &target);
    }
    let patch = eval_chain(&program.update_ops, update)?;
    if patch.elem_size != target.elem_size {
        return Err(ShapeError(format!(
            "patch of {}-byte elements written into {}-byte elements",
            patch.elem_size, target.elem_size
        )));
    }
    match &program.step {
        WriteStep::Keep => {}
        WriteStep::Replace => {
            if patch.shape != target.shape {
                return Err(ShapeError("replacing patch differs in shape".into()));
            }
            target = patch;
        }
        WriteStep::UpdateSlice { start_indices } => {
            let fits = patch.shape.len() == target.shape.len()
                && start_indices.len() == target.shape.len()
                && (0..target.shape.len()).all(|d| {
                    start_indices[d] >= 0 && start_indices[d] + patch.shape[d] <= target.shape[d]
                });
            if !fits {
                return Err(ShapeError(format!(
                    "patch {:?} at {:?} does not fit target {:?}",
                    patch.shape.as_slice(),
                    start_indices.as_slice(),
                    target.shape.as_slice()
                )));
            }
            let strides = contiguous_strides(&target.shape);
            let base = start_indices.iter().zip(&strides).map(|(a, s)| a * s).sum();
            write_strided(&mut target, &patch, &strides, base);
        }
        WriteStep::Scatter { indices } => {
            let valid = target.shape.len() == 1
                && patch.shape.as_slice() == [indices.len() as i64]
                && indices.iter().all(|&i| i >= 0 && i < target.shape[0]);
            if !valid {
                return Err(ShapeError("scatter indices do not fit".into()));
            }
            let elem_size = target.elem_size;
            for (&index, value) in indices.iter().zip(patch.bytes.chunks_exact(elem_size)) {
                let start = index as usize * elem_size;
                target.bytes[start..start + elem_size].copy_from_slice(value);
            }
        }
    }
    eval_chain(&program.restore_ops, &target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(array: &HostArray) -> Vec<u64> {
        array.words()
    }

    fn iota(elem_size: usize, shape: &[i64]) -> HostArray {
        let count = shape.iter().product::<i64>() as u64;
        HostArray::from_words(elem_size, shape, &(0..count).collect::<Vec<_>>())
    }

    fn apply(op: ViewOp, input: &HostArray) -> HostArray {
        eval_op(&op, input).unwrap()
    }

    #[test]
    fn bitcast_splits_and_joins_little_endian() {
        let wide = HostArray::from_words(4, &[2], &[0x0403_0201, 0x0807_0605]);
        let narrow = apply(
            ViewOp::Bitcast {
                from_elem_size: 4,
                to_elem_size: 1,
            },
            &wide,
        );
        assert_eq!(narrow.shape.as_slice(), [2, 4]);
        assert_eq!(words(&narrow), [1, 2, 3, 4, 5, 6, 7, 8]);
        let back = apply(
            ViewOp::Bitcast {
                from_elem_size: 1,
                to_elem_size: 4,
            },
            &narrow,
        );
        assert_eq!(back, wide);
    }

    #[test]
    fn transpose_slice_broadcast_pad_gather() {
        let x = iota(4, &[2, 3]);
        let t = apply(
            ViewOp::Transpose {
                permutation: Dims::from_slice(&[1, 0]),
            },
            &x,
        );
        assert_eq!(words(&t), [0, 3, 1, 4, 2, 5]);
        let s = apply(
            ViewOp::Slice {
                start_indices: Dims::from_slice(&[0, 1]),
                limit_indices: Dims::from_slice(&[2, 3]),
                strides: Dims::from_slice(&[1, 2]),
            },
            &x,
        );
        assert_eq!((s.shape.as_slice(), words(&s)), (&[2, 1][..], vec![1, 4]));
        let b = apply(
            ViewOp::BroadcastInDim {
                shape: Dims::from_slice(&[2, 2, 1]),
                broadcast_dimensions: Dims::from_slice(&[0, 2]),
            },
            &s,
        );
        assert_eq!(words(&b), [1, 1, 4, 4]);
        let p = apply(
            ViewOp::Pad {
                edge_padding_low: Dims::from_slice(&[1, 0]),
                edge_padding_high: Dims::from_slice(&[0, 1]),
            },
            &s,
        );
        assert_eq!(
            (p.shape.as_slice(), words(&p)),
            (&[3, 2][..], vec![0, 0, 1, 0, 4, 0])
        );
        let flat = iota(4, &[6]);
        let g = apply(
            ViewOp::Gather {
                indices: vec![5, 0, 5].into(),
                shape: Dims::from_slice(&[3]),
            },
            &flat,
        );
        assert_eq!(words(&g), [5, 0, 5]);
    }

    #[test]
    fn ill_shaped_ops_are_errors() {
        let x = iota(4, &[2, 3]);
        let reshape = ViewOp::Reshape {
            shape: Dims::from_slice(&[4]),
        };
        assert!(eval_op(&reshape, &x).is_err());
        let slice = ViewOp::Slice {
            start_indices: Dims::from_slice(&[0, 0]),
            limit_indices: Dims::from_slice(&[3, 3]),
            strides: Dims::from_slice(&[1, 1]),
        };
        assert!(eval_op(&slice, &x).is_err());
        let gather = ViewOp::Gather {
            indices: vec![0].into(),
            shape: Dims::from_slice(&[1]),
        };
        assert!(eval_op(&gather, &x).is_err());
    }

    #[test]
    fn update_slice_and_scatter_write_the_patch() {
        let base = iota(4, &[6]);
        let program = WriteProgram {
            base_ops: Chain {
                input: Dims::from_slice(&[6]),
                ops: [ViewOp::Reshape {
                    shape: Dims::from_slice(&[2, 3]),
                }]
                .into_iter()
                .collect(),
            },
            update_ops: Chain::identity(&[2, 1]),
            step: WriteStep::UpdateSlice {
                start_indices: Dims::from_slice(&[0, 2]),
            },
            restore_ops: Chain {
                input: Dims::from_slice(&[2, 3]),
                ops: [ViewOp::Reshape {
                    shape: Dims::from_slice(&[6]),
                }]
                .into_iter()
                .collect(),
            },
        };
        let update = HostArray::from_words(4, &[2, 1], &[70, 80]);
        assert_eq!(
            words(&eval_write(&program, &base, &update).unwrap()),
            [0, 1, 70, 3, 4, 80]
        );

        let scatter = WriteProgram {
            base_ops: Chain::identity(&[6]),
            update_ops: Chain::identity(&[2]),
            step: WriteStep::Scatter {
                indices: vec![4, 1].into(),
            },
            restore_ops: Chain::identity(&[6]),
        };
        let update = HostArray::from_words(4, &[2], &[40, 10]);
        assert_eq!(
            words(&eval_write(&scatter, &base, &update).unwrap()),
            [0, 10, 2, 3, 40, 5]
        );
    }
}
