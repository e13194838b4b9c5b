//! Value tests of reductions, matrix products, shape/indexing ops and backward ops on the XLA
//! CPU PJRT plugin against small f64 references.

mod common;

use common::*;
use ops::{dtype_param, f64_param, DType, OpId, ScalarArg, TensorType};

/// Row-major strides of `shape`.
fn strides(shape: &[i64]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as usize;
    }
    s
}

fn unravel(mut i: usize, shape: &[i64]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d] as usize;
        i /= shape[d] as usize;
    }
    idx
}

/// Reduce `x` over `dims` with `f` applied to each group's values (in index order).
fn reduce_ref(x: &Host, dims: &[usize], f: &dyn Fn(&[f64]) -> f64) -> Vec<f64> {
    let shape = &x.ty.shape;
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
    let out_shape: Vec<i64> = kept.iter().map(|&d| shape[d]).collect();
    let n_out: i64 = out_shape.iter().product();
    let mut groups = vec![Vec::new(); n_out as usize];
    let out_strides = strides(&out_shape);
    for (i, &v) in x.data.iter().enumerate() {
        let idx = unravel(i, shape);
        let o: usize = kept
            .iter()
            .enumerate()
            .map(|(j, &d)| idx[d] * out_strides[j])
            .sum();
        groups[o].push(v);
    }
    groups.iter().map(|g| f(g)).collect()
}

/// A reduction's f64 reference over each group of elements that `dims` gathers.
type RefFn<'a> = Box<dyn Fn(&[f64]) -> f64 + 'a>;

/// Runs each case in one batch and compares its output with `reduce_ref` over its reduced
/// `dims`, within the tolerance scaled by its factor.
fn check_reductions(cases: &[(Case, Vec<usize>, RefFn, f64)]) {
    let batch: Vec<Case> = cases.iter().map(|c| c.0.clone()).collect();
    let mut failures = Vec::new();
    for ((case, dims, f, scale), out) in cases.iter().zip(run_batch(&batch)) {
        let got = &out[0];
        let want: Vec<f64> = reduce_ref(&case.inputs[0], dims, f.as_ref())
            .into_iter()
            .map(|v| round_to(got.ty.dtype, v))
            .collect();
        if let Err(e) = compare(
            &format!("{} {:?} {}", case.op, case.params, case.inputs[0].ty),
            got,
            &got.ty.clone(),
            &want,
            *scale,
        ) {
            failures.push(e);
        }
    }
    report(failures);
}

