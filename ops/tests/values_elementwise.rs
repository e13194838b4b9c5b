//! Value tests of elementwise ops and casts on the XLA CPU PJRT plugin against f64 references.

mod common;

use common::*;
use ops::{f64_param, DType, OpId, ScalarArg, TensorType};

const FLOATS: [f64; 16] = [
    -3.7,
    -2.5,
    -1.0,
    -0.5,
    -0.0,
    0.0,
    0.3,
    0.5,
    1.0,
    1.5,
    2.5,
    7.25,
    100.0,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
];
const INTS: [f64; 8] = [-7.0, -3.0, -1.0, 0.0, 1.0, 2.0, 5.0, 100.0];

fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    let a = x.abs();
    if a < 2.0 {
        // Maclaurin series: 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)).
        let mut sum = 0.0f64;
        let mut term = a;
        let mut n = 0.0;
        while n < 60.0 {
            sum += term / (2.0 * n + 1.0);
            n += 1.0;
            term *= -a * a / n;
        }
        return x.signum() * sum * 2.0 / std::f64::consts::PI.sqrt();
    }
    // erfc by its continued fraction, evaluated from the tail.
    let mut f = 0.0f64;
    for k in (1..200).rev() {
        f = (k as f64 / 2.0) / (a + f);
    }
    let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f);
    x.signum() * (1.0 - erfc)
}

fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 {
        2.0 * (x / 2.0).round()
    } else {
        r
    }
}

fn unary_ref(op: OpId, x: f64, params: &[i64]) -> f64 {
    use OpId::*;
    match op {
        Neg => -x,
        Abs => x.abs(),
        Exp => x.exp(),
        Exp2 => x.exp2(),
        Log => x.ln(),
        Log2 => x.log2(),
        Log10 => x.log10(),
        Log1p => x.ln_1p(),
        Expm1 => x.exp_m1(),
        Sqrt => x.sqrt(),
        Rsqrt => 1.0 / x.sqrt(),
        Sin => x.sin(),
        Cos => x.cos(),
        Tan => x.tan(),
        Tanh => x.tanh(),
        Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Relu => {
            if x.is_nan() {
                x
            } else {
                x.max(0.0)
            }
        }
        Gelu if params.first() == Some(&1) => {
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            0.5 * x * (1.0 + inner.tanh())
        }
        Gelu => 0.5 * x * (1.0 + erf(x / 2f64.sqrt())),
        Silu => x / (1.0 + (-x).exp()),
        Erf => erf(x),
        Floor => x.floor(),
        Ceil => x.ceil(),
        Round => {
            let d = params.first().copied().unwrap_or(0);
            if d == 0 {
                round_half_even(x)
            } else {
                let s = 10f64.powi(d as i32);
                round_half_even(x * s) / s
            }
        }
        Trunc => x.trunc(),
        Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        Reciprocal => 1.0 / x,
        LogicalNot => (x == 0.0) as i64 as f64,
        IsNan => x.is_nan() as i64 as f64,
        IsInf => x.is_infinite() as i64 as f64,
        NanToNum => {
            if x.is_nan() {
                0.0
            } else if x == f64::INFINITY {
                f64::MAX
            } else if x == f64::NEG_INFINITY {
                f64::MIN
            } else {
                x
            }
        }
        BitwiseNot => !(x as i64) as f64,
        op => panic!("no reference for {op}"),
    }
}

