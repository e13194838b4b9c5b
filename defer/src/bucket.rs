//! Bounded shapes' bookkeeping: storages whose device value is padded to a bucket along one
//! growing extent, the translation of PyTorch's views of them into views of the padded value,
//! and the detection of sequences that grow by appends.
//!
//! PyTorch sees a padded storage as the contiguous tensor of its true sizes; only the engine
//! knows the value is larger. A view PyTorch takes of it (a transpose, a reshape that merges
//! other dimensions) is the same view of the padded value with the padded dimensions at the
//! bucket's size; any other view (a slice of the extent, a reshape across it) is not, and the
//! engine cuts the padding off first (`Graph::unpad`).

use ops::padding::PaddedDims;
use ops::{DType, Shape};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

/// A storage's value is padded: PyTorch's contiguous tensor of `sizes` is the first
/// `sizes[d]` elements along each `d` in `dims` of a value whose `dims` hold `bucket`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Padding {
    pub sizes: Shape,
    pub dims: PaddedDims,
    pub bucket: i64,
}

/// A view of a padded value: its sizes and strides over the padded value's elements (offset
/// 0), and which of its dimensions are padded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaddedView {
    pub sizes: Shape,
    pub strides: SmallVec<[i64; 6]>,
    pub dims: PaddedDims,
}

fn contiguous_strides(sizes: &[i64]) -> SmallVec<[i64; 6]> {
    let mut strides: SmallVec<[i64; 6]> = SmallVec::from_elem(1, sizes.len());
    for i in (0..sizes.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * sizes[i + 1].max(1);
    }
    strides
}

impl Padding {
    /// The true length of the extent.
    pub fn true_len(&self) -> i64 {
        self.sizes[self.dims[0]]
    }

    /// The padded value's sizes.
    pub fn padded_sizes(&self) -> Shape {
        let mut sizes = self.sizes.clone();
        for &d in &self.dims {
            sizes[d] = self.bucket;
        }
        sizes
    }

    /// The padded value's element count.
    pub fn padded_numel(&self) -> i64 {
        self.padded_sizes().iter().product()
    }

    /// The view of the padded value that the view `(sizes, strides, offset)` of the true
    /// tensor is, when the view reads every element of the true tensor, each padded dimension
    /// as one dimension of its own (permuted, broadcast or with unit dimensions added);
    /// `None` otherwise.
    pub fn translate(&self, sizes: &[i64], strides: &[i64], offset: i64) -> Option<PaddedView> {
        if offset != 0 || sizes.len() != strides.len() || self.true_len() < 2 {
            return None;
        }
        let true_strides = contiguous_strides(&self.sizes);
        let padded_strides = contiguous_strides(&self.padded_sizes());
        // The true tensor's dimensions that take part: every one larger than one.
        let parts: SmallVec<[usize; 6]> = (0..self.sizes.len())
            .filter(|&j| self.sizes[j] != 1)
            .collect();
        // The view's moving dimensions, outermost (largest stride) first.
        let mut moving: SmallVec<[usize; 6]> = (0..sizes.len())
            .filter(|&i| sizes[i] != 1 && strides[i] != 0)
            .collect();
        moving.sort_by_key(|&i| std::cmp::Reverse(strides[i]));
        let mut next = 0;
        let mut out_sizes = Shape::from_slice(sizes);
        let mut out_strides: SmallVec<[i64; 6]> = SmallVec::from_elem(0, sizes.len());
        let mut dims = PaddedDims::new();
        for &i in &moving {
            let start = next;
            let mut product = 1;
            while product < sizes[i] {
                let &j = parts.get(next)?;
                product *= self.sizes[j];
                next += 1;
            }
            let group = &parts[start..next];
            let last = *group.last()?;
            if product != sizes[i] || strides[i] != true_strides[last] {
                return None;
            }
            let padded = group.iter().any(|j| self.dims.contains(j));
            if padded {
                if group.len() > 1 {
                    return None;
                }
                out_sizes[i] = self.bucket;
                dims.push(i);
            }
            out_strides[i] = padded_strides[last];
        }
        (next == parts.len()).then_some(PaddedView {
            sizes: out_sizes,
            strides: out_strides,
            dims,
        })
    }
}

/// How many append sites are remembered before the table starts afresh.
const SITES_KEPT: usize = 256;
/// Result lengths remembered per site.
const LENGTHS_KEPT: usize = 4;

/// Appends seen (`cat([a, b], dim)` of exact values): per dtype, dimension and the sizes
/// around it, the latest result lengths. An append whose first input is as long as a recent
/// result continues a sequence that grows: its result is padded from then on.
#[derive(Debug, Default)]
pub struct GrowthSites {
    sites: FxHashMap<(DType, usize, Shape), SmallVec<[i64; LENGTHS_KEPT]>>,
}

