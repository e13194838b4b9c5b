//! Strided layouts: PyTorch's (element size, sizes, strides, storage offset) description of a view.

use smallvec::SmallVec;

use crate::error::ViewError;

/// A list of dimensions or per-dimension attributes; inline up to rank 6, as most tensors are.
pub type Dims = SmallVec<[i64; 6]>;

/// A strided view of a storage, in PyTorch's terms.
///
/// `strides` and `offset` count elements of `elem_size` bytes, as PyTorch's `stride()` and
/// `storage_offset()` do for the view's own dtype. Element `(i0, …, ik)` lives at element index
/// `offset + Σ i_j * strides[j]` of the storage seen as an array of `elem_size`-byte elements.
/// Offsets in view elements are always aligned to the view's element size (PyTorch's
/// `view(dtype)` guarantees it), so a base of another element size is reached by bitcasts alone.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Bytes per element of the view's dtype.
    pub elem_size: usize,
    pub sizes: Dims,
    pub strides: Dims,
    pub offset: i64,
}

/// What one pass over a valid layout's dims finds ([`Layout::scan`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scan {
    pub numel: i64,
    /// Index of the last element (`offset + Σ (size-1) * stride`); -1 for an empty view.
    pub last: i64,
    /// [`Layout::is_contiguous`].
    pub contiguous: bool,
}

impl Layout {
    pub fn new(elem_size: usize, sizes: &[i64], strides: &[i64], offset: i64) -> Self {
        Layout {
            elem_size,
            sizes: Dims::from_slice(sizes),
            strides: Dims::from_slice(strides),
            offset,
        }
    }

    /// A row-major contiguous layout starting at element 0.
    pub fn contiguous(elem_size: usize, sizes: &[i64]) -> Self {
        Layout {
            elem_size,
            sizes: Dims::from_slice(sizes),
            strides: contiguous_strides(sizes),
            offset: 0,
        }
    }

    pub fn rank(&self) -> usize {
        self.sizes.len()
    }

    /// Number of elements (1 for a 0-d view).
    pub fn numel(&self) -> i64 {
        self.sizes.iter().product()
    }

    /// Checks ranks, signs and element size, and that element indices fit in 64 bits.
    pub fn validate(&self) -> Result<(), ViewError> {
        self.scan().map(drop)
    }

    /// [`Layout::validate`], returning what its pass over the dims learns on the way: the
    /// element count, the last element's index and contiguity. Callers that need those read
    /// the dims once instead of four times.
    pub(crate) fn scan(&self) -> Result<Scan, ViewError> {
        if self.elem_size == 0 {
            return Err(ViewError::ZeroElementSize);
        }
        if self.sizes.len() != self.strides.len() {
            return Err(ViewError::RankMismatch {
                sizes: self.sizes.len(),
                strides: self.strides.len(),
            });
        }
        if self.offset < 0 {
            return Err(ViewError::NegativeOffset {
                offset: self.offset,
            });
        }
        let mut numel: i64 = 1;
        // `None` once the last index overflows; that is an error only for a non-empty view.
        let mut last = Some(self.offset);
        for (dim, (&size, &stride)) in self.sizes.iter().zip(&self.strides).enumerate() {
            if size < 0 {
                return Err(ViewError::NegativeSize { dim, size });
            }
            if stride < 0 {
                return Err(ViewError::NegativeStride { dim, stride });
            }
            numel = numel.checked_mul(size).ok_or(ViewError::Overflow)?;
            last = last.and_then(|l| l.checked_add((size - 1).checked_mul(stride)?));
        }
        let last = if numel > 0 {
            last.ok_or(ViewError::Overflow)?
        } else {
            -1
        };
        Ok(Scan {
            numel,
            last,
            contiguous: numel == 0 || has_row_major_strides(&self.sizes, &self.strides),
        })
    }

    /// Element index of the last element (`offset + Σ (size-1) * stride`), for a non-empty view.
    pub fn last_index(&self) -> Option<i64> {
        let mut last = self.offset;
        for (&size, &stride) in self.sizes.iter().zip(&self.strides) {
            last = last.checked_add((size - 1).checked_mul(stride)?)?;
        }
        Some(last)
    }