/// Unary ops over float dtypes (one module per dtype).
#[test]
fn unary_float_ops() {
    use OpId::*;
    let ops: &[(OpId, &[i64], f64)] = &[
        (Neg, &[], 1.0),
        (Abs, &[], 1.0),
        (Exp, &[], 2.0),
        (Exp2, &[], 2.0),
        (Log, &[], 2.0),
        (Log2, &[], 3.0),
        (Log10, &[], 3.0),
        (Log1p, &[], 2.0),
        (Expm1, &[], 2.0),
        (Sqrt, &[], 1.0),
        (Rsqrt, &[], 2.0),
        (Sin, &[], 2.0),
        (Cos, &[], 2.0),
        (Tan, &[], 4.0),
        (Tanh, &[], 2.0),
        (Sigmoid, &[], 2.0),
        (Relu, &[], 1.0),
        (Gelu, &[], 4.0),
        (Gelu, &[1], 4.0),
        (Silu, &[], 4.0),
        (Erf, &[], 4.0),
        (Floor, &[], 1.0),
        (Ceil, &[], 1.0),
        (Round, &[], 1.0),
        (Round, &[2], 2.0),
        (Trunc, &[], 1.0),
        (Sign, &[], 1.0),
        (Reciprocal, &[], 1.0),
        (LogicalNot, &[], 1.0),
        (IsNan, &[], 1.0),
        (IsInf, &[], 1.0),
        (NanToNum, &[], 1.0),
    ];
    let mut failures = Vec::new();
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        let x = Host::new(dtype, &[FLOATS.len() as i64], &FLOATS);
        let cases: Vec<Case> = ops
            .iter()
            .map(|(op, p, _)| Case::new(*op, vec![x.clone()], vec![], p.to_vec()))
            .collect();
        let results = run_batch(&cases);
        for ((op, p, scale), out) in ops.iter().zip(results) {
            let got = &out[0];
            let mut want: Vec<f64> = x
                .data
                .iter()
                .map(|&v| round_to(got.ty.dtype, unary_ref(*op, v, p)))
                .collect();
            if *op == Gelu {
                // PyTorch's gelu at +-inf differs between its f32 and f64 kernels; not compared.
                for (w, g) in want
                    .iter_mut()
                    .zip(&got.data)
                    .zip(&x.data)
                    .filter(|(_, v)| v.is_infinite())
                    .map(|(p, _)| p)
                {
                    *w = *g;
                }
            }
            if *op == NanToNum {
                // Defaults are the dtype's own max/min.
                want = x
                    .data
                    .iter()
                    .map(|&v| {
                        if v.is_infinite() {
                            v.signum() * dtype.max_value()
                        } else {
                            unary_ref(*op, v, p)
                        }
                    })
                    .collect();
            }
            if let Err(e) = compare(
                &format!("{op}{p:?} {dtype}"),
                got,
                &got.ty.clone(),
                &want,
                *scale,
            ) {
                failures.push(e);
            }
        }
    }
    report(failures);
}

/// Unary ops on integer and bool inputs.
#[test]
fn unary_integer_ops() {
    use OpId::*;
    let mut failures = Vec::new();
    let int_ops = [
        Neg, Abs, Exp, Sqrt, Sin, Relu, Floor, Round, Sign, Reciprocal, LogicalNot, BitwiseNot,
        IsNan, NanToNum,
    ];
    let mut cases = Vec::new();
    let mut expect = Vec::new();
    for dtype in [DType::I32, DType::I64, DType::U8, DType::I8] {
        let data: Vec<f64> = if dtype == DType::U8 {
            INTS.iter().map(|v| v.abs()).collect()
        } else {
            INTS.to_vec()
        };
        let x = Host::new(dtype, &[data.len() as i64], &data);
        for op in int_ops {
            if op == Neg && dtype == DType::U8 {
                continue;
            }
            cases.push(Case::new(op, vec![x.clone()], vec![], vec![]));
            expect.push((op, dtype, x.data.clone()));
        }
    }
    let b = Host::new(DType::Bool, &[2], &[0.0, 1.0]);
    for op in [LogicalNot, BitwiseNot, Sign, Exp] {
        cases.push(Case::new(op, vec![b.clone()], vec![], vec![]));
        expect.push((op, DType::Bool, b.data.clone()));
    }
    let results = run_batch(&cases);
    for ((op, dtype, data), out) in expect.into_iter().zip(results) {
        let got = &out[0];
        let want: Vec<f64> = data
            .iter()
            .map(|&v| {
                let r = match (op, dtype) {
                    (BitwiseNot, DType::Bool) => (v == 0.0) as i64 as f64,
                    (BitwiseNot, DType::U8) => (!(v as u8)) as f64,
                    _ => unary_ref(op, v, &[]),
                };
                round_to(got.ty.dtype, r)
            })
            .collect();
        if let Err(e) = compare(&format!("{op} {dtype}"), got, &got.ty.clone(), &want, 2.0) {
            failures.push(e);
        }
    }
    report(failures);
}

fn py_fmod(a: f64, b: f64) -> f64 {
    a % b
}

