//! Bounded shapes' bookkeeping: storages whose device value is padded to a bucket along one
//! growing extent, the translation of PyTorch's views of them into views of the padded value,
//! and the detection of sequences that grow by appends.
//!
//! PyTorch sees a padded storage as the contiguous tensor of its true sizes; only the engine
//! knows the value is larger. A view PyTorch takes of it (a transpose, a reshape that merges
//! other dimensions) is the same view of the padded value with the padded dimensions at the
//! bucket's size; any other view (a slice of the extent, a reshape across it) is not, and the
//! engine cuts the padding off first (`Graph::unpad`).

use crate::storage::StorageId;
use ops::padding::PaddedDims;
use ops::{DType, Shape};
use rustc_hash::{FxHashMap, FxHashSet};
use smallvec::SmallVec;

/// A storage's value is padded: PyTorch's contiguous tensor of `sizes` is the first
/// `sizes[d]` elements along each `d` in `dims` of a value whose `dims` hold `bucket`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Padding {
    pub sizes: Shape,
    pub dims: PaddedDims,
    pub bucket: i64,
}

/// A view of a padded value: its sizes, strides and offset over the padded value's elements,
/// and which of its dimensions are padded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaddedView {
    pub sizes: Shape,
    pub strides: SmallVec<[i64; 6]>,
    /// The element the view starts at in the padded value.
    pub offset: i64,
    pub dims: PaddedDims,
    /// Whether a padded dimension of the view merges the extent with dimensions outside it
    /// (`[batch, length, features]` read as `[batch * length, features]`): it then holds
    /// `batch * bucket` elements, `batch` runs of the extent.
    pub merged: bool,
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

    /// The padded value's bytes made on the host from the true tensor's contiguous `bytes`
    /// (elements of `element_size` bytes), zeros in the padding; `None` unless one dimension
    /// is padded.
    pub fn pad_host(&self, bytes: &[u8], element_size: usize) -> Option<Vec<u8>> {
        let [dim] = self.dims.as_slice() else {
            return None;
        };
        let dim = *dim;
        let outer = self.sizes[..dim].iter().product::<i64>() as usize;
        let row = self.sizes[dim + 1..].iter().product::<i64>() as usize * element_size;
        let (len, bucket) = (self.sizes[dim] as usize, self.bucket as usize);
        if bytes.len() != outer * len * row || bucket < len {
            return None;
        }
        let mut padded = vec![0u8; outer * bucket * row];
        for (chunk, out) in bytes
            .chunks_exact((len * row).max(1))
            .zip(padded.chunks_exact_mut((bucket * row).max(1)))
        {
            out[..chunk.len()].copy_from_slice(chunk);
        }
        Some(padded)
    }

    /// The view of the padded value that the view `(sizes, strides, offset)` of the true
    /// tensor is, when every true element it reads sits at the same place relative to its
    /// dimension in the padded value; `None` otherwise.
    ///
    /// Each moving dimension of the view reads either inside one dimension of the true tensor
    /// (a transpose, a split of the features into heads, a slice of the features such as the
    /// key third of a fused `qkv` projection, a fixed position) or several whole ones merged
    /// (a linear layer's `[batch * length]` rows; the extent only as the innermost of them).
    /// A padded dimension is read whole or at one position: a slice of it (or a split) is
    /// refused.
    pub fn translate(&self, sizes: &[i64], strides: &[i64], offset: i64) -> Option<PaddedView> {
        if offset < 0 || sizes.len() != strides.len() || self.true_len() < 2 {
            return None;
        }
        let numel: i64 = self.sizes.iter().product();
        if offset >= numel {
            return None;
        }
        let true_strides = contiguous_strides(&self.sizes);
        let padded_strides = contiguous_strides(&self.padded_sizes());
        // The true tensor's dimensions larger than one, outermost first, each with the index
        // the view starts at and how far past it the view reaches.
        let mut atoms: SmallVec<[Atom; 8]> = (0..self.sizes.len())
            .filter(|&j| self.sizes[j] != 1)
            .map(|j| Atom {
                size: self.sizes[j],
                true_stride: true_strides[j],
                padded_stride: padded_strides[j],
                padded: self.dims.contains(&j),
                start: (offset / true_strides[j]) % self.sizes[j],
                reach: 0,
            })
            .collect();
        let padded_offset = atoms.iter().map(|a| a.start * a.padded_stride).sum();
        let mut out_sizes = Shape::from_slice(sizes);
        let mut out_strides: SmallVec<[i64; 6]> = SmallVec::from_elem(0, sizes.len());
        let mut dims = PaddedDims::new();
        let mut merged = false;
        for i in 0..sizes.len() {
            let (size, stride) = (sizes[i], strides[i]);
            if size == 1 || stride == 0 {
                continue;
            }
            if stride < 0 {
                return None;
            }
            // The true dimension the view's stride falls in.
            let j = atoms
                .iter()
                .position(|a| a.true_stride <= stride && stride < a.true_stride * a.size)?;
            let inner = atoms[j];
            if stride % inner.true_stride != 0 {
                return None;
            }
            let step = stride / inner.true_stride;
            if step == 1 && size > inner.size - inner.start {
                // Several whole dimensions merged: `j` and the ones outside it, the outermost
                // of them possibly in part.
                let mut product = 1;
                let mut k = j;
                loop {
                    let atom = atoms[k];
                    // The extent merged with a dimension inside it: its runs are not
                    // contiguous.
                    if (k != j && atom.padded) || size % product != 0 {
                        return None;
                    }
                    let need = size / product;
                    if need <= atom.size - atom.start && k != j {
                        // The outermost, from its start.
                        atoms[k].reach = atoms[k].reach.max(need - 1);
                        break;
                    }
                    if atom.start != 0 || k == 0 {
                        return None;
                    }
                    atoms[k].reach = atom.size - 1;
                    product *= atom.size;
                    k -= 1;
                }
                let outer: i64 = size / inner.size;
                if inner.padded {
                    out_sizes[i] = outer * self.bucket;
                    merged = true;
                    dims.push(i);
                }
                out_strides[i] = inner.padded_stride;
                continue;
            }
            if inner.padded {
                // A padded dimension is read whole, or not moved along at all.
                if step != 1 || size != inner.size || inner.start != 0 {
                    return None;
                }
                out_sizes[i] = self.bucket;
                dims.push(i);
            }
            atoms[j].reach += (size - 1) * step;
            out_strides[i] = step * inner.padded_stride;
        }
        // Every dimension's reads stay inside it: no index carries into the next dimension.
        if atoms.iter().any(|a| a.start + a.reach >= a.size) {
            return None;
        }
        Some(PaddedView {
            sizes: out_sizes,
            strides: out_strides,
            offset: padded_offset,
            dims,
            merged,
        })
    }
}

