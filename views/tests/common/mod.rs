//! PyTorch's view functions on layouts, random view programs built from them, and test data.

#![allow(dead_code)]

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use views::eval::HostArray;
use views::{Dims, Layout};

/// `cases` unless `PROPTEST_CASES` is set, which then scales every property test.
pub fn config(cases: u32) -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    config
}

/// Distinct-looking bytes for test data.
pub fn bytes(seed: u64, count: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

pub fn base_array(base_len: i64, elem_size: usize, seed: u64) -> HostArray {
    HostArray::new(
        elem_size,
        &[base_len],
        bytes(seed, base_len as usize * elem_size),
    )
}

// ---- PyTorch's view functions (metadata only) ----

pub fn slice(l: &Layout, dim: usize, start: i64, end: i64, step: i64) -> Layout {
    let mut out = l.clone();
    let end = end.clamp(start, l.sizes[dim]);
    out.offset += start * l.strides[dim];
    out.sizes[dim] = (end - start + step - 1) / step;
    out.strides[dim] *= step;
    out
}

pub fn narrow(l: &Layout, dim: usize, start: i64, length: i64) -> Layout {
    slice(l, dim, start, start + length, 1)
}

pub fn select(l: &Layout, dim: usize, index: i64) -> Layout {
    let mut out = l.clone();
    out.offset += index * l.strides[dim];
    out.sizes.remove(dim);
    out.strides.remove(dim);
    out
}

pub fn permute(l: &Layout, perm: &[usize]) -> Layout {
    Layout {
        elem_size: l.elem_size,
        sizes: perm.iter().map(|&p| l.sizes[p]).collect(),
        strides: perm.iter().map(|&p| l.strides[p]).collect(),
        offset: l.offset,
    }
}

pub fn transpose(l: &Layout, a: usize, b: usize) -> Layout {
    let mut out = l.clone();
    out.sizes.swap(a, b);
    out.strides.swap(a, b);
    out
}

/// `torch.diagonal(offset=diag, dim1=a, dim2=b)`.
pub fn diagonal(l: &Layout, diag: i64, a: usize, b: usize) -> Layout {
    let size = if diag >= 0 {
        l.sizes[a].min(l.sizes[b] - diag).max(0)
    } else {
        (l.sizes[a] + diag).min(l.sizes[b]).max(0)
    };
    let mut offset = l.offset;
    if size > 0 {
        if diag >= 0 {
            offset += diag * l.strides[b];
        } else {
            offset -= diag * l.strides[a];
        }
    }
    let stride = l.strides[a] + l.strides[b];
    let mut sizes = Dims::new();
    let mut strides = Dims::new();
    for d in 0..l.rank() {
        if d != a && d != b {
            sizes.push(l.sizes[d]);
            strides.push(l.strides[d]);
        }
    }
    sizes.push(size);
    strides.push(stride);
    Layout {
        elem_size: l.elem_size,
        sizes,
        strides,
        offset,
    }
}

/// `unsqueeze(dim)`, with PyTorch's stride for the new dim.
pub fn unsqueeze(l: &Layout, dim: usize) -> Layout {
    let stride = if dim < l.rank() {
        l.sizes[dim] * l.strides[dim]
    } else {
        1
    };
    let mut out = l.clone();
    out.sizes.insert(dim, 1);
    out.strides.insert(dim, stride);
    out
}

/// `expand` of a size-1 dim to `size`.
pub fn expand(l: &Layout, dim: usize, size: i64) -> Layout {
    assert_eq!(l.sizes[dim], 1);
    let mut out = l.clone();
    out.sizes[dim] = size;
    out.strides[dim] = 0;
    out
}

/// `unflatten(dim, (outer, size / outer))`.
pub fn unflatten(l: &Layout, dim: usize, outer: i64) -> Layout {
    let inner = l.sizes[dim] / outer;
    assert_eq!(outer * inner, l.sizes[dim]);
    let mut out = l.clone();
    out.sizes[dim] = inner;
    out.sizes.insert(dim, outer);
    out.strides.insert(dim, l.strides[dim] * inner);
    out
}

/// `view(dtype)` to elements of `elem_size` bytes, or `None` where PyTorch refuses.
pub fn view_dtype(l: &Layout, elem_size: usize) -> Option<Layout> {
    if elem_size == l.elem_size {
        return Some(Layout {
            elem_size,
            ..l.clone()
        });
    }
    let rank = l.rank();
    if rank == 0 || l.strides[rank - 1] != 1 {
        return None;
    }
    let mut out = l.clone();
    out.elem_size = elem_size;
    if elem_size < l.elem_size {
        let ratio = (l.elem_size / elem_size) as i64;
        for d in 0..rank - 1 {
            out.strides[d] *= ratio;
        }
        out.sizes[rank - 1] *= ratio;
        out.offset *= ratio;
    } else {
        let ratio = (elem_size / l.elem_size) as i64;
        if l.sizes[rank - 1] % ratio != 0
            || l.offset % ratio != 0
            || l.strides[..rank - 1].iter().any(|s| s % ratio != 0)
        {
            return None;
        }
        for d in 0..rank - 1 {
            out.strides[d] /= ratio;
        }
        out.sizes[rank - 1] /= ratio;
        out.offset /= ratio;
    }
    Some(out)
}

// ---- random view programs ----

/// One PyTorch view call with raw random parameters, interpreted modulo the current layout.
#[derive(Clone, Debug)]
pub enum ViewCall {
    Slice {
        dim: u8,
        start: u8,
        len: u8,
        step: u8,
    },
    Narrow {
        dim: u8,
        start: u8,
        len: u8,
    },
    Select {
        dim: u8,
        index: u8,
    },
    Unbind {
        dim: u8,
        which: u8,
    },
    Split {
        dim: u8,
        chunk: u8,
        which: u8,
    },
    Permute {
        seed: u32,
    },
    Transpose {
        a: u8,
        b: u8,
    },
    T,
    Diagonal {
        diag: i8,
        a: u8,
        b: u8,
    },
    Unsqueeze {
        dim: u8,
    },
    Expand {
        dim: u8,
        size: u8,
    },
    Unflatten {
        dim: u8,
        outer: u8,
    },
    ViewDtype {
        log2_size: u8,
    },
}

impl ViewCall {
    pub fn is_expand(&self) -> bool {
        matches!(self, ViewCall::Expand { .. })
    }
}

/// A range within `size`, rarely empty.
fn start_and_len(size: i64, start: u8, len: u8) -> (i64, i64) {
    let start = start as i64 % (size + 1);
    if start == size {
        return (start, 0);
    }
    (start, 1 + len as i64 % (size - start))
}

fn pick(value: u8, count: usize) -> usize {
    value as usize % count
}

/// Applies the call where PyTorch would accept it; otherwise leaves the layout alone.
pub fn apply(l: &Layout, call: &ViewCall) -> Layout {
    let rank = l.rank();
    match *call {
        ViewCall::Slice {
            dim,
            start,
            len,
            step,
        } if rank > 0 => {
            let d = pick(dim, rank);
            let size = l.sizes[d];
            let (start, len) = start_and_len(size, start, len);
            slice(l, d, start, start + len, 1 + step as i64 % 3)
        }
        ViewCall::Narrow { dim, start, len } if rank > 0 => {
            let d = pick(dim, rank);
            let size = l.sizes[d];
            let (start, len) = start_and_len(size, start, len);
            narrow(l, d, start, len)
        }
        ViewCall::Select { dim, index } | ViewCall::Unbind { dim, which: index } if rank > 0 => {
            let d = pick(dim, rank);
            if l.sizes[d] == 0 {
                return l.clone();
            }
            select(l, d, index as i64 % l.sizes[d])
        }
        ViewCall::Split { dim, chunk, which } if rank > 0 => {
            let d = pick(dim, rank);
            let size = l.sizes[d];
            let chunk = 1 + chunk as i64 % size.max(1);
            let pieces = (size + chunk - 1) / chunk;
            if pieces == 0 {
                return l.clone();
            }
            let start = (which as i64 % pieces) * chunk;
            narrow(l, d, start, chunk.min(size - start))
        }
        ViewCall::Permute { seed } => {
            let mut perm: Vec<usize> = (0..rank).collect();
            let mut s = seed as usize;
            for i in (1..rank).rev() {
                perm.swap(i, s % (i + 1));
                s /= i + 1;
            }
            permute(l, &perm)
        }
        ViewCall::Transpose { a, b } if rank > 0 => transpose(l, pick(a, rank), pick(b, rank)),
        ViewCall::T if rank == 2 => transpose(l, 0, 1),
        ViewCall::Diagonal { diag, a, b } if rank >= 2 => {
            let a = pick(a, rank);
            let mut b = pick(b, rank - 1);
            if b >= a {
                b += 1;
            }
            diagonal(l, diag as i64 % 3, a, b)
        }
        ViewCall::Unsqueeze { dim } if rank < 5 => unsqueeze(l, pick(dim, rank + 1)),
        ViewCall::Expand { dim, size } => {
            let ones: Vec<usize> = (0..rank).filter(|&d| l.sizes[d] == 1).collect();
            if ones.is_empty() {
                return l.clone();
            }
            expand(l, ones[pick(dim, ones.len())], 1 + size as i64 % 4)
        }
        ViewCall::Unflatten { dim, outer } if rank > 0 && rank < 5 => {
            let d = pick(dim, rank);
            let size = l.sizes[d];
            let divisors: Vec<i64> = (1..=size).filter(|o| size % o == 0).collect();
            if divisors.is_empty() {
                return l.clone();
            }
            unflatten(l, d, divisors[pick(outer, divisors.len())])
        }
        ViewCall::ViewDtype { log2_size } => {
            view_dtype(l, 1 << (log2_size % 4)).unwrap_or_else(|| l.clone())
        }
        _ => l.clone(),
    }
}

pub fn view_call() -> impl Strategy<Value = ViewCall> {
    prop_oneof![
        3 => (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>())
            .prop_map(|(dim, start, len, step)| ViewCall::Slice { dim, start, len, step }),
        1 => (any::<u8>(), any::<u8>(), any::<u8>())
            .prop_map(|(dim, start, len)| ViewCall::Narrow { dim, start, len }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(dim, index)| ViewCall::Select { dim, index }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(dim, which)| ViewCall::Unbind { dim, which }),
        1 => (any::<u8>(), any::<u8>(), any::<u8>())
            .prop_map(|(dim, chunk, which)| ViewCall::Split { dim, chunk, which }),
        2 => any::<u32>().prop_map(|seed| ViewCall::Permute { seed }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| ViewCall::Transpose { a, b }),
        1 => Just(ViewCall::T),
        2 => (any::<i8>(), any::<u8>(), any::<u8>())
            .prop_map(|(diag, a, b)| ViewCall::Diagonal { diag, a, b }),
        1 => any::<u8>().prop_map(|dim| ViewCall::Unsqueeze { dim }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(dim, size)| ViewCall::Expand { dim, size }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(dim, outer)| ViewCall::Unflatten { dim, outer }),
        2 => any::<u8>().prop_map(|log2_size| ViewCall::ViewDtype { log2_size }),
    ]
}

/// A base storage and a tensor on it reached through PyTorch view calls.
#[derive(Clone, Debug)]
pub struct ViewCase {
    pub base_len: i64,
    pub base_elem_size: usize,
    pub start: Layout,
    pub calls: Vec<ViewCall>,
    pub view: Layout,
    pub seed: u64,
}

pub fn view_case() -> impl Strategy<Value = ViewCase> {
    (
        0u32..4,
        prop::collection::vec(1i64..8, 0..5),
        0i64..3,
        0i64..3,
        prop::collection::vec(view_call(), 0..5),
        any::<u64>(),
    )
        .prop_map(|(log2_elem, sizes, offset, tail, calls, seed)| {
            let base_elem_size = 1usize << log2_elem;
            let mut start = Layout::contiguous(base_elem_size, &sizes);
            start.offset = offset;
            let base_len = offset + start.numel() + tail;
            let view = calls.iter().fold(start.clone(), |l, c| apply(&l, c));
            ViewCase {
                base_len,
                base_elem_size,
                start,
                calls,
                view,
                seed,
            }
        })
}

/// A random `as_strided` layout in bounds of a base of the returned length.
#[derive(Clone, Debug)]
pub struct StridedCase {
    pub base_len: i64,
    pub base_elem_size: usize,
    pub view: Layout,
    pub seed: u64,
}

pub fn strided_case() -> impl Strategy<Value = StridedCase> {
    (
        0u32..4,
        0u32..4,
        prop::collection::vec((0i64..5, 0i64..9), 0..5),
        0i64..12,
        0i64..6,
        any::<u64>(),
    )
        .prop_map(|(log2_base, log2_view, dims, offset, tail, seed)| {
            let base_elem_size = 1usize << log2_base;
            let elem_size = 1usize << log2_view;
            let sizes: Vec<i64> = dims.iter().map(|d| d.0).collect();
            let strides: Vec<i64> = dims.iter().map(|d| d.1).collect();
            let view = Layout::new(elem_size, &sizes, &strides, offset);
            let last = if view.numel() == 0 {
                0
            } else {
                view.last_index().unwrap() + 1
            };
            let bytes = (last + tail) * elem_size as i64;
            let base_len = (bytes + base_elem_size as i64 - 1) / base_elem_size as i64;
            StridedCase {
                base_len,
                base_elem_size,
                view,
                seed,
            }
        })
}