fn py_remainder(a: f64, b: f64) -> f64 {
    let m = a % b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        m + b
    } else {
        m
    }
}

fn floor_div(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        return a / b;
    }
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        div -= 1.0;
    }
    if div != 0.0 {
        let mut f = div.floor();
        if div - f > 0.5 {
            f += 1.0;
        }
        f
    } else {
        0f64.copysign(a / b)
    }
}

fn int_pow(a: f64, b: f64) -> f64 {
    let (a, b) = (a as i64, b as i64);
    if b < 0 {
        return match a {
            1 => 1.0,
            -1 => {
                if b % 2 == 0 {
                    1.0
                } else {
                    -1.0
                }
            }
            _ => 0.0,
        };
    }
    a.wrapping_pow(b as u32) as f64
}

fn binary_ref(op: OpId, a: f64, b: f64, params: &[i64], integral: bool) -> f64 {
    use OpId::*;
    let b2 = |x: bool| x as i64 as f64;
    match op {
        Add => a + b,
        Sub => a - b,
        Rsub => b - a,
        Mul => a * b,
        Div => match params.first().copied().unwrap_or(0) {
            0 => a / b,
            1 if integral => (a / b).trunc(),
            1 => (a / b).trunc(),
            _ if integral => (a / b).floor(),
            _ => floor_div(a, b),
        },
        Remainder => py_remainder(a, b),
        Fmod => py_fmod(a, b),
        Pow if integral => int_pow(a, b),
        Pow => a.powf(b),
        Maximum => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        Minimum => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
        Atan2 => a.atan2(b),
        Eq => b2(a == b),
        Ne => b2(a != b),
        Lt => b2(a < b),
        Le => b2(a <= b),
        Gt => b2(a > b),
        Ge => b2(a >= b),
        LogicalAnd => b2(a != 0.0 && b != 0.0),
        LogicalOr => b2(a != 0.0 || b != 0.0),
        LogicalXor => b2((a != 0.0) != (b != 0.0)),
        BitwiseAnd => (a as i64 & b as i64) as f64,
        BitwiseOr => (a as i64 | b as i64) as f64,
        BitwiseXor => (a as i64 ^ b as i64) as f64,
        // The reference for int32, as PyTorch's kernels: out-of-range amounts give 0 or the sign.
        BitwiseLeftShift if !(0.0..32.0).contains(&b) => 0.0,
        BitwiseLeftShift => ((a as i32 as u32) << b as u32) as i32 as f64,
        BitwiseRightShift if !(0.0..31.0).contains(&b) => (a as i32 >> 31) as f64,
        BitwiseRightShift => (a as i32 >> b as u32) as f64,
        op => panic!("no reference for {op}"),
    }
}