impl GrowthSites {
    /// Records the append of `b_len` elements to `a` (of `a_sizes`) along `dim`; returns
    /// whether it continues a sequence seen growing.
    pub fn note_append(&mut self, dtype: DType, a_sizes: &[i64], dim: usize, b_len: i64) -> bool {
        let mut around = Shape::from_slice(a_sizes);
        let a_len = std::mem::replace(&mut around[dim], -1);
        if self.sites.len() >= SITES_KEPT {
            self.sites.clear();
        }
        let lengths = self.sites.entry((dtype, dim, around)).or_default();
        let continues = lengths.contains(&a_len);
        // A set of lengths: the layers of one model append to equal sequences at one site.
        if !lengths.contains(&(a_len + b_len)) {
            if lengths.len() == LENGTHS_KEPT {
                lengths.remove(0);
            }
            lengths.push(a_len + b_len);
        }
        continues
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallvec::smallvec;

    /// A `[1, 2, 9, 4]` key cache padded to 16 along its length.
    fn cache() -> Padding {
        Padding {
            sizes: Shape::from_slice(&[1, 2, 9, 4]),
            dims: smallvec![2],
            bucket: 16,
        }
    }

    #[test]
    fn the_whole_tensor_is_the_whole_padded_value() {
        let v = cache()
            .translate(&[1, 2, 9, 4], &[72, 36, 4, 1], 0)
            .unwrap();
        assert_eq!(v.sizes.as_slice(), &[1, 2, 16, 4]);
        assert_eq!(&v.strides[1..], &[64, 4, 1]);
        assert_eq!(v.dims.as_slice(), &[2]);
        assert_eq!(cache().padded_numel(), 128);
    }

    #[test]
    fn a_transpose_moves_the_padded_dimension() {
        // k.transpose(-1, -2): [1, 2, 4, 9] with strides (72, 36, 1, 4).
        let v = cache()
            .translate(&[1, 2, 4, 9], &[72, 36, 1, 4], 0)
            .unwrap();
        assert_eq!(v.sizes.as_slice(), &[1, 2, 4, 16]);
        assert_eq!(&v.strides[1..], &[64, 1, 4]);
        assert_eq!(v.dims.as_slice(), &[3]);
    }

    #[test]
    fn reshapes_of_other_dimensions_keep_the_padding() {
        // [1, 2, 9, 4] read as [2, 9, 4] (bmm's batch), and split again.
        let v = cache().translate(&[2, 9, 4], &[36, 4, 1], 0).unwrap();
        assert_eq!(v.sizes.as_slice(), &[2, 16, 4]);
        assert_eq!(v.strides.as_slice(), &[64, 4, 1]);
        assert_eq!(v.dims.as_slice(), &[1]);
        let scores = Padding {
            sizes: Shape::from_slice(&[2, 1, 9]),
            dims: smallvec![2],
            bucket: 16,
        };
        let v = scores.translate(&[1, 2, 1, 9], &[18, 9, 9, 1], 0).unwrap();
        assert_eq!(v.sizes.as_slice(), &[1, 2, 1, 16]);
        assert_eq!(v.dims.as_slice(), &[3]);
        // Two heads merged into one dimension of 8 with the head dim: still exact.
        let v = cache().translate(&[1, 2, 9, 4], &[0, 36, 4, 1], 0).unwrap();
        assert_eq!(v.dims.as_slice(), &[2]);
    }

    #[test]
    fn views_across_or_into_the_extent_are_refused() {
        let c = cache();
        // The last position (a slice of the extent), at an offset.
        assert!(c.translate(&[1, 2, 1, 4], &[72, 36, 4, 1], 32).is_none());
        // The first five positions.
        assert!(c.translate(&[1, 2, 5, 4], &[72, 36, 4, 1], 0).is_none());
        // The extent merged with the head dim.
        assert!(c.translate(&[1, 2, 36], &[72, 36, 1], 0).is_none());
        // A flat view.
        assert!(c.translate(&[72], &[1], 0).is_none());
        // A length of one is not told apart from a unit dimension.
        let one = Padding {
            sizes: Shape::from_slice(&[2, 1]),
            dims: smallvec![1],
            bucket: 16,
        };
        assert!(one.translate(&[2, 1], &[1, 1], 0).is_none());
    }

    #[test]
    fn a_sequence_is_seen_growing_at_its_second_append() {
        let mut sites = GrowthSites::default();
        assert!(!sites.note_append(DType::F32, &[1, 2, 8, 4], 2, 1));
        assert!(sites.note_append(DType::F32, &[1, 2, 9, 4], 2, 1));
        // Equal sequences of several layers append at one site, asked twice each.
        for _ in 0..8 {
            assert!(sites.note_append(DType::F32, &[1, 2, 10, 4], 2, 1));
        }
        // Another head count is another site.
        assert!(!sites.note_append(DType::F32, &[1, 4, 9, 4], 2, 1));
        // A cat of the same fixed sizes every step never continues.
        let mut fixed = GrowthSites::default();
        for _ in 0..4 {
            assert!(!fixed.note_append(DType::F32, &[3, 5], 0, 3));
        }
    }
}