#[test]
fn reductions() {
    use OpId::*;
    let x = Host::random(DType::F32, &[3, 4, 5], -2.0, 2.0, 1);
    let xb = Host::random(DType::BF16, &[3, 4, 5], -2.0, 2.0, 2);
    let xi = Host::random(DType::I32, &[3, 4], -5.0, 5.0, 3);
    let mut xn = Host::random(DType::F32, &[2, 5], -2.0, 2.0, 4);
    xn.data[3] = f64::NAN;
    xn.data[7] = 5.0;
    xn.data[8] = 5.0;
    let none = dtype_param(None);
    let sum = |g: &[f64]| g.iter().sum::<f64>();
    let mean = |g: &[f64]| g.iter().sum::<f64>() / g.len() as f64;
    let var = |c: f64| {
        move |g: &[f64]| {
            let m = g.iter().sum::<f64>() / g.len() as f64;
            g.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (g.len() as f64 - c)
        }
    };
    let amax = |g: &[f64]| {
        g.iter().cloned().fold(f64::NEG_INFINITY, |a, b| {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        })
    };
    let argmax = |g: &[f64]| {
        let mut best = 0;
        for (i, &v) in g.iter().enumerate() {
            let b = g[best];
            if !b.is_nan() && (v.is_nan() || v > b) {
                best = i;
            }
        }
        best as f64
    };
    let argmin = |g: &[f64]| {
        let mut best = 0;
        for (i, &v) in g.iter().enumerate() {
            let b = g[best];
            if !b.is_nan() && (v.is_nan() || v < b) {
                best = i;
            }
        }
        best as f64
    };
    let lse = |g: &[f64]| {
        let m = g.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        g.iter().map(|v| (v - m).exp()).sum::<f64>().ln() + m
    };
    let cases: Vec<(Case, Vec<usize>, RefFn, f64)> = vec![
        (
            Case::new(Sum, vec![x.clone()], vec![], vec![0, none, 1]),
            vec![1],
            Box::new(sum),
            2.0,
        ),
        (
            Case::new(Sum, vec![x.clone()], vec![], vec![1, none]),
            vec![0, 1, 2],
            Box::new(sum),
            8.0,
        ),
        (
            Case::new(Sum, vec![xb.clone()], vec![], vec![0, none, 0, 2]),
            vec![0, 2],
            Box::new(sum),
            1.0,
        ),
        (
            Case::new(Sum, vec![xi.clone()], vec![], vec![0, none, -1]),
            vec![1],
            Box::new(sum),
            1.0,
        ),
        (
            Case::new(Mean, vec![x.clone()], vec![], vec![1, none, -1]),
            vec![2],
            Box::new(mean),
            2.0,
        ),
        (
            Case::new(Prod, vec![xi.clone()], vec![], vec![0, none, 0]),
            vec![0],
            Box::new(|g: &[f64]| g.iter().product()),
            1.0,
        ),
        (
            Case::new(Amax, vec![xn.clone()], vec![], vec![0, 1]),
            vec![1],
            Box::new(amax),
            1.0,
        ),
        (
            Case::new(Amin, vec![x.clone()], vec![], vec![0, 0, 2]),
            vec![0, 2],
            Box::new(|g: &[f64]| g.iter().cloned().fold(f64::INFINITY, f64::min)),
            1.0,
        ),
        (
            Case::new(Argmax, vec![xn.clone()], vec![], vec![0, 1]),
            vec![1],
            Box::new(argmax),
            1.0,
        ),
        (
            Case::new(Argmin, vec![x.clone()], vec![], vec![0]),
            vec![0, 1, 2],
            Box::new(argmin),
            1.0,
        ),
        (
            Case::new(Argmax, vec![xi.clone()], vec![], vec![1, 0]),
            vec![0],
            Box::new(argmax),
            1.0,
        ),
        (
            Case::new(Any, vec![xi.clone()], vec![], vec![0, 1]),
            vec![1],
            Box::new(|g: &[f64]| g.iter().any(|&v| v != 0.0) as i64 as f64),
            1.0,
        ),
        (
            Case::new(All, vec![xi.clone()], vec![], vec![0]),
            vec![0, 1],
            Box::new(|g: &[f64]| g.iter().all(|&v| v != 0.0) as i64 as f64),
            1.0,
        ),
        (
            Case::new(Var, vec![x.clone()], vec![], vec![0, f64_param(1.0), 1]),
            vec![1],
            Box::new(var(1.0)),
            4.0,
        ),
        (
            Case::new(Std, vec![x.clone()], vec![], vec![0, f64_param(0.0), 0, 2]),
            vec![0, 2],
            Box::new(move |g: &[f64]| var(0.0)(g).sqrt()),
            4.0,
        ),
        (
            Case::new(Logsumexp, vec![x.clone()], vec![], vec![0, 2]),
            vec![2],
            Box::new(lse),
            4.0,
        ),
        (
            Case::new(
                Norm,
                vec![x.clone()],
                vec![],
                vec![0, none, f64_param(2.0), 1],
            ),
            vec![1],
            Box::new(|g: &[f64]| g.iter().map(|v| v * v).sum::<f64>().sqrt()),
            4.0,
        ),
        (
            Case::new(Norm, vec![x.clone()], vec![], vec![0, none, f64_param(1.0)]),
            vec![0, 1, 2],
            Box::new(|g: &[f64]| g.iter().map(|v| v.abs()).sum::<f64>()),
            8.0,
        ),
        (
            Case::new(
                Norm,
                vec![x.clone()],
                vec![],
                vec![0, none, f64_param(f64::INFINITY), 2],
            ),
            vec![2],
            Box::new(|g: &[f64]| g.iter().map(|v| v.abs()).fold(0.0, f64::max)),
            1.0,
        ),
        (
            Case::new(
                Norm,
                vec![x.clone()],
                vec![],
                vec![0, none, f64_param(3.0), 0],
            ),
            vec![0],
            Box::new(|g: &[f64]| g.iter().map(|v| v.abs().powi(3)).sum::<f64>().cbrt()),
            8.0,
        ),
    ];
    check_reductions(&cases);
}

