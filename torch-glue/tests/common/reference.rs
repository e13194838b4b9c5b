//! A small f64 reference for engine values: row-major tensors with PyTorch's broadcasting,
//! reductions, matrix products, concatenation, softmax and nll_loss semantics.

/// A row-major f64 tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Ref {
    pub shape: Vec<i64>,
    pub data: Vec<f64>,
}

fn strides(shape: &[i64]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as usize;
    }
    s
}

fn unravel(mut flat: usize, shape: &[i64]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = flat % shape[d] as usize;
        flat /= shape[d] as usize;
    }
    idx
}

/// PyTorch's broadcast of two shapes.
pub fn broadcast_shape(a: &[i64], b: &[i64]) -> Vec<i64> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let x = if i + a.len() >= n {
                a[i + a.len() - n]
            } else {
                1
            };
            let y = if i + b.len() >= n {
                b[i + b.len() - n]
            } else {
                1
            };
            assert!(
                x == y || x == 1 || y == 1,
                "shapes {a:?} and {b:?} do not broadcast"
            );
            x.max(y)
        })
        .collect()
}

impl Ref {
    pub fn new(shape: &[i64], data: Vec<f64>) -> Ref {
        assert_eq!(shape.iter().product::<i64>() as usize, data.len());
        Ref {
            shape: shape.to_vec(),
            data,
        }
    }

