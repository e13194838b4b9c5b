//! Layout analysis shared by reads and writes: the dims that matter, in memory order, and the
//! "box" a strided layout is a sub-box of once the flat array is reshaped.

use smallvec::SmallVec;

use crate::layout::{push_all, Dims, Layout};

/// A dim of the view that moves through memory: size ≥ 2 and stride > 0.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MovingDim {
    /// Position of the dim in the view.
    pub view_dim: usize,
    pub size: i64,
    pub stride: i64,
}

/// A dim of a layout reduced to what decides its memory footprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    pub size: i64,
    pub stride: i64,
}

pub(crate) type Extents = SmallVec<[Extent; 6]>;

/// The view split into moving dims, dims of size 1 (which read nothing) and broadcast dims
/// (stride 0, size ≥ 2).
pub(crate) struct Analysis {
    /// Moving dims in view order.
    pub moving: SmallVec<[MovingDim; 6]>,
    /// Indices into `moving` by descending stride; ties keep view order.
    pub order: SmallVec<[usize; 6]>,
    pub broadcasts: bool,
}

impl Analysis {
    pub(crate) fn new(view: &Layout) -> Self {
        let mut moving: SmallVec<[MovingDim; 6]> = SmallVec::new();
        let mut broadcasts = false;
        for (view_dim, (&size, &stride)) in view.sizes.iter().zip(&view.strides).enumerate() {
            if size >= 2 {
                if stride == 0 {
                    broadcasts = true;
                } else {
                    moving.push(MovingDim {
                        view_dim,
                        size,
                        stride,
                    });
                }
            }
        }
        let mut order: SmallVec<[usize; 6]> = push_all(0..moving.len());
        // Insertion sort: ranks are tiny and this keeps ties in view order without allocating.
        for i in 1..order.len() {
            let mut j = i;
            while j > 0 && moving[order[j - 1]].stride < moving[order[j]].stride {
                order.swap(j - 1, j);
                j -= 1;
            }
        }
        Analysis {
            moving,
            order,
            broadcasts,
        }
    }

    /// Moving dims by descending stride.
    pub(crate) fn sorted_extents(&self) -> Extents {
        push_all(self.order.iter().map(|&i| Extent {
            size: self.moving[i].size,
            stride: self.moving[i].stride,
        }))
    }

    /// Sizes of the moving dims by descending stride.
    pub(crate) fn sorted_sizes(&self) -> Dims {
        push_all(self.order.iter().map(|&i| self.moving[i].size))
    }

    /// Sizes of the moving dims in view order.
    pub(crate) fn view_sizes(&self) -> Dims {
        push_all(self.moving.iter().map(|d| d.size))
    }

    /// Extents of the moving dims in view order.
    pub(crate) fn view_extents(&self) -> Extents {
        self.moving
            .iter()
            .map(|d| Extent {
                size: d.size,
                stride: d.stride,
            })
            .collect()
    }
}

/// Fuses neighbours (in descending stride order) that together walk memory like one dim.
pub(crate) fn merge_extents(sorted: &[Extent]) -> Extents {
    let mut merged = Extents::new();
    for &extent in sorted {
        match merged.last_mut() {
            Some(outer) if outer.stride == extent.stride * extent.size => {
                outer.size *= extent.size;
                outer.stride = extent.stride;
            }
            _ => merged.push(extent),
        }
    }
    merged
}

/// Greatest common divisor of two non-negative numbers (`gcd(0, b) = b`). Binary (Stein's):
/// shifts and subtractions, since a 64-bit division costs tens of cycles and strides are mostly
/// powers of two, for which this takes no loop turn at all.
pub(crate) fn gcd(a: i64, b: i64) -> i64 {
    debug_assert!(a >= 0 && b >= 0, "gcd of negative numbers {a}, {b}");
    let (mut a, mut b) = (a as u64, b as u64);
    if a == 0 || b == 0 {
        return (a | b) as i64;
    }
    let common_twos = (a | b).trailing_zeros();
    a >>= a.trailing_zeros();
    loop {
        b >>= b.trailing_zeros();
        if a > b {
            std::mem::swap(&mut a, &mut b);
        }
        b -= a;
        if b == 0 {
            return (a << common_twos) as i64;
        }
    }
}