/// One dimension of the true tensor while a view is matched against it: its size, its
/// stride in the true tensor and in the padded value, whether it is a padded one, the index
/// the view starts at and how many positions past it the view reads.
#[derive(Clone, Copy, Debug)]
struct Atom {
    size: i64,
    true_stride: i64,
    padded_stride: i64,
    padded: bool,
    start: i64,
    reach: i64,
}

/// How many append sites are remembered before the table starts afresh.
const SITES_KEPT: usize = 256;
/// Result lengths remembered per site.
const LENGTHS_KEPT: usize = 4;

/// Appends seen (`cat([a, b], dim)` of exact values): per dtype, dimension and the sizes
/// around it, the latest result lengths, and which storages hold an append's result. An
/// append whose first input is itself an earlier append's result, as long as a recent result
/// of its site, continues a sequence that grows (a cache: `cache = cat([cache, new])`): its
/// result is padded from then on. Both conditions are needed: a model that joins pieces of
/// features (`cat([q_nope, q_rope], -1)`, then a pad of another value to that width) makes
/// equal lengths at one site without anything growing.
#[derive(Debug, Default)]
pub struct GrowthSites {
    sites: FxHashMap<(DType, usize, Shape), SmallVec<[i64; LENGTHS_KEPT]>>,
    results: FxHashSet<StorageId>,
    /// Results of `cat([torch.tensor([]), x])`: a sequence's first entry (a dynamic cache's,
    /// which starts as an empty tensor), whose first append already continues it.
    first_entries: FxHashSet<StorageId>,
}

/// How many append results are remembered before the set starts afresh: two per layer of a
/// model's cache, with room to spare.
const RESULTS_KEPT: usize = 4096;