/// Tensor-tensor binary ops on f32, f64, bf16 and int32, with broadcasting.
#[test]
fn binary_tensor_tensor() {
    use OpId::*;
    let float_ops: &[(OpId, &[i64])] = &[
        (Add, &[]),
        (Sub, &[]),
        (Mul, &[]),
        (Div, &[]),
        (Div, &[1]),
        (Div, &[2]),
        (Remainder, &[]),
        (Fmod, &[]),
        (Pow, &[]),
        (Maximum, &[]),
        (Minimum, &[]),
        (Atan2, &[]),
        (Eq, &[]),
        (Ne, &[]),
        (Lt, &[]),
        (Le, &[]),
        (Gt, &[]),
        (Ge, &[]),
        (LogicalAnd, &[]),
        (LogicalOr, &[]),
        (LogicalXor, &[]),
    ];
    let int_ops: &[(OpId, &[i64])] = &[
        (Add, &[]),
        (Sub, &[]),
        (Mul, &[]),
        (Div, &[]),
        (Div, &[1]),
        (Div, &[2]),
        (Remainder, &[]),
        (Fmod, &[]),
        (Pow, &[]),
        (Maximum, &[]),
        (Minimum, &[]),
        (Lt, &[]),
        (Eq, &[]),
        (BitwiseAnd, &[]),
        (BitwiseOr, &[]),
        (BitwiseXor, &[]),
        (BitwiseLeftShift, &[]),
        (BitwiseRightShift, &[]),
        (LogicalAnd, &[]),
    ];
    let av = [
        -7.5,
        -3.0,
        -1.0,
        -0.0,
        0.5,
        2.0,
        3.25,
        7.0,
        f64::NAN,
        f64::INFINITY,
    ];
    let bv = [2.0, -3.0, f64::NAN, -2.0, 1.5];
    let ai = [-7.0, -3.0, -1.0, 0.0, 1.0, 2.0, 3.0, 7.0, 9.0, -9.0];
    let bi = [2.0, -3.0, 1.0, -2.0, 4.0];
    let mut failures = Vec::new();
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::I32] {
        let integral = dtype == DType::I32;
        let (adata, bdata, ops) = if integral {
            (&ai, &bi, int_ops)
        } else {
            (&av, &bv, float_ops)
        };
        // a: [2, 5], b: [5] broadcast.
        let a = Host::new(dtype, &[2, 5], adata);
        let b = Host::new(dtype, &[5], bdata);
        let cases: Vec<Case> = ops
            .iter()
            .map(|(op, p)| Case::new(*op, vec![a.clone(), b.clone()], vec![], p.to_vec()))
            .collect();
        for ((op, p), out) in ops.iter().zip(run_batch(&cases)) {
            let got = &out[0];
            let want: Vec<f64> = (0..10)
                .map(|i| {
                    let out_integral = !got.ty.dtype.is_float();
                    round_to(
                        got.ty.dtype,
                        binary_ref(*op, a.data[i], b.data[i % 5], p, out_integral && integral),
                    )
                })
                .collect();
            let scale = if matches!(op, Pow | Atan2) { 4.0 } else { 1.0 };
            if let Err(e) = compare(
                &format!("{op}{p:?} {dtype}"),
                got,
                &TensorType::new(got.ty.dtype, &[2, 5]),
                &want,
                scale,
            ) {
                failures.push(e);
            }
        }
    }
    report(failures);
}

/// Tensor-scalar forms, including alpha, PyTorch's pow special exponents and mixed promotion.
#[test]
fn binary_tensor_scalar() {
    use OpId::*;
    let xf = Host::new(DType::F32, &[6], &[-2.5, -1.0, 0.0, 0.7, 2.0, 9.0]);
    let xi = Host::new(DType::I64, &[6], &[-7.0, -2.0, 0.0, 1.0, 3.0, 8.0]);
    let xb = Host::new(DType::BF16, &[6], &[-2.5, -1.0, 0.0, 0.7, 2.0, 9.0]);
    let mut cases = Vec::new();
    let mut refs: Vec<Box<dyn Fn(f64) -> f64>> = Vec::new();
    let mut add = |c: Case, r: Box<dyn Fn(f64) -> f64>| {
        cases.push(c);
        refs.push(r);
    };
    for &e in &[2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 1.0, 0.0, 1.7] {
        add(
            Case::new(Pow, vec![xf.clone()], vec![ScalarArg::float(e)], vec![]),
            Box::new(move |x: f64| x.powf(e)),
        );
    }
    add(
        Case::new(Pow, vec![xi.clone()], vec![ScalarArg::int(3)], vec![]),
        Box::new(|x: f64| x.powi(3)),
    );
    add(
        Case::new(Pow, vec![xi.clone()], vec![ScalarArg::float(0.5)], vec![]),
        Box::new(|x: f64| x.powf(0.5)),
    );
    add(
        Case::new(
            PowScalarBase,
            vec![xf.clone()],
            vec![ScalarArg::float(2.0)],
            vec![],
        ),
        Box::new(|x: f64| 2f64.powf(x)),
    );
    add(
        Case::new(
            PowScalarBase,
            vec![xi.clone()],
            vec![ScalarArg::int(2)],
            vec![],
        ),
        Box::new(|x: f64| int_pow(2.0, x)),
    );
    add(
        Case::new(
            Add,
            vec![xf.clone()],
            vec![ScalarArg::float(1.5), ScalarArg::float(-2.0)],
            vec![],
        ),
        Box::new(|x: f64| x + -2.0 * 1.5),
    );
    add(
        Case::new(
            Add,
            vec![xi.clone(), xi.clone()],
            vec![ScalarArg::int(3)],
            vec![],
        ),
        Box::new(|x: f64| x + 3.0 * x),
    );
    add(
        Case::new(Rsub, vec![xf.clone()], vec![ScalarArg::float(1.0)], vec![]),
        Box::new(|x: f64| 1.0 - x),
    );
    add(
        Case::new(Sub, vec![xi.clone()], vec![ScalarArg::float(0.5)], vec![]),
        Box::new(|x: f64| x - 0.5),
    );
    add(
        Case::new(Div, vec![xi.clone()], vec![ScalarArg::int(2)], vec![]),
        Box::new(|x: f64| x / 2.0),
    );
    add(
        Case::new(Div, vec![xi.clone()], vec![ScalarArg::int(-3)], vec![2]),
        Box::new(|x: f64| (x / -3.0).floor()),
    );
    add(
        Case::new(
            Remainder,
            vec![xi.clone()],
            vec![ScalarArg::int(-3)],
            vec![],
        ),
        Box::new(|x: f64| py_remainder(x, -3.0)),
    );
    add(
        Case::new(Mul, vec![xb.clone()], vec![ScalarArg::float(0.1)], vec![]),
        Box::new(|x: f64| x * 0.1),
    );
    add(
        Case::new(Lt, vec![xi.clone()], vec![ScalarArg::float(0.5)], vec![]),
        Box::new(|x: f64| (x < 0.5) as i64 as f64),
    );
    add(
        Case::new(Ge, vec![xf.clone()], vec![ScalarArg::int(0)], vec![]),
        Box::new(|x: f64| (x >= 0.0) as i64 as f64),
    );
    add(
        Case::new(
            Maximum,
            vec![xf.clone()],
            vec![ScalarArg::tensor(ops::ScalarValue::Float(0.5), DType::F64)],
            vec![],
        ),
        Box::new(|x: f64| x.max(0.5)),
    );
    let results = run_batch(&cases);
    let mut failures = Vec::new();
    for (i, (c, out)) in cases.iter().zip(results).enumerate() {
        let got = &out[0];
        let want: Vec<f64> = c.inputs[0]
            .data
            .iter()
            .map(|&x| round_to(got.ty.dtype, refs[i](x)))
            .collect();
        if let Err(e) = compare(
            &format!("case {i} {:?} {:?}", c.op, c.scalars),
            got,
            &got.ty.clone(),
            &want,
            2.0,
        ) {
            failures.push(e);
        }
    }
    report(failures);
}