/// `a / b` for `a ≥ 0` and `b > 0`: a shift when `b` is a power of two.
#[inline]
pub(crate) fn div_non_negative(a: i64, b: i64) -> i64 {
    debug_assert!(a >= 0 && b > 0);
    if b & (b - 1) == 0 {
        a >> b.trailing_zeros()
    } else {
        a / b
    }
}

/// `a % b` for `a ≥ 0` and `b > 0`: a mask when `b` is a power of two.
#[inline]
pub(crate) fn rem_non_negative(a: i64, b: i64) -> i64 {
    debug_assert!(a >= 0 && b > 0);
    if b & (b - 1) == 0 {
        a & (b - 1)
    } else {
        a % b
    }
}

pub(crate) fn round_up(value: i64, multiple: i64) -> i64 {
    (value + multiple - 1) / multiple * multiple
}

/// Flat indices `offset + Σ i_j * stride_j` of every element, in row-major order of `dims`.
pub(crate) fn strided_indices(offset: i64, dims: &[Extent]) -> Vec<i64> {
    let count: i64 = dims.iter().map(|d| d.size).product();
    let mut indices = Vec::with_capacity(count as usize);
    if count == 0 {
        return indices;
    }
    let mut counter: SmallVec<[i64; 6]> = SmallVec::from_elem(0, dims.len());
    let mut flat = offset;
    loop {
        indices.push(flat);
        let mut d = dims.len();
        loop {
            if d == 0 {
                return indices;
            }
            d -= 1;
            counter[d] += 1;
            flat += dims[d].stride;
            if counter[d] < dims[d].size {
                break;
            }
            flat -= dims[d].stride * dims[d].size;
            counter[d] = 0;
        }
    }
}

/// How a strided read sits in a row-major box cut out of the flat array.
///
/// With extents `(n_i, s_i)` by descending stride, box dim `i` has row-major stride `t_i`
/// (`t_{k-1} = 1`, otherwise `gcd(s_0..s_i)`), and the view walks it with step `s_i / t_i`.
/// This works when each inner dim fits within one step of the dim outside it.
#[derive(Debug, Default)]
pub(crate) struct ReadBox {
    /// Range of the flat array reshaped into the box; `flat_end` past the array means padding.
    pub flat_start: i64,
    pub flat_end: i64,
    pub shape: Dims,
    pub start: Dims,
    pub limit: Dims,
    pub step: Dims,
    /// Whether the box dims are merged extents, to be split back by a reshape.
    pub merged: bool,
}

impl ReadBox {
    /// Ops besides the reshape and the slice: a flat slice, a pad.
    pub(crate) fn extra_ops(&self, len: i64) -> usize {
        usize::from(self.flat_start != 0 || self.flat_end < len) + usize::from(self.flat_end > len)
    }
}

/// One box dim for an extent: row-major stride `t_i`, the view's step `g_i = s_i / t_i` along
/// it, its size `M_i = t_{i-1} / t_i` (unused for the outermost dim), and its slack
/// `M_i - 1 - (n_i - 1) * g_i`: how far in the view's first index along it may start.
#[derive(Clone, Copy, Debug)]
struct GridDim {
    stride: i64,
    step: i64,
    size: i64,
    slack: i64,
}

type Grid = SmallVec<[GridDim; 6]>;