    pub fn scalar(x: f64) -> Ref {
        Ref::new(&[], vec![x])
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The element of this tensor that broadcasts to index `idx` of `shape`.
    fn at_broadcast(&self, idx: &[usize], shape: &[i64]) -> f64 {
        let offset = shape.len() - self.shape.len();
        let st = strides(&self.shape);
        let flat: usize = self
            .shape
            .iter()
            .enumerate()
            .map(|(d, &size)| {
                if size == 1 {
                    0
                } else {
                    idx[d + offset] * st[d]
                }
            })
            .sum();
        self.data[flat]
    }

    pub fn map(&self, f: impl Fn(f64) -> f64) -> Ref {
        Ref::new(&self.shape, self.data.iter().map(|&x| f(x)).collect())
    }

    /// Element-wise `f(self, other)` with broadcasting.
    pub fn zip(&self, other: &Ref, f: impl Fn(f64, f64) -> f64) -> Ref {
        let shape = broadcast_shape(&self.shape, &other.shape);
        let n: i64 = shape.iter().product();
        let data = (0..n as usize)
            .map(|i| {
                let idx = unravel(i, &shape);
                f(
                    self.at_broadcast(&idx, &shape),
                    other.at_broadcast(&idx, &shape),
                )
            })
            .collect();
        Ref::new(&shape, data)
    }

    /// Reduces `dims` (all when empty) with `f` over each group's values, in index order.
    pub fn reduce(&self, dims: &[usize], keepdim: bool, f: impl Fn(&[f64]) -> f64) -> Ref {
        let dims: Vec<usize> = if dims.is_empty() {
            (0..self.shape.len()).collect()
        } else {
            dims.to_vec()
        };
        let kept: Vec<usize> = (0..self.shape.len())
            .filter(|d| !dims.contains(d))
            .collect();
        let kept_shape: Vec<i64> = kept.iter().map(|&d| self.shape[d]).collect();
        let n_out: i64 = kept_shape.iter().product();
        let out_strides = strides(&kept_shape);
        let mut groups = vec![Vec::new(); n_out as usize];
        for (i, &v) in self.data.iter().enumerate() {
            let idx = unravel(i, &self.shape);
            let o: usize = kept
                .iter()
                .enumerate()
                .map(|(j, &d)| idx[d] * out_strides[j])
                .sum();
            groups[o].push(v);
        }
        let shape: Vec<i64> = if keepdim {
            (0..self.shape.len())
                .map(|d| if dims.contains(&d) { 1 } else { self.shape[d] })
                .collect()
        } else {
            kept_shape
        };
        Ref::new(&shape, groups.iter().map(|g| f(g)).collect())
    }

    /// The reduction's error scale: the sum of the magnitudes of each group's terms.
    pub fn abs_sum(&self, dims: &[usize], keepdim: bool) -> Ref {
        self.reduce(dims, keepdim, |g| g.iter().map(|v| v.abs()).sum())
    }

    pub fn sum(&self, dims: &[usize], keepdim: bool) -> Ref {
        self.reduce(dims, keepdim, |g| g.iter().sum())
    }

    pub fn mean(&self, dims: &[usize], keepdim: bool) -> Ref {
        self.reduce(dims, keepdim, |g| g.iter().sum::<f64>() / g.len() as f64)
    }

    pub fn amax(&self, dims: &[usize], keepdim: bool) -> Ref {
        self.reduce(dims, keepdim, |g| {
            g.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
        })
    }

    /// `self @ other` for 2-d tensors.
    pub fn matmul(&self, other: &Ref) -> Ref {
        assert_eq!(self.shape.len(), 2);
        assert_eq!(other.shape.len(), 2);
        let (m, k, n) = (
            self.shape[0] as usize,
            self.shape[1] as usize,
            other.shape[1] as usize,
        );
        assert_eq!(k, other.shape[0] as usize);
        let mut data = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                data[i * n + j] = (0..k)
                    .map(|p| self.data[i * k + p] * other.data[p * n + j])
                    .sum();
            }
        }
        Ref::new(&[m as i64, n as i64], data)
    }

    /// The error scale of `self @ other`: `|self| @ |other|`.
    pub fn matmul_abs(&self, other: &Ref) -> Ref {
        self.map(f64::abs).matmul(&other.map(f64::abs))
    }

    pub fn transpose2(&self) -> Ref {
        let (r, c) = (self.shape[0] as usize, self.shape[1] as usize);
        let mut data = vec![0.0; r * c];
        for i in 0..r {
            for j in 0..c {
                data[j * r + i] = self.data[i * c + j];
            }
        }
        Ref::new(&[c as i64, r as i64], data)
    }

    /// Concatenation along `dim`.
    pub fn cat(parts: &[&Ref], dim: usize) -> Ref {
        let mut shape = parts[0].shape.clone();
        shape[dim] = parts.iter().map(|p| p.shape[dim]).sum();
        let outer: i64 = shape[..dim].iter().product();
        let mut data = Vec::with_capacity(shape.iter().product::<i64>() as usize);
        for o in 0..outer as usize {
            for p in parts {
                let inner: i64 = p.shape[dim..].iter().product();
                let inner = inner as usize;
                data.extend_from_slice(&p.data[o * inner..(o + 1) * inner]);
            }
        }
        Ref::new(&shape, data)
    }

    /// Values along `dim` grouped per lane, transformed by `f`, put back in place.
    fn along(&self, dim: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> Ref {
        let st = strides(&self.shape);
        let len = self.shape[dim] as usize;
        let mut out = self.data.clone();
        for start in 0..self.data.len() {
            if unravel(start, &self.shape)[dim] != 0 {
                continue;
            }
            let lane: Vec<f64> = (0..len).map(|i| self.data[start + i * st[dim]]).collect();
            for (i, v) in f(&lane).into_iter().enumerate() {
                out[start + i * st[dim]] = v;
            }
        }
        Ref::new(&self.shape, out)
    }

    pub fn softmax(&self, dim: usize) -> Ref {
        self.along(dim, |lane| {
            let m = lane.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = lane.iter().map(|x| (x - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.iter().map(|x| x / s).collect()
        })
    }

    pub fn log_softmax(&self, dim: usize) -> Ref {
        self.along(dim, |lane| {
            let m = lane.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + lane.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            lane.iter().map(|x| x - lse).collect()
        })
    }

    /// `nll_loss` of log-probabilities `[N, C]` and class targets `[N]`: reduction 0 = none,
    /// 1 = mean, 2 = sum; returns `(output, total_weight)` (PyTorch leaves `total_weight` 0 for
    /// reduction none).
    pub fn nll_loss(&self, target: &[i64], reduction: i64, ignore_index: i64) -> (Ref, f64) {
        let c = self.shape[1] as usize;
        let mut losses = Vec::new();
        let mut total_weight = 0.0;
        for (n, &t) in target.iter().enumerate() {
            if t == ignore_index {
                losses.push(0.0);
            } else {
                losses.push(-self.data[n * c + t as usize]);
                total_weight += 1.0;
            }
        }
        let out = match reduction {
            0 => return (Ref::new(&[target.len() as i64], losses), 0.0),
            1 => Ref::scalar(losses.iter().sum::<f64>() / total_weight),
            _ => Ref::scalar(losses.iter().sum::<f64>()),
        };
        (out, total_weight)
    }
}
