//! The oracle: strided memory with PyTorch's read and write semantics, element by element.

use crate::eval::HostArray;
use crate::layout::{Dims, Layout};

/// A storage as raw bytes, read and written through layouts one element at a time.
///
/// Reading element `(i0, …, ik)` of a layout takes the `elem_size` bytes at element index
/// `offset + Σ i_j * strides[j]`; writing visits the view's elements in row-major order, so
/// when elements share memory the last one written wins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StridedMemory {
    pub bytes: Vec<u8>,
}

impl StridedMemory {
    pub fn new(bytes: Vec<u8>) -> Self {
        StridedMemory { bytes }
    }

    /// Byte position of every element of `layout`, in row-major order.
    fn element_positions(layout: &Layout) -> Vec<usize> {
        let rank = layout.sizes.len();
        let mut positions = Vec::new();
        if layout.sizes.contains(&0) {
            return positions;
        }
        let mut index = Dims::from_elem(0, rank);
        loop {
            let element: i64 =
                layout.offset + (0..rank).map(|d| index[d] * layout.strides[d]).sum::<i64>();
            positions.push(element as usize * layout.elem_size);
            // Advance the multi-index like an odometer, last dim fastest.
            let mut d = rank;
            loop {
                if d == 0 {
                    return positions;
                }
                d -= 1;
                index[d] += 1;
                if index[d] < layout.sizes[d] {
                    break;
                }
                index[d] = 0;
            }
        }
    }

    /// The view's value; panics if it reaches past the memory.
    pub fn read(&self, layout: &Layout) -> HostArray {
        let mut bytes = Vec::new();
        for position in Self::element_positions(layout) {
            bytes.extend_from_slice(&self.bytes[position..position + layout.elem_size]);
        }
        HostArray::new(layout.elem_size, &layout.sizes, bytes)
    }

    /// Writes `value` (shape = the view's sizes) element by element in row-major order.
    pub fn write(&mut self, layout: &Layout, value: &HostArray) {
        assert_eq!(value.shape, layout.sizes, "value shape must be the view's");
        assert_eq!(value.elem_size, layout.elem_size, "value element size");
        let elem_size = layout.elem_size;
        for (position, element) in Self::element_positions(layout)
            .into_iter()
            .zip(value.bytes.chunks_exact(elem_size))
        {
            self.bytes[position..position + elem_size].copy_from_slice(element);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_strided_elements() {
        let memory = StridedMemory::new((0u8..16).collect());
        let column = memory.read(&Layout::new(1, &[4], &[4], 1));
        assert_eq!(column.bytes, [1, 5, 9, 13]);
        let pairs = memory.read(&Layout::new(2, &[2], &[3], 1));
        assert_eq!(pairs.bytes, [2, 3, 8, 9]);
    }

    #[test]
    fn overlapping_writes_keep_the_last_in_row_major_order() {
        let mut memory = StridedMemory::new(vec![0; 4]);
        // Windows of 2 over 3 elements: (0,1) then (1,2); location 1 is written last by (1,0).
        let windows = Layout::new(1, &[2, 2], &[1, 1], 0);
        memory.write(&windows, &HostArray::new(1, &[2, 2], vec![10, 11, 20, 21]));
        assert_eq!(memory.bytes, [10, 20, 21, 0]);
    }
}