/// where, clamp, lerp, addcmul, addcdiv.
#[test]
fn ternary_ops() {
    use OpId::*;
    let c = Host::new(DType::Bool, &[2, 3], &[1.0, 0.0, 1.0, 0.0, 0.0, 1.0]);
    let x = Host::new(DType::F32, &[2, 3], &[-2.0, -0.5, 0.0, 0.25, 1.5, f64::NAN]);
    let y = Host::new(DType::F32, &[3], &[10.0, 20.0, 30.0]);
    let w = Host::new(DType::F32, &[3], &[0.25, 0.75, 1.5]);
    let xi = Host::new(DType::I32, &[2, 3], &[-2.0, -1.0, 0.0, 1.0, 2.0, 3.0]);
    let cases = vec![
        Case::new(Where, vec![c.clone(), x.clone(), y.clone()], vec![], vec![]),
        Case::new(
            Where,
            vec![c.clone(), xi.clone()],
            vec![ScalarArg::float(0.5)],
            vec![],
        ),
        Case::new(
            Where,
            vec![c.clone()],
            vec![ScalarArg::int(1), ScalarArg::float(0.5)],
            vec![2, 2],
        ),
        Case::new(
            Clamp,
            vec![x.clone()],
            vec![ScalarArg::float(-1.0), ScalarArg::float(1.0)],
            vec![2, 2],
        ),
        Case::new(
            Clamp,
            vec![xi.clone()],
            vec![ScalarArg::float(0.5)],
            vec![2, 0],
        ),
        Case::new(Clamp, vec![x.clone(), w.clone()], vec![], vec![0, 1]),
        Case::new(
            Lerp,
            vec![x.clone(), y.clone()],
            vec![ScalarArg::float(0.3)],
            vec![],
        ),
        Case::new(Lerp, vec![x.clone(), y.clone(), w.clone()], vec![], vec![]),
        Case::new(
            Addcmul,
            vec![x.clone(), y.clone(), w.clone()],
            vec![ScalarArg::float(0.5)],
            vec![],
        ),
        Case::new(
            Addcdiv,
            vec![x.clone(), y.clone(), w.clone()],
            vec![ScalarArg::float(-2.0)],
            vec![],
        ),
    ];
    let cv = &c.data;
    let xv = &x.data;
    let lerp = |s: f64, e: f64, w: f64| {
        if w.abs() < 0.5 {
            s + w * (e - s)
        } else {
            e - (e - s) * (1.0 - w)
        }
    };
    let clampf = |v: f64, lo: f64, hi: f64| if v.is_nan() { v } else { v.max(lo).min(hi) };
    let wants: Vec<Vec<f64>> = vec![
        (0..6)
            .map(|i| if cv[i] != 0.0 { xv[i] } else { y.data[i % 3] })
            .collect(),
        (0..6)
            .map(|i| if cv[i] != 0.0 { xi.data[i] } else { 0.5 })
            .collect(),
        (0..6)
            .map(|i| if cv[i] != 0.0 { 1.0 } else { 0.5 })
            .collect(),
        (0..6).map(|i| clampf(xv[i], -1.0, 1.0)).collect(),
        (0..6).map(|i| xi.data[i].max(0.5)).collect(),
        (0..6)
            .map(|i| {
                if xv[i].is_nan() {
                    xv[i]
                } else {
                    xv[i].min(w.data[i % 3])
                }
            })
            .collect(),
        (0..6).map(|i| lerp(xv[i], y.data[i % 3], 0.3)).collect(),
        (0..6)
            .map(|i| lerp(xv[i], y.data[i % 3], w.data[i % 3]))
            .collect(),
        (0..6)
            .map(|i| xv[i] + 0.5 * y.data[i % 3] * w.data[i % 3])
            .collect(),
        (0..6)
            .map(|i| xv[i] - 2.0 * y.data[i % 3] / w.data[i % 3])
            .collect(),
    ];
    let mut failures = Vec::new();
    for (i, (out, want)) in run_batch(&cases).into_iter().zip(wants).enumerate() {
        let got = &out[0];
        let want: Vec<f64> = want.iter().map(|&v| round_to(got.ty.dtype, v)).collect();
        if let Err(e) = compare(
            &format!("ternary case {i} {:?}", cases[i].op),
            got,
            &got.ty.clone(),
            &want,
            2.0,
        ) {
            failures.push(e);
        }
    }
    report(failures);
}