impl GrowthSites {
    /// Records that storage `id` holds the result of an append (a two-input `cat`); `first`
    /// when that append was to an empty tensor (the sequence's first entry).
    pub fn note_result(&mut self, id: StorageId, first: bool) {
        if self.results.len() >= RESULTS_KEPT {
            self.results.clear();
            self.first_entries.clear();
        }
        self.results.insert(id);
        if first {
            self.first_entries.insert(id);
        }
    }

    /// Whether storage `id` holds an append's result or a sequence's first entry: a cache
    /// whose next append is to read it padded.
    pub fn is_sequence(&self, id: StorageId) -> bool {
        self.results.contains(&id) || self.first_entries.contains(&id)
    }

    /// Whether storage `id` holds a sequence's first entry (`cat([torch.tensor([]), x])`).
    pub fn is_first_entry(&self, id: StorageId) -> bool {
        self.first_entries.contains(&id)
    }

    /// Records the append of `b_len` elements to `a` (of `a_sizes`, held by storage `a`)
    /// along `dim`; returns whether it continues a sequence seen growing.
    pub fn note_append(
        &mut self,
        dtype: DType,
        a: StorageId,
        a_sizes: &[i64],
        dim: usize,
        b_len: i64,
    ) -> bool {
        let mut around = Shape::from_slice(a_sizes);
        let a_len = std::mem::replace(&mut around[dim], -1);
        if self.sites.len() >= SITES_KEPT {
            self.sites.clear();
        }
        let lengths = self.sites.entry((dtype, dim, around)).or_default();
        let continues = (lengths.contains(&a_len) && self.results.contains(&a))
            || self.first_entries.contains(&a);
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

/// Results whose size depends on the data (`nonzero`, `masked_select`: how many elements a mask
/// selects; `repeat_interleave`: the sum of its repeats), per op and input types: the latest
/// distinct counts. A site whose count has changed makes its results padded to the count's
/// bucket from then on, so the ops after it compile once per bucket, not once per count; a
/// site whose count never changes stays exact.
#[derive(Debug, Default)]
pub struct CountSites {
    seen: FxHashMap<CountSite, SmallVec<[i64; LENGTHS_KEPT]>>,
}

/// An op number and the types of its inputs.
type CountSite = (u32, SmallVec<[(DType, Shape); 2]>);

impl CountSites {
    /// Records a result of `count` elements at the site of op number `op` on inputs of
    /// `types`; returns whether it is to be padded (the site has seen another count, and the
    /// count is large enough for a padded value).
    pub fn note_count(&mut self, op: u32, types: &[(DType, Shape)], count: i64) -> bool {
        if self.seen.len() >= SITES_KEPT {
            self.seen.clear();
        }
        let counts = self
            .seen
            .entry((op, types.iter().cloned().collect()))
            .or_default();
        if !counts.contains(&count) {
            if counts.len() == LENGTHS_KEPT {
                counts.remove(0);
            }
            counts.push(count);
        }
        counts.len() > 1 && count >= 2
    }
}

/// Distinct lengths an upload site must have seen along one dimension before its uploads are
/// padded: a short last batch (two sizes) stays exact, a loader that pads each batch to its
/// longest sequence is padded from its third length on.
const UPLOAD_LENGTHS_SEEN: usize = 3;

/// Host-to-device uploads seen, per dtype, dimension and the sizes around it: the latest
/// distinct lengths along that dimension, and the bounds `torch_pjrt.mark_dynamic` gave.
///
/// Only integer uploads of two or more dimensions whose last one changes are watched: token
/// ids and attention masks (`[batch, length]`) are what a data loader batches at a changing
/// length, and an embedding lookup carries their padding into the model. A model's float
/// weights, uploaded once each in a burst of shapes that differ along one dimension, and 1-d
/// index lists of every length must never be padded by accident.
#[derive(Debug, Default)]
pub struct UploadSites {
    seen: FxHashMap<(DType, usize, Shape), SmallVec<[i64; LENGTHS_KEPT]>>,
    marked: FxHashMap<(DType, usize, Shape), i64>,
}

impl UploadSites {
    /// Records an upload of `sizes`; returns the dimension to pad it along and the bucket, when
    /// its site is marked or has seen the dimension take several lengths.
    pub fn note_upload(&mut self, dtype: DType, sizes: &[i64]) -> Option<(usize, i64)> {
        for dim in 0..sizes.len() {
            let len = sizes[dim];
            if len < 2 {
                continue;
            }
            let mut around = Shape::from_slice(sizes);
            around[dim] = -1;
            if let Some(&bound) = self.marked.get(&(dtype, dim, around.clone())) {
                return Some((dim, bound.max(ops::padding::bucket(len))));
            }
            // A batch of sequences: `[..., length]` integers (ids, masks). A 1-d index list or
            // a changing batch size is no sign of one.
            if !matches!(dtype, DType::I64 | DType::I32)
                || sizes.len() < 2
                || dim + 1 != sizes.len()
            {
                continue;
            }
            if self.seen.len() >= SITES_KEPT {
                self.seen.clear();
            }
            let lengths = self.seen.entry((dtype, dim, around)).or_default();
            if !lengths.contains(&len) {
                if lengths.len() == LENGTHS_KEPT {
                    lengths.remove(0);
                }
                lengths.push(len);
            }
            if lengths.len() >= UPLOAD_LENGTHS_SEEN {
                return Some((dim, ops::padding::bucket(len)));
            }
        }
        None
    }

    /// Marks uploads of `sizes` with any length along `dim` to be padded to at least `bound`
    /// elements (rounded up to a bucket) along it.
    pub fn mark(&mut self, dtype: DType, sizes: &[i64], dim: usize, bound: i64) {
        let mut around = Shape::from_slice(sizes);
        around[dim] = -1;
        if self.marked.len() >= SITES_KEPT {
            self.marked.clear();
        }
        self.marked
            .insert((dtype, dim, around), ops::padding::bucket(bound));
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
    fn the_extent_merged_with_the_dimensions_outside_it_is_runs_of_buckets() {
        // A [3, 9, 4] batch padded along its length, read as [27, 4] by a linear layer.
        let batch = Padding {
            sizes: Shape::from_slice(&[3, 9, 4]),
            dims: smallvec![1],
            bucket: 16,
        };
        let v = batch.translate(&[27, 4], &[4, 1], 0).unwrap();
        assert_eq!(v.sizes.as_slice(), &[48, 4]);
        assert_eq!(v.strides.as_slice(), &[4, 1]);
        assert_eq!(v.dims.as_slice(), &[0]);
        assert!(v.merged);
        // The key cache's heads merged with its length: [2 * 9, 4].
        let v = cache().translate(&[18, 4], &[4, 1], 0).unwrap();
        assert_eq!(v.sizes.as_slice(), &[32, 4]);
        assert!(v.merged);
        assert!(
            !cache()
                .translate(&[1, 2, 9, 4], &[72, 36, 4, 1], 0)
                .unwrap()
                .merged
        );
    }

    #[test]
    fn a_dimension_other_than_the_extent_may_be_split() {
        // [3, 9, 32] padded along its length, its features split into 2 heads of 16.
        let hidden = Padding {
            sizes: Shape::from_slice(&[3, 9, 32]),
            dims: smallvec![1],
            bucket: 16,
        };
        let v = hidden
            .translate(&[3, 9, 2, 16], &[288, 32, 16, 1], 0)
            .unwrap();
        assert_eq!(v.sizes.as_slice(), &[3, 16, 2, 16]);
        assert_eq!(v.strides.as_slice(), &[512, 32, 16, 1]);
        assert_eq!(v.dims.as_slice(), &[1]);
        assert!(!v.merged);
        // Then transposed to [3, 2, 9, 16] (heads before the length).
        let v = hidden
            .translate(&[3, 2, 9, 16], &[288, 16, 32, 1], 0)
            .unwrap();
        assert_eq!(v.sizes.as_slice(), &[3, 2, 16, 16]);
        assert_eq!(v.strides.as_slice(), &[512, 16, 32, 1]);
        assert_eq!(v.dims.as_slice(), &[2]);
        // The extent itself is never split.
        assert!(hidden
            .translate(&[3, 3, 3, 32], &[288, 96, 32, 1], 0)
            .is_none());
        // Features read in rows of six, thirty of them: still inside the feature dimension.
        let v = hidden
            .translate(&[3, 9, 5, 6], &[288, 32, 6, 1], 0)
            .unwrap();
        assert_eq!(v.strides.as_slice(), &[512, 32, 6, 1]);
        // Thirty-six would carry into the next position.
        assert!(hidden
            .translate(&[3, 9, 6, 6], &[288, 32, 6, 1], 0)
            .is_none());
    }

    #[test]
    fn a_view_at_the_first_position_reads_exact_elements() {
        let hidden = Padding {
            sizes: Shape::from_slice(&[3, 9, 32]),
            dims: smallvec![1],
            bucket: 16,
        };
        // hidden[:, 0]: the first position of every sequence (a pooler's input).
        let v = hidden.translate(&[3, 32], &[288, 1], 0).unwrap();
        assert_eq!(v.sizes.as_slice(), &[3, 32]);
        assert_eq!(v.strides.as_slice(), &[512, 1]);
        assert!(v.dims.is_empty());
        // hidden[..., 0]: the first feature, still padded along the length.
        let v = hidden.translate(&[3, 9], &[288, 32], 0).unwrap();
        assert_eq!(v.sizes.as_slice(), &[3, 16]);
        assert_eq!(v.strides.as_slice(), &[512, 32]);
        assert_eq!(v.dims.as_slice(), &[1]);
    }

    #[test]
    fn views_at_an_offset_read_the_same_elements_of_the_padded_value() {
        // A fused projection's output [1, 9, 3 * 8] padded along its length; its key third
        // split into 2 heads of 4 and moved before the length: [1, 2, 9, 4] at offset 8.
        let qkv = Padding {
            sizes: Shape::from_slice(&[1, 9, 24]),
            dims: smallvec![1],
            bucket: 16,
        };
        let v = qkv.translate(&[1, 2, 9, 4], &[216, 4, 24, 1], 8).unwrap();
        assert_eq!(v.sizes.as_slice(), &[1, 2, 16, 4]);
        assert_eq!(&v.strides[1..], &[4, 24, 1]);
        assert_eq!(v.offset, 8);
        assert_eq!(v.dims.as_slice(), &[2]);
        // The value third reaches the end of each row; a wider read would carry into the
        // next position.
        assert!(qkv.translate(&[1, 2, 9, 4], &[216, 4, 24, 1], 16).is_some());
        assert!(qkv.translate(&[1, 2, 9, 8], &[216, 8, 24, 1], 16).is_none());
        // The cache's last position (`k[:, :, -1]`): exact elements at position 8.
        let v = cache()
            .translate(&[1, 2, 1, 4], &[72, 36, 4, 1], 32)
            .unwrap();
        assert!(v.dims.is_empty());
        assert_eq!(v.offset, 32);
        assert_eq!((v.strides[1], v.strides[3]), (64, 1));
        // The second head's last position: offset 36 + 32 in the true tensor.
        let v = cache().translate(&[4], &[1], 68).unwrap();
        assert_eq!(v.offset, 64 + 32);
    }

    #[test]
    fn views_across_or_into_the_extent_are_refused() {
        let c = cache();
        // The last two positions (a slice of the extent).
        assert!(c.translate(&[1, 2, 2, 4], &[72, 36, 4, 1], 28).is_none());
        // The first five positions.
        assert!(c.translate(&[1, 2, 5, 4], &[72, 36, 4, 1], 0).is_none());
        // The extent merged with the head dim after it.
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
        let (first, second, third) = (StorageId(1), StorageId(2), StorageId(3));
        assert!(!sites.note_append(DType::F32, StorageId(0), &[1, 2, 8, 4], 2, 1));
        sites.note_result(first, false);
        assert!(sites.note_append(DType::F32, first, &[1, 2, 9, 4], 2, 1));
        sites.note_result(second, false);
        // Equal sequences of several layers append at one site, asked twice each.
        for _ in 0..8 {
            assert!(sites.note_append(DType::F32, second, &[1, 2, 10, 4], 2, 1));
        }
        // Another head count is another site.
        sites.note_result(third, false);
        assert!(!sites.note_append(DType::F32, third, &[1, 4, 9, 4], 2, 1));
        // A cat of the same fixed sizes every step never continues.
        let mut fixed = GrowthSites::default();
        for step in 0..4 {
            assert!(!fixed.note_append(DType::F32, StorageId(step), &[3, 5], 0, 3));
            fixed.note_result(StorageId(step), false);
        }
    }

    #[test]
    fn joined_features_of_an_equal_length_are_no_growing_sequence() {
        // `q = cat([q_nope, q_rope], -1)` makes 16 + 16 = 32 at a site; a value of width 32
        // made otherwise, joined with 16 more, is as long as that result but grows nothing.
        let mut sites = GrowthSites::default();
        assert!(!sites.note_append(DType::F32, StorageId(1), &[2, 4, 8, 16], 3, 16));
        sites.note_result(StorageId(2), false);
        assert!(!sites.note_append(DType::F32, StorageId(3), &[2, 4, 8, 32], 3, 16));
        // The same result appended to again is a sequence.
        assert!(sites.note_append(DType::F32, StorageId(2), &[2, 4, 8, 32], 3, 16));
    }

    #[test]
    fn a_sequences_first_entry_continues_at_its_first_append() {
        // A dynamic cache: `cat([torch.tensor([]), key])`, then `cat([cache, new_key])`.
        let mut sites = GrowthSites::default();
        sites.note_result(StorageId(1), true);
        assert!(sites.note_append(DType::F32, StorageId(1), &[1, 2, 8, 4], 2, 1));
        // Any other first append of a length never seen does not.
        sites.note_result(StorageId(2), false);
        assert!(!sites.note_append(DType::F32, StorageId(2), &[1, 2, 5, 4], 2, 1));
    }

    #[test]
    fn a_data_dependent_count_is_padded_once_it_has_changed() {
        let mut sites = CountSites::default();
        let mask = [(DType::Bool, Shape::from_slice(&[4, 8]))];
        // The same count every time stays exact.
        for _ in 0..3 {
            assert!(!sites.note_count(1, &mask, 5));
        }
        assert!(sites.note_count(1, &mask, 9));
        assert!(
            sites.note_count(1, &mask, 5),
            "asked again, the site has changed"
        );
        // Too few elements for a padded value.
        assert!(!sites.note_count(1, &mask, 1));
        // Another op or another mask shape is another site.
        assert!(!sites.note_count(2, &mask, 9));
        assert!(!sites.note_count(1, &[(DType::Bool, Shape::from_slice(&[4, 9]))], 9));
    }

    #[test]
    fn an_upload_site_is_padded_from_its_third_length() {
        let mut sites = UploadSites::default();
        assert_eq!(sites.note_upload(DType::I64, &[4, 9]), None);
        assert_eq!(sites.note_upload(DType::I64, &[4, 9]), None);
        assert_eq!(sites.note_upload(DType::I64, &[4, 23]), None);
        assert_eq!(sites.note_upload(DType::I64, &[4, 40]), Some((1, 64)));
        assert_eq!(sites.note_upload(DType::I64, &[4, 9]), Some((1, 16)));
        // Another batch size is another site; so is another dtype.
        assert_eq!(sites.note_upload(DType::I64, &[3, 9]), None);
        assert_eq!(sites.note_upload(DType::I32, &[4, 9]), None);
        // Nor is a changing batch size, or a 1-d list of indices.
        for n in [3, 5, 8, 13] {
            assert_eq!(sites.note_upload(DType::I64, &[n, 7]), None);
            assert_eq!(sites.note_upload(DType::I64, &[n]), None);
        }
        // Floats (weights) are never padded without a mark, whatever their shapes.
        let mut weights = UploadSites::default();
        for n in [64, 256, 192, 128, 500] {
            assert_eq!(weights.note_upload(DType::F32, &[n, 64]), None);
        }
    }

    #[test]
    fn host_bytes_are_padded_along_the_dimension() {
        let p = Padding {
            sizes: Shape::from_slice(&[2, 3, 2]),
            dims: smallvec![1],
            bucket: 4,
        };
        let bytes: Vec<u8> = (1..=12).collect();
        let padded = p.pad_host(&bytes, 1).unwrap();
        assert_eq!(
            padded,
            vec![1, 2, 3, 4, 5, 6, 0, 0, 7, 8, 9, 10, 11, 12, 0, 0]
        );
        // A wrong byte count is refused.
        assert!(p.pad_host(&bytes[..11], 1).is_none());
    }

    #[test]
    fn a_marked_site_pads_at_once_to_its_bound() {
        let mut sites = UploadSites::default();
        sites.mark(DType::F32, &[2, 7, 16], 1, 100);
        assert_eq!(sites.note_upload(DType::F32, &[2, 30, 16]), Some((1, 128)));
        assert_eq!(sites.note_upload(DType::F32, &[2, 200, 16]), Some((1, 256)));
        assert_eq!(sites.note_upload(DType::F32, &[3, 30, 16]), None);
        // A length of one is never padded (it reads as a unit dimension).
        assert_eq!(sites.note_upload(DType::F32, &[2, 1, 16]), None);
    }
}