/// Sums over thousands of trailing elements run in two stages (groups of 32, zero-padded, then
/// the partial sums): values, mean and variance on top of them, sums over other dims, and the
/// special values.
#[test]
fn long_sums_in_two_stages() {
    use OpId::*;
    let none = dtype_param(None);
    let rows = Host::random(DType::F32, &[3, 5000], -2.0, 2.0, 21);
    let cube = Host::random(DType::F32, &[2, 64, 128], -2.0, 2.0, 22);
    let tall = Host::random(DType::F32, &[5000, 3], -2.0, 2.0, 23);
    let halves = Host::random(DType::BF16, &[4104], -2.0, 2.0, 24);
    let sum = |g: &[f64]| g.iter().sum::<f64>();
    let mean = |g: &[f64]| g.iter().sum::<f64>() / g.len() as f64;
    let var = |g: &[f64]| {
        let m = g.iter().sum::<f64>() / g.len() as f64;
        g.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (g.len() as f64 - 1.0)
    };
    let cases: Vec<(Case, Vec<usize>, RefFn, f64)> = vec![
        (
            Case::new(Sum, vec![rows.clone()], vec![], vec![0, none, 1]),
            vec![1],
            Box::new(sum),
            64.0,
        ),
        (
            Case::new(Sum, vec![cube.clone()], vec![], vec![1, none, 1, 2]),
            vec![1, 2],
            Box::new(sum),
            64.0,
        ),
        (
            Case::new(Sum, vec![tall.clone()], vec![], vec![0, none, 0]),
            vec![0],
            Box::new(sum),
            64.0,
        ),
        (
            Case::new(Sum, vec![halves.clone()], vec![], vec![0, none]),
            vec![0],
            Box::new(sum),
            8.0,
        ),
        (
            Case::new(Mean, vec![rows.clone()], vec![], vec![0, none, -1]),
            vec![1],
            Box::new(mean),
            8.0,
        ),
        (
            Case::new(Var, vec![rows.clone()], vec![], vec![0, f64_param(1.0), 1]),
            vec![1],
            Box::new(var),
            8.0,
        ),
    ];
    check_reductions(&cases);

    // A NaN or an infinity anywhere reaches the sum; negative zeros sum to +0.0, as in PyTorch.
    let n = 4104;
    let mut with_nan = vec![1.0; n];
    with_nan[4100] = f64::NAN;
    let mut with_inf = vec![1.0; n];
    with_inf[17] = f64::INFINITY;
    let zeros = vec![-0.0; n];
    let special: Vec<Case> = [with_nan, with_inf, zeros]
        .iter()
        .map(|data| {
            Case::new(
                Sum,
                vec![Host::new(DType::F32, &[n as i64], data)],
                vec![],
                vec![0, none],
            )
        })
        .collect();
    let out = run_batch(&special);
    assert!(out[0][0].data[0].is_nan(), "{:?}", out[0][0].data);
    assert_eq!(out[1][0].data[0], f64::INFINITY);
    assert_eq!(out[2][0].data[0], 0.0);
    assert!(
        out[2][0].data[0].is_sign_positive(),
        "the sum of -0.0s is +0.0"
    );
}