    /// PyTorch's `is_non_overlapping_and_dense`: the elements fill a contiguous range exactly
    /// once, in some order of dimensions.
    pub fn is_non_overlapping_and_dense(&self) -> bool {
        is_non_overlapping_and_dense(&self.sizes, &self.strides)
    }

    /// Whether the strides are the row-major contiguous ones (ignoring dims of size 1), as
    /// PyTorch's `is_contiguous`.
    pub fn is_contiguous(&self) -> bool {
        self.numel() == 0 || has_row_major_strides(&self.sizes, &self.strides)
    }
}

/// Whether the strides of a non-empty layout are the row-major contiguous ones, dims of size 1
/// ignored.
fn has_row_major_strides(sizes: &[i64], strides: &[i64]) -> bool {
    let mut expected = 1i64;
    for (&size, &stride) in sizes.iter().zip(strides).rev() {
        if size != 1 {
            if stride != expected {
                return false;
            }
            expected *= size;
        }
    }
    true
}

/// Collects a short iterator by pushing: on hot paths this is cheaper than `collect`, whose
/// generic `extend` is not inlined.
#[inline]
pub(crate) fn push_all<A: smallvec::Array>(items: impl Iterator<Item = A::Item>) -> SmallVec<A> {
    let mut out = SmallVec::new();
    for item in items {
        out.push(item);
    }
    out
}

/// Row-major contiguous strides for `sizes` (PyTorch treats dims of size 0 as size 1 here).
pub fn contiguous_strides(sizes: &[i64]) -> Dims {
    let mut strides = Dims::from_elem(1, sizes.len());
    let mut running = 1i64;
    for (stride, &size) in strides.iter_mut().zip(sizes).rev() {
        *stride = running;
        running = running.saturating_mul(size.max(1));
    }
    strides
}

/// PyTorch's `compute_non_overlapping_and_dense` on raw sizes and strides.
pub fn is_non_overlapping_and_dense(sizes: &[i64], strides: &[i64]) -> bool {
    if sizes.len() == 1 {
        return sizes[0] < 2 || strides[0] == 1;
    }
    // Dims of size 0 or 1 never decide density; the others, by ascending stride, must tile.
    let mut dims: SmallVec<[(i64, i64); 6]> = sizes
        .iter()
        .zip(strides)
        .filter(|(&size, _)| size >= 2)
        .map(|(&size, &stride)| (stride, size))
        .collect();
    dims.sort_unstable();
    let mut required_stride = 1i64;
    for (stride, size) in dims {
        if stride != required_stride {
            return false;
        }
        required_stride = required_stride.saturating_mul(size);
    }
    true
}

/// Checks the view against a base of `base_len` elements of `base_elem_size` bytes, the way
/// PyTorch's `setStorage` does (empty views are always in bounds).
pub fn check_in_bounds(
    base_len: i64,
    base_elem_size: usize,
    view: &Layout,
) -> Result<(), ViewError> {
    let scan = view.scan()?;
    check_scanned_in_bounds(base_len, base_elem_size, view, &scan)
}

/// [`check_in_bounds`] for a view already scanned.
pub(crate) fn check_scanned_in_bounds(
    base_len: i64,
    base_elem_size: usize,
    view: &Layout,
    scan: &Scan,
) -> Result<(), ViewError> {
    if base_elem_size == 0 {
        return Err(ViewError::ZeroElementSize);
    }
    if base_len < 0 {
        return Err(ViewError::NegativeBaseLength { base_len });
    }
    if scan.numel == 0 {
        return Ok(());
    }
    let required_bytes = (scan.last as i128 + 1) * view.elem_size as i128;
    let available_bytes = base_len as i128 * base_elem_size as i128;
    if required_bytes > available_bytes {
        return Err(ViewError::OutOfBounds {
            sizes: view.sizes.to_vec(),
            strides: view.strides.to_vec(),
            offset: view.offset,
            elem_size: view.elem_size,
            required_bytes,
            available_bytes,
        });
    }
    Ok(())
}