/// The box dims for `extents`, with innermost stride 1 when `innermost_is_unit` (reads) or the gcd
/// of all strides (writes, which add a trailing dim); `None` when some dim overruns the step of
/// the dim outside it. Fills `grid` in place: returning it would copy it around.
fn box_grid(extents: &[Extent], innermost_is_unit: bool, grid: &mut Grid) -> bool {
    let k = extents.len();
    grid.clear();
    let mut g = 0;
    for (i, e) in extents.iter().enumerate() {
        g = gcd(g, e.stride);
        let stride = if innermost_is_unit && i + 1 == k {
            1
        } else {
            g
        };
        let step = e.stride / stride;
        let (size, slack) = match grid.last() {
            None => (0, i64::MAX),
            Some(outer) => {
                let size = outer.stride / stride;
                (size, size - 1 - (e.size - 1) * step)
            }
        };
        if slack < 0 {
            return false;
        }
        grid.push(GridDim {
            stride,
            step,
            size,
            slack,
        });
    }
    true
}

/// Plans a read of `extents` (descending strides, sizes ≥ 2) at `offset` of a flat array of
/// `len` elements into `plan` (whose vectors are reused); an empty `extents` reads the single
/// element at `offset`. Returns false when no box fits.
pub(crate) fn plan_read_box(len: i64, offset: i64, extents: &[Extent], plan: &mut ReadBox) -> bool {
    let k = extents.len();
    plan.shape.clear();
    plan.start.clear();
    plan.limit.clear();
    plan.step.clear();
    plan.merged = false;
    if k == 0 {
        plan.flat_start = offset;
        plan.flat_end = offset + 1;
        plan.shape.push(1);
        plan.start.push(0);
        plan.limit.push(1);
        plan.step.push(1);
        return true;
    }
    let mut grid = Grid::new();
    if !box_grid(extents, true, &mut grid) {
        return false;
    }
    let t0 = grid[0].stride;
    let outer_span = (extents[0].size - 1) * grid[0].step + 1;
    let start = &mut plan.start;
    start.resize(k, 0);

    // Preferred: the whole flat array is the box, so no flat slice is needed.
    let within_row = offset % t0;
    let mut fits_row = true;
    for i in 1..k {
        start[i] = within_row / grid[i].stride % grid[i].size;
        fits_row &= start[i] <= grid[i].slack;
    }
    start[0] = offset / t0;
    let outer_size = if fits_row && len % t0 == 0 && (start[0] + outer_span) * t0 <= len {
        plan.flat_start = 0;
        plan.flat_end = len;
        len / t0
    } else {
        // Otherwise cut the box out of the flat array, starting as early as the slack allows
        // so that it ends as early as possible.
        let mut rest = offset;
        start[0] = 0;
        for i in 1..k {
            start[i] = grid[i].slack.min(rest / grid[i].stride);
            rest -= start[i] * grid[i].stride;
        }
        plan.flat_start = rest;
        plan.flat_end = rest + outer_span * t0;
        outer_span
    };
    for (i, (dim, extent)) in grid.iter().zip(extents).enumerate() {
        plan.shape.push(if i == 0 { outer_size } else { dim.size });
        plan.limit.push(start[i] + (extent.size - 1) * dim.step + 1);
        plan.step.push(dim.step);
    }
    true
}

/// How a strided write sits in the whole flat array reshaped (after padding) into a box.
///
/// Like [`ReadBox`] but covering the whole array, since a write must give back every element,
/// and with steps turned into an extra dim (`[M] → [M/g, g]`) because `dynamic_update_slice`
/// has no strides. A trailing box dim of `gcd` of all strides plays the same role for the
/// innermost dim.
#[derive(Debug)]
pub(crate) struct WriteBox {
    pub flat_pad_low: i64,
    pub flat_pad_high: i64,
    /// The flat array (padded) reshaped.
    pub shape: Dims,
    /// Padding at the end of stepped box dims so their step divides them.
    pub box_pad_high: Dims,
    /// The padded box with every stepped dim split in two.
    pub split_shape: Dims,
    /// Where the update goes in `split_shape`, and its shape there.
    pub start: Dims,
    pub patch: Dims,
}

impl WriteBox {
    /// Ops besides the reshapes into and out of the box: pads and their slices, splits.
    pub(crate) fn extra_ops(&self) -> usize {
        let flat = usize::from(self.flat_pad_low != 0 || self.flat_pad_high != 0);
        let inner = usize::from(self.box_pad_high.iter().any(|&p| p != 0));
        let split = usize::from(self.split_shape.len() != self.shape.len());
        2 * flat + 2 * inner + 2 * split
    }
}