/// C++ conversion as PyTorch does it on x86 (see `cast_like_pytorch`).
fn cast_ref(x: f64, from: DType, to: DType) -> f64 {
    if to == DType::Bool {
        return (x != 0.0) as i64 as f64;
    }
    if from.is_float() && to == DType::U64 {
        // x86's two steps: below 2^63 (or NaN) through int64, from 2^63 on less 2^63, with the
        // top bit set back.
        let top = 2f64.powi(63);
        let via_i64 = |x: f64| -> i64 {
            if x.is_nan() || x < -top || x >= top {
                i64::MIN
            } else {
                x.trunc() as i64
            }
        };
        let bits = if x >= top {
            (via_i64(x - top) ^ i64::MIN) as u64
        } else {
            via_i64(x) as u64
        };
        return bits as f64;
    }
    if from.is_float() && to.is_integral(false) {
        let wide_bits = if matches!(to, DType::I32 | DType::U16) {
            32
        } else {
            64
        };
        let limit = 2f64.powi(wide_bits - 1);
        let w: i64 = if x.is_nan() || x < -limit || x >= limit {
            i64::MIN >> (64 - wide_bits)
        } else {
            x.trunc() as i64
        };
        return round_to(to, w as f64);
    }
    round_to(to, x)
}

/// Every cast between the real dtypes, in one module.
#[test]
fn casts_between_all_dtypes() {
    let values = [
        -300.7,
        -129.0,
        -1.5,
        -0.0,
        0.0,
        0.4,
        1.0,
        127.9,
        200.7,
        255.0,
        70000.5,
        3e9,
        f64::NAN,
        f64::INFINITY,
    ];
    let mut cases = Vec::new();
    // Complex casts are checked against PyTorch's CPU by tests/python/test_complex.py.
    let real = || DType::ALL.into_iter().filter(|d| !d.is_complex());
    // A uint64 source's wrapped negative values lie past f64's exact integers, where these host
    // values live: its casts are checked against PyTorch's CPU by tests/python/test_unsigned.py.
    for from in real().filter(|&d| d != DType::U64) {
        let x = Host::new(from, &[values.len() as i64], &values);
        for to in real() {
            cases.push(Case::new(
                OpId::Convert,
                vec![x.clone()],
                vec![],
                vec![to.code() as i64],
            ));
        }
    }
    let mut failures = Vec::new();
    for (c, out) in cases.iter().zip(run_batch(&cases)) {
        let from = c.inputs[0].ty.dtype;
        let to = DType::from_code(c.params[0] as i32).unwrap();
        let want: Vec<f64> = c.inputs[0]
            .data
            .iter()
            .map(|&x| cast_ref(x, from, to))
            .collect();
        if let Err(e) = compare(
            &format!("{from} -> {to}"),
            &out[0],
            &out[0].ty.clone(),
            &want,
            1.0,
        ) {
            failures.push(e);
        }
    }
    report(failures);
}