/// `_safe_softmax`: rows that are all -inf give zeros; a NaN row stays NaN; with a dtype
/// conversion, the input's own -inf decide (values that only overflow to -inf in the result
/// dtype do not zero their row).
#[test]
fn safe_softmax_rows() {
    let inf = f64::INFINITY;
    let nan = f64::NAN;
    let data = [
        [1.0, 2.0, 3.0, 4.0],
        [-inf, -inf, -inf, -inf],
        [nan, -inf, 1.0, 2.0],
        [-inf, -inf, 0.0, -inf],
    ];
    let flat: Vec<f64> = data.iter().flatten().cloned().collect();
    let x = Host::new(DType::F32, &[4, 4], &flat);
    let wide = Host::new(
        DType::F64,
        &[2, 4],
        &[-1e300, -1e300, -1e300, -1e300, -inf, -inf, -inf, -inf],
    );
    let out = run_batch(&[
        Case::new(
            OpId::SafeSoftmax,
            vec![x],
            vec![],
            vec![1, dtype_param(None)],
        ),
        Case::new(
            OpId::SafeSoftmax,
            vec![wide],
            vec![],
            vec![-1, dtype_param(Some(DType::F32))],
        ),
    ]);
    let mut want = softmax_rows(&data[0], 4, false);
    want.extend([0.0; 4]);
    want.extend([nan; 4]);
    want.extend([0.0, 0.0, 1.0, 0.0]);
    report(
        compare(
            "_safe_softmax",
            &out[0][0],
            &TensorType::new(DType::F32, &[4, 4]),
            &want,
            2.0,
        )
        .err()
        .into_iter()
        .collect(),
    );
    let got = &out[1][0].data;
    assert!(
        got[..4].iter().all(|v| v.is_nan()),
        "-1e300 overflows to -inf: {got:?}"
    );
    assert_eq!(&got[4..], &[0.0; 4], "a row of -inf gives zeros");
}