/// Plans a write of `extents` (descending strides, sizes ≥ 1) at `offset` into a flat array of
/// `len` elements.
pub(crate) fn plan_write_box(len: i64, offset: i64, extents: &[Extent]) -> Option<WriteBox> {
    let k = extents.len();
    debug_assert!(k >= 1);
    let mut grid = Grid::new();
    if !box_grid(extents, false, &mut grid) {
        return None;
    }
    let t0 = grid[0].stride;
    let trailing = grid[k - 1].stride;

    // Box coordinates of the offset within one outer row. Where they overrun some dim's slack,
    // pad the front just enough to move the view to the next position that fits.
    let within_row = offset % t0;
    let mut start_in_box = Dims::from_elem(0, k);
    for i in 1..k {
        start_in_box[i] = within_row / grid[i].stride % grid[i].size;
    }
    let mut trailing_start = within_row % trailing;
    let mut pad_low = 0;
    if let Some(overrun) = (1..k).find(|&i| start_in_box[i] > grid[i].slack) {
        let carry = (1..overrun)
            .rev()
            .find(|&j| start_in_box[j] < grid[j].slack);
        let fitting = match carry {
            Some(j) => {
                start_in_box[j] += 1;
                start_in_box[j + 1..].iter_mut().for_each(|s| *s = 0);
                (1..=j).map(|i| start_in_box[i] * grid[i].stride).sum()
            }
            None => {
                start_in_box.iter_mut().for_each(|s| *s = 0);
                t0
            }
        };
        trailing_start = 0;
        pad_low = fitting - within_row;
    }
    start_in_box[0] = (offset + pad_low) / t0;
    let needed = (len + pad_low).max((start_in_box[0] + extents[0].size) * t0);
    let padded_len = round_up(needed.max(1), t0);

    let mut shape: Dims = grid.iter().map(|dim| dim.size).collect();
    shape[0] = padded_len / t0;
    let mut box_pad_high = Dims::from_elem(0, k);
    let mut split_shape = Dims::new();
    let mut start = Dims::new();
    let mut patch = Dims::new();
    for i in 0..k {
        let step = grid[i].step;
        if step == 1 {
            split_shape.push(shape[i]);
            start.push(start_in_box[i]);
            patch.push(extents[i].size);
        } else {
            let rows = (shape[i] + step - 1) / step;
            box_pad_high[i] = rows * step - shape[i];
            split_shape.extend_from_slice(&[rows, step]);
            start.extend_from_slice(&[start_in_box[i] / step, start_in_box[i] % step]);
            patch.extend_from_slice(&[extents[i].size, 1]);
        }
    }
    if trailing > 1 {
        shape.push(trailing);
        box_pad_high.push(0);
        split_shape.push(trailing);
        start.push(trailing_start);
        patch.push(1);
    }
    Some(WriteBox {
        flat_pad_low: pad_low,
        flat_pad_high: padded_len - len - pad_low,
        shape,
        box_pad_high,
        split_shape,
        start,
        patch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn division_free_helpers_agree_with_division() {
        for a in 0..300i64 {
            for b in 0..300i64 {
                let mut x = a;
                let mut y = b;
                while y != 0 {
                    (x, y) = (y, x % y);
                }
                assert_eq!(gcd(a, b), x, "gcd({a}, {b})");
                if b > 0 {
                    assert_eq!(div_non_negative(a, b), a / b, "{a} / {b}");
                    assert_eq!(rem_non_negative(a, b), a % b, "{a} % {b}");
                }
            }
        }
        let big = 1i64 << 62;
        assert_eq!(gcd(big, 3 << 40), 1 << 40);
        assert_eq!(div_non_negative(i64::MAX, 1 << 20), i64::MAX >> 20);
        assert_eq!(rem_non_negative(i64::MAX, 1000), i64::MAX % 1000);
    }
}