/// Casts, copies, fills and creation ops.
#[test]
fn creation_ops() {
    use OpId::*;
    let f32c = DType::F32.code() as i64;
    let i64c = DType::I64.code() as i64;
    let x = Host::new(DType::F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let src = Host::new(DType::I32, &[3], &[7.0, 8.0, 9.0]);
    let cases = vec![
        Case::new(Clone, vec![x.clone()], vec![], vec![]),
        Case::new(Copy, vec![x.clone(), src.clone()], vec![], vec![]),
        Case::new(Fill, vec![x.clone()], vec![ScalarArg::float(2.5)], vec![]),
        Case::new(Full, vec![], vec![ScalarArg::int(-4)], vec![i64c, 2, 2]),
        Case::new(Zeros, vec![], vec![], vec![f32c, 3]),
        Case::new(Ones, vec![], vec![], vec![DType::Bool.code() as i64, 2]),
        Case::new(
            Arange,
            vec![],
            vec![],
            vec![f32c, f64_param(0.5), f64_param(3.0), f64_param(0.75)],
        ),
        Case::new(
            Arange,
            vec![],
            vec![],
            vec![i64c, f64_param(10.0), f64_param(0.0), f64_param(-3.0)],
        ),
        Case::new(
            Linspace,
            vec![],
            vec![ScalarArg::float(-1.0), ScalarArg::float(2.0)],
            vec![f32c, 7],
        ),
        Case::new(
            Linspace,
            vec![],
            vec![ScalarArg::int(0), ScalarArg::int(10)],
            vec![i64c, 4],
        ),
        Case::new(Eye, vec![], vec![], vec![f32c, 2, 3]),
        // The step is exactly -1: a reciprocal multiply would put some values an ulp below an
        // integer, and the cast to int64 would truncate them.
        Case::new(
            Linspace,
            vec![],
            vec![ScalarArg::int(50), ScalarArg::int(1)],
            vec![i64c, 50],
        ),
    ];
    let wants: Vec<Vec<f64>> = vec![
        x.data.clone(),
        vec![7.0, 8.0, 9.0, 7.0, 8.0, 9.0],
        vec![2.5; 6],
        vec![-4.0; 4],
        vec![0.0; 3],
        vec![1.0; 2],
        vec![0.5, 1.25, 2.0, 2.75],
        vec![10.0, 7.0, 4.0, 1.0],
        vec![-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0],
        vec![0.0, 3.0, 6.0, 10.0],
        vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
        (0..50).map(|i| (50 - i) as f64).collect(),
    ];
    let mut failures = Vec::new();
    for (i, (out, want)) in run_batch(&cases).into_iter().zip(wants).enumerate() {
        if let Err(e) = compare(
            &format!("creation case {i} {:?}", cases[i].op),
            &out[0],
            &out[0].ty.clone(),
            &want,
            1.0,
        ) {
            failures.push(e);
        }
    }
    report(failures);
}

/// bf16 `x` after one f32 operation, as PyTorch's reduced-float CPU kernels store each step.
fn bf16_step(x: f32) -> f32 {
    round_to(DType::BF16, x as f64) as f32
}

/// `c10::div_floor_floating` evaluated in bf16: every intermediate is rounded.
fn bf16_floor_div(a: f32, b: f32) -> f32 {
    if b == 0.0 {
        return bf16_step(a / b);
    }
    let md = a % b;
    let mut div = bf16_step(bf16_step(a - md) / b);
    if md != 0.0 && (b < 0.0) != (md < 0.0) {
        div = bf16_step(div - 1.0);
    }
    if div == 0.0 {
        return 0f32.copysign(a / b);
    }
    let mut fl = div.floor();
    if bf16_step(div - fl) > 0.5 {
        fl = bf16_step(fl + 1.0);
    }
    fl
}

/// bf16 `div(..., rounding_mode=trunc|floor)` by a tensor rounds each step to bf16 as PyTorch's
/// CPU kernel does; by a single value it computes in f32 and rounds once.
#[test]
fn reduced_float_rounded_division() {
    use OpId::*;
    let a = Host::random(DType::BF16, &[4, 64], -60.0, 60.0, 41);
    let b = Host::random(DType::BF16, &[64], -6.0, 6.0, 42);
    let one = Host::new(DType::BF16, &[1], &[b.data[3]]);
    let cases = vec![
        Case::new(Div, vec![a.clone(), b.clone()], vec![], vec![1]),
        Case::new(Div, vec![a.clone(), b.clone()], vec![], vec![2]),
        Case::new(Div, vec![a.clone(), one.clone()], vec![], vec![1]),
        Case::new(Div, vec![a.clone(), one.clone()], vec![], vec![2]),
    ];
    let n = a.data.len();
    let (av, bv) = (&a.data, &b.data);
    let bf = |x: f64| round_to(DType::BF16, x);
    let stepwise_trunc: Vec<f64> = (0..n)
        .map(|i| bf16_step(av[i] as f32 / bv[i % 64] as f32).trunc() as f64)
        .collect();
    let once_trunc: Vec<f64> = (0..n)
        .map(|i| bf((av[i] as f32 / bv[i % 64] as f32).trunc() as f64))
        .collect();
    assert_ne!(
        stepwise_trunc, once_trunc,
        "the data should tell the two roundings apart"
    );
    let wants: Vec<Vec<f64>> = vec![
        stepwise_trunc,
        (0..n)
            .map(|i| bf16_floor_div(av[i] as f32, bv[i % 64] as f32) as f64)
            .collect(),
        (0..n)
            .map(|i| bf((av[i] as f32 / one.data[0] as f32).trunc() as f64))
            .collect(),
        (0..n).map(|i| bf(floor_div(av[i], one.data[0]))).collect(),
    ];
    let mut failures = Vec::new();
    for (i, (out, want)) in run_batch(&cases).into_iter().zip(wants).enumerate() {
        let got = &out[0];
        let exact: Vec<String> = got
            .data
            .iter()
            .zip(&want)
            .enumerate()
            .filter(|(_, (g, w))| g != w)
            .take(5)
            .map(|(j, (g, w))| format!("[{j}] got {g} want {w}"))
            .collect();
        if !exact.is_empty() {
            failures.push(format!("rounded division case {i}: {}", exact.join(", ")));
        }
    }
    report(failures);
}

/// A bool clamp by one tensor bound is `maximum` / `minimum` on bool (PyTorch's only bool clamp).
#[test]
fn clamp_on_bool() {
    let x = Host::new(DType::Bool, &[4], &[1.0, 0.0, 1.0, 0.0]);
    let b = Host::new(DType::Bool, &[4], &[1.0, 1.0, 0.0, 0.0]);
    let cases = vec![
        Case::new(OpId::Clamp, vec![x.clone(), b.clone()], vec![], vec![1, 0]),
        Case::new(OpId::Clamp, vec![x.clone(), b.clone()], vec![], vec![0, 1]),
    ];
    let wants = [vec![1.0, 1.0, 1.0, 0.0], vec![1.0, 0.0, 0.0, 0.0]];
    let mut failures = Vec::new();
    for (i, (out, want)) in run_batch(&cases).into_iter().zip(wants).enumerate() {
        if let Err(e) = compare(
            &format!("bool clamp case {i}"),
            &out[0],
            &TensorType::new(DType::Bool, &[4]),
            &want,
            1.0,
        ) {
            failures.push(e);
        }
    }
    report(failures);
}