fn softmax_rows(x: &[f64], n: usize, log: bool) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|row| {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
            row.iter()
                .map(move |v| {
                    if log {
                        v - m - s.ln()
                    } else {
                        (v - m).exp() / s
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn matmul_ref(a: &[f64], b: &[f64], n: usize, k: usize, p: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * p];
    for i in 0..n {
        for j in 0..p {
            out[i * p + j] = (0..k).map(|t| a[i * k + t] * b[t * p + j]).sum();
        }
    }
    out
}

#[test]
fn softmax_and_matrix_products() {
    use OpId::*;
    let x = Host::random(DType::F32, &[3, 5], -4.0, 4.0, 10);
    let xb = Host::random(DType::BF16, &[3, 5], -4.0, 4.0, 11);
    let a = Host::random(DType::F32, &[2, 3, 4], -1.0, 1.0, 12);
    let b = Host::random(DType::F32, &[2, 4, 5], -1.0, 1.0, 13);
    let m = Host::random(DType::F32, &[4, 5], -1.0, 1.0, 14);
    let v = Host::random(DType::F32, &[4], -1.0, 1.0, 15);
    let c = Host::random(DType::F32, &[5], -1.0, 1.0, 16);
    let ai = Host::random(DType::I64, &[3, 4], -3.0, 3.0, 17);
    let bi = Host::random(DType::I64, &[4, 2], -3.0, 3.0, 18);
    let a0 = Host::new(DType::F32, &[3, 4], &a.data[..12]);
    let cases = vec![
        Case::new(Softmax, vec![x.clone()], vec![], vec![1, 0]),
        Case::new(LogSoftmax, vec![x.clone()], vec![], vec![-1, 0]),
        Case::new(Softmax, vec![xb.clone()], vec![], vec![1, 0]),
        Case::new(Mm, vec![a0.clone(), m.clone()], vec![], vec![]),
        Case::new(Bmm, vec![a.clone(), b.clone()], vec![], vec![]),
        Case::new(Matmul, vec![a.clone(), m.clone()], vec![], vec![]),
        Case::new(Matmul, vec![a.clone(), v.clone()], vec![], vec![]),
        Case::new(Matmul, vec![v.clone(), b.clone()], vec![], vec![]),
        Case::new(Dot, vec![v.clone(), v.clone()], vec![], vec![]),
        Case::new(
            Addmm,
            vec![c.clone(), a0.clone(), m.clone()],
            vec![ScalarArg::float(0.5), ScalarArg::float(2.0)],
            vec![],
        ),
        Case::new(
            Baddbmm,
            vec![c.clone(), a.clone(), b.clone()],
            vec![ScalarArg::float(0.0), ScalarArg::float(1.0)],
            vec![],
        ),
        Case::new(Mm, vec![ai.clone(), bi.clone()], vec![], vec![]),
    ];
    let mm0 = matmul_ref(&a.data[..12], &m.data, 3, 4, 5);
    let mut bmm = matmul_ref(&a.data[..12], &b.data[..20], 3, 4, 5);
    bmm.extend(matmul_ref(&a.data[12..], &b.data[20..], 3, 4, 5));
    let mut am = mm0.clone();
    am.extend(matmul_ref(&a.data[12..], &m.data, 3, 4, 5));
    let av: Vec<f64> = a
        .data
        .chunks(4)
        .map(|r| r.iter().zip(&v.data).map(|(x, y)| x * y).sum())
        .collect();
    let mut vb = matmul_ref(&v.data, &b.data[..20], 1, 4, 5);
    vb.extend(matmul_ref(&v.data, &b.data[20..], 1, 4, 5));
    let dot: f64 = v.data.iter().map(|x| x * x).sum();
    let addmm: Vec<f64> = mm0
        .iter()
        .enumerate()
        .map(|(i, p)| 0.5 * c.data[i % 5] + 2.0 * p)
        .collect();
    let wants = vec![
        softmax_rows(&x.data, 5, false),
        softmax_rows(&x.data, 5, true),
        softmax_rows(&xb.data, 5, false),
        mm0.clone(),
        bmm.clone(),
        am,
        av,
        vb,
        vec![dot],
        addmm,
        bmm,
        matmul_ref(&ai.data, &bi.data, 3, 4, 2),
    ];
    let mut failures = Vec::new();
    for ((case, out), want) in cases.iter().zip(run_batch(&cases)).zip(wants) {
        let got = &out[0];
        let want: Vec<f64> = want.iter().map(|&v| round_to(got.ty.dtype, v)).collect();
        if let Err(e) = compare(
            &format!("{} {:?}", case.op, case.params),
            got,
            &got.ty.clone(),
            &want,
            8.0,
        ) {
            failures.push(e);
        }
    }
    report(failures);
}

#[test]
fn shape_and_indexing_ops() {
    use OpId::*;
    let x = Host::new(DType::F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = Host::new(DType::I32, &[2, 1], &[7.0, 8.0]);
    let idx = Host::new(DType::I64, &[2, 2], &[2.0, 0.0, 1.0, 1.0]);
    let rows = Host::new(DType::I64, &[3], &[1.0, 0.0, 1.0]);
    let src = Host::new(DType::F32, &[2, 3], &[10.0, 20.0, 30.0, 40.0, 50.0, 60.0]);
    let w = Host::new(
        DType::F32,
        &[4, 2],
        &[0.0, 1.0, 10.0, 11.0, 20.0, 21.0, 30.0, 31.0],
    );
    let ids = Host::new(DType::I32, &[3], &[3.0, 0.0, 3.0]);
    let m = Host::random(DType::F32, &[3, 4], -1.0, 1.0, 20);
    let cases = vec![
        Case::new(Cat, vec![x.clone(), y.clone()], vec![], vec![1]),
        Case::new(Stack, vec![x.clone(), x.clone()], vec![], vec![2]),
        Case::new(Flip, vec![x.clone()], vec![], vec![0, 1]),
        Case::new(Flip, vec![x.clone()], vec![], vec![]),
        Case::new(Roll, vec![x.clone()], vec![], vec![1, 1, 1]),
        Case::new(Roll, vec![x.clone()], vec![], vec![1, -2]),
        Case::new(
            ConstantPadNd,
            vec![x.clone()],
            vec![ScalarArg::float(-1.0)],
            vec![1, -1, 0, 1],
        ),
        Case::new(Repeat, vec![y.clone()], vec![], vec![2, 1, 2]),
        Case::new(Tril, vec![m.clone()], vec![], vec![0]),
        Case::new(Triu, vec![m.clone()], vec![], vec![1]),
        Case::new(Gather, vec![x.clone(), idx.clone()], vec![], vec![1]),
        Case::new(IndexSelect, vec![x.clone(), rows.clone()], vec![], vec![0]),
        Case::new(
            Scatter,
            vec![x.clone(), idx.clone(), src.clone()],
            vec![],
            vec![1],
        ),
        Case::new(
            Scatter,
            vec![x.clone(), idx.clone()],
            vec![ScalarArg::float(-5.0)],
            vec![1],
        ),
        Case::new(
            ScatterAdd,
            vec![x.clone(), idx.clone(), src.clone()],
            vec![],
            vec![1],
        ),
        Case::new(Embedding, vec![w.clone(), ids.clone()], vec![], vec![]),
        Case::new(Expand, vec![y.clone()], vec![], vec![2, -1, 3]),
        Case::new(SumToSize, vec![x.clone()], vec![], vec![1, 3]),
        Case::new(Reshape, vec![x.clone()], vec![], vec![3, -1]),
        Case::new(Permute, vec![x.clone()], vec![], vec![1, 0]),
        Case::new(Slice, vec![x.clone()], vec![], vec![1, 0, 100, 2]),
        Case::new(Select, vec![x.clone()], vec![], vec![1, -1]),
        // x[:, 0:2**63-1:2] and x[:, 0:2:2**63-1]: Python's clamping.
        Case::new(Slice, vec![x.clone()], vec![], vec![1, 0, i64::MAX, 2]),
        Case::new(Slice, vec![x.clone()], vec![], vec![1, 0, 2, i64::MAX]),
    ];
    let mv = &m.data;
    let tril: Vec<f64> = (0..12)
        .map(|i| if i % 4 <= i / 4 { mv[i] } else { 0.0 })
        .collect();
    let triu: Vec<f64> = (0..12)
        .map(|i| {
            if (i % 4) as i64 - (i / 4) as i64 >= 1 {
                mv[i]
            } else {
                0.0
            }
        })
        .collect();
    let wants: Vec<Vec<f64>> = vec![
        vec![1.0, 2.0, 3.0, 7.0, 4.0, 5.0, 6.0, 8.0],
        vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 5.0, 5.0, 6.0, 6.0],
        vec![6.0, 5.0, 4.0, 3.0, 2.0, 1.0],
        x.data.clone(),
        vec![3.0, 1.0, 2.0, 6.0, 4.0, 5.0],
        vec![3.0, 4.0, 5.0, 6.0, 1.0, 2.0],
        vec![-1.0, 1.0, 2.0, -1.0, 4.0, 5.0, -1.0, -1.0, -1.0],
        vec![7.0, 7.0, 8.0, 8.0, 7.0, 7.0, 8.0, 8.0],
        tril,
        triu,
        vec![3.0, 1.0, 5.0, 5.0],
        vec![4.0, 5.0, 6.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        vec![20.0, 2.0, 10.0, 4.0, 50.0, 6.0],
        vec![-5.0, 2.0, -5.0, 4.0, -5.0, 6.0],
        vec![21.0, 2.0, 13.0, 4.0, 95.0, 6.0],
        vec![30.0, 31.0, 0.0, 1.0, 30.0, 31.0],
        vec![7.0, 7.0, 7.0, 8.0, 8.0, 8.0, 7.0, 7.0, 7.0, 8.0, 8.0, 8.0],
        vec![5.0, 7.0, 9.0],
        x.data.clone(),
        vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0],
        vec![1.0, 3.0, 4.0, 6.0],
        vec![3.0, 6.0],
        vec![1.0, 3.0, 4.0, 6.0],
        vec![1.0, 4.0],
    ];
    let mut failures = Vec::new();
    for ((case, out), want) in cases.iter().zip(run_batch(&cases)).zip(wants) {
        let got = &out[0];
        if let Err(e) = compare(
            &format!("{} {:?}", case.op, case.params),
            got,
            &got.ty.clone(),
            &want,
            1.0,
        ) {
            failures.push(e);
        }
    }
    report(failures);
}

#[test]
fn backward_ops() {
    use OpId::*;
    let f32c = DType::F32.code() as i64;
    let g = Host::random(DType::F32, &[3, 4], -1.0, 1.0, 30);
    let x = Host::random(DType::F32, &[3, 4], -2.0, 2.0, 31);
    let logits = Host::random(DType::F32, &[3, 4], -2.0, 2.0, 32);
    let y = Host::new(DType::F32, &[3, 4], &softmax_rows(&logits.data, 4, false));
    let ly = Host::new(DType::F32, &[3, 4], &softmax_rows(&logits.data, 4, true));
    let target = Host::new(DType::I64, &[3], &[2.0, -100.0, 0.0]);
    let weight = Host::new(DType::F32, &[4], &[0.5, 1.0, 2.0, 4.0]);
    let go_none = Host::new(DType::F32, &[3], &[1.0, 2.0, 3.0]);
    let go = Host::new(DType::F32, &[], &[1.5]);
    let tw = Host::new(DType::F32, &[], &[2.5]);
    let cases = vec![
        Case::new(
            ThresholdBackward,
            vec![g.clone(), x.clone()],
            vec![ScalarArg::float(0.0)],
            vec![],
        ),
        Case::new(
            SoftmaxBackward,
            vec![g.clone(), y.clone()],
            vec![],
            vec![1, f32c],
        ),
        Case::new(
            LogSoftmaxBackward,
            vec![g.clone(), ly.clone()],
            vec![],
            vec![1, f32c],
        ),
        Case::new(
            NllLoss,
            vec![x.clone(), target.clone()],
            vec![],
            vec![1, -100],
        ),
        Case::new(
            NllLoss,
            vec![x.clone(), target.clone(), weight.clone()],
            vec![],
            vec![0, -100],
        ),
        Case::new(
            NllLoss,
            vec![x.clone(), target.clone(), weight.clone()],
            vec![],
            vec![2, -100],
        ),
        Case::new(
            NllLossBackward,
            vec![
                go.clone(),
                x.clone(),
                target.clone(),
                tw.clone(),
                weight.clone(),
            ],
            vec![],
            vec![1, -100],
        ),
        Case::new(
            NllLossBackward,
            vec![go_none.clone(), x.clone(), target.clone(), tw.clone()],
            vec![],
            vec![0, -100],
        ),
    ];
    let (gv, xv, yv, lyv) = (&g.data, &x.data, &y.data, &ly.data);
    let thr: Vec<f64> = (0..12)
        .map(|i| if xv[i] <= 0.0 { 0.0 } else { gv[i] })
        .collect();
    let smb: Vec<f64> = (0..12)
        .map(|i| {
            let r = i / 4;
            let s: f64 = (0..4).map(|j| gv[r * 4 + j] * yv[r * 4 + j]).sum();
            yv[i] * (gv[i] - s)
        })
        .collect();
    let lsmb: Vec<f64> = (0..12)
        .map(|i| {
            let r = i / 4;
            let s: f64 = (0..4).map(|j| gv[r * 4 + j]).sum();
            gv[i] - lyv[i].exp() * s
        })
        .collect();
    let t = [2usize, usize::MAX, 0];
    let wv = &weight.data;
    let per = |w: bool| -> Vec<f64> {
        (0..3)
            .map(|n| {
                if t[n] == usize::MAX {
                    0.0
                } else {
                    -xv[n * 4 + t[n]] * if w { wv[t[n]] } else { 1.0 }
                }
            })
            .collect()
    };
    let mean_unweighted = per(false).iter().sum::<f64>() / 2.0;
    let wsum = wv[2] + wv[0];
    let grad_mean: Vec<f64> = (0..12)
        .map(|i| {
            if t[i / 4] == i % 4 {
                -wv[i % 4] * 1.5 / 2.5
            } else {
                0.0
            }
        })
        .collect();
    let grad_none: Vec<f64> = (0..12)
        .map(|i| {
            if t[i / 4] == i % 4 {
                -go_none.data[i / 4]
            } else {
                0.0
            }
        })
        .collect();
    let wants: Vec<Vec<Vec<f64>>> = vec![
        vec![thr],
        vec![smb],
        vec![lsmb],
        vec![vec![mean_unweighted], vec![2.0]],
        vec![per(true), vec![0.0]],
        vec![vec![per(true).iter().sum()], vec![wsum]],
        vec![grad_mean],
        vec![grad_none],
    ];
    let mut failures = Vec::new();
    for ((case, outs), wants) in cases.iter().zip(run_batch(&cases)).zip(wants) {
        for (k, (got, want)) in outs.iter().zip(wants).enumerate() {
            if let Err(e) = compare(
                &format!("{} {:?} output {k}", case.op, case.params),
                got,
                &got.ty.clone(),
                &want,
                4.0,
            ) {
                failures.push(e);
            }
        }
    }
    report(failures);
}

/// gather/scatter on the shapes PyTorch admits at the edges: a 0-d self or index (counted as
/// 1-d), an empty index of any dtype and rank.
#[test]
fn gather_and_scatter_edge_shapes() {
    use OpId::*;
    let x0 = Host::new(DType::F32, &[], &[2.5]);
    let x = Host::new(DType::F32, &[5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
    let i1 = Host::new(DType::I64, &[2], &[0.0, 0.0]);
    let empty_u8 = Host::new(DType::U8, &[0], &[]);
    let empty_2d = Host::new(DType::I64, &[2, 0], &[]);
    let src = Host::new(DType::F32, &[5], &[10.0, 20.0, 30.0, 40.0, 50.0]);
    let cases = vec![
        Case::new(Gather, vec![x0.clone(), i1.clone()], vec![], vec![0]),
        Case::new(Gather, vec![x.clone(), empty_u8.clone()], vec![], vec![0]),
        Case::new(
            ScatterAdd,
            vec![x.clone(), empty_2d.clone(), src.clone()],
            vec![],
            vec![0],
        ),
        Case::new(
            Scatter,
            vec![x0.clone(), Host::new(DType::I64, &[1], &[0.0]), x0.clone()],
            vec![],
            vec![0],
        ),
        Case::new(
            ScatterAdd,
            vec![
                x0.clone(),
                i1.clone(),
                Host::new(DType::F32, &[2], &[1.0, 3.0]),
            ],
            vec![],
            vec![0],
        ),
        Case::new(
            ScatterAdd,
            vec![
                x.clone(),
                Host::new(DType::I64, &[], &[3.0]),
                Host::new(DType::F32, &[1], &[7.0]),
            ],
            vec![],
            vec![0],
        ),
        // torch.gather(torch.arange(1., 6.), 0, torch.tensor(2)) is tensor(3.).
        Case::new(
            Gather,
            vec![x.clone(), Host::new(DType::I64, &[], &[2.0])],
            vec![],
            vec![0],
        ),
        Case::new(
            Gather,
            vec![x.clone(), Host::new(DType::I32, &[], &[4.0])],
            vec![],
            vec![-1],
        ),
    ];
    let wants: Vec<(Vec<i64>, Vec<f64>)> = vec![
        (vec![2], vec![2.5, 2.5]),
        (vec![0], vec![]),
        (vec![5], x.data.clone()),
        (vec![], vec![2.5]),
        (vec![], vec![6.5]),
        (vec![5], vec![1.0, 2.0, 3.0, 11.0, 5.0]),
        (vec![], vec![3.0]),
        (vec![], vec![5.0]),
    ];
    let mut failures = Vec::new();
    for (i, (out, (shape, want))) in run_batch(&cases).into_iter().zip(wants).enumerate() {
        if let Err(e) = compare(
            &format!("edge case {i} {:?}", cases[i].op),
            &out[0],
            &ops::TensorType::new(DType::F32, &shape),
            &want,
            1.0,
        ) {
            failures.push(e);
        }
    }
    report(failures);
}
