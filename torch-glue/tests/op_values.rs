//! Per-op values through the engine in Strict, Debug and DeferAndFuse against an f64 reference:
//! unary ops, binary ops with broadcasting and wrapped scalars, casts, reductions, matrix
//! products, cat, softmax and nll_loss. Strict and Debug must agree bitwise (one compiled op,
//! one executable); DeferAndFuse within a few ulps (fusion changes FMA contraction and order).

mod common;

use common::reference::Ref;
use common::*;
use defer::{Mode, TensorRef};
use ops::params::{Reduction, RoundingMode};
use ops::{DType, EncodedOp, ScalarArg, ScalarValue};
use torch_glue::Engine;

const MODES: [Mode; 3] = [Mode::Strict, Mode::Debug, Mode::DeferAndFuse];

type Build = Box<dyn Fn(&Engine) -> Vec<TensorRef>>;

/// One expected output: its dtype, reference values and error scale.
struct Expect {
    dtype: DType,
    want: Ref,
    scale: Vec<f64>,
}

impl Expect {
    fn new(dtype: DType, want: Ref) -> Expect {
        Expect {
            dtype,
            want,
            scale: Vec::new(),
        }
    }

    fn scaled(dtype: DType, want: Ref, scale: &Ref) -> Expect {
        Expect {
            dtype,
            want,
            scale: scale.data.clone(),
        }
    }
}

struct Case {
    name: String,
    tol: Tol,
    expect: Vec<Expect>,
    build: Build,
}

/// A host tensor the case uploads in every mode.
#[derive(Clone)]
struct Input {
    dtype: DType,
    value: Ref,
}

impl Input {
    fn new(dtype: DType, value: Ref) -> Input {
        let value = value.map(|x| round_to(dtype, x));
        Input { dtype, value }
    }

    fn upload(&self, e: &Engine) -> TensorRef {
        upload(e, self.dtype, &self.value.data, &self.value.shape)
    }
}

fn random(rng: &mut Rng, dtype: DType, shape: &[i64], lo: f64, hi: f64) -> Input {
    let n = shape.iter().product::<i64>() as usize;
    let mut values = rng.values(n, lo, hi);
    if dtype.is_integral(true) {
        values.iter_mut().for_each(|v| *v = v.round());
    }
    Input::new(dtype, Ref::new(shape, values))
}

/// A case that uploads `inputs` and runs one op on them.
fn case(
    name: &str,
    call: impl Call,
    inputs: &[&Input],
    scalars: &[ScalarArg],
    tol: Tol,
    expect: Vec<Expect>,
) -> Case {
    let inputs: Vec<Input> = inputs.iter().map(|i| (*i).clone()).collect();
    let scalars = scalars.to_vec();
    let call = call.encoded();
    Case {
        name: name.to_string(),
        tol,
        expect,
        build: Box::new(move |e| {
            let tensors: Vec<TensorRef> = inputs.iter().map(|i| i.upload(e)).collect();
            let refs: Vec<&TensorRef> = tensors.iter().collect();
            op_all(e, call.clone(), &refs, &scalars)
        }),
    }
}

/// Runs every case in every mode on one engine (Strict and Debug share its cache) and checks
/// the values, the output dtypes, Strict/Debug bitwise agreement and that DeferAndFuse deferred.
fn run_cases(cases: Vec<Case>) {
    let e = engine(Mode::Strict);
    for case in &cases {
        let mut by_mode: Vec<Vec<Vec<f64>>> = Vec::new();
        for mode in MODES {
            let deferred_before = metric(&e, "deferred_ops");
            let outs = with_mode(&e, mode, || (case.build)(&e));
            assert_eq!(
                outs.len(),
                case.expect.len(),
                "{}: number of outputs",
                case.name
            );
            let mut values = Vec::new();
            for (i, (out, expect)) in outs.iter().zip(&case.expect).enumerate() {
                assert_eq!(
                    out.dtype, expect.dtype,
                    "{} output {i} dtype in {mode:?}",
                    case.name
                );
                assert_eq!(
                    out.sizes.as_slice(),
                    expect.want.shape.as_slice(),
                    "{} output {i} shape in {mode:?}",
                    case.name
                );
                let got = read(&e, out);
                let tol = if out.dtype.is_float() {
                    Tol::ulps(out.dtype, case.tol.ulps)
                } else {
                    Tol::exact()
                };
                assert_close_scaled(
                    &format!("{} output {i} in {mode:?}", case.name),
                    &got,
                    &expect.want.data,
                    &expect.scale,
                    tol,
                );
                values.push(got);
            }
            let deferred = metric(&e, "deferred_ops") - deferred_before;
            if mode == Mode::DeferAndFuse {
                assert!(
                    deferred >= 1.0,
                    "{}: DeferAndFuse deferred nothing",
                    case.name
                );
            } else {
                assert_eq!(deferred, 0.0, "{}: {mode:?} deferred ops", case.name);
            }
            for out in outs {
                release(&e, out);
            }
            by_mode.push(values);
        }
        let bits = |v: &Vec<Vec<f64>>| -> Vec<Vec<u64>> {
            v.iter()
                .map(|o| o.iter().map(|x| x.to_bits()).collect())
                .collect()
        };
        assert_eq!(
            bits(&by_mode[0]),
            bits(&by_mode[1]),
            "{}: Strict and Debug run the same executable and must agree bitwise",
            case.name
        );
    }
}

/// erf by its Taylor series (|x| <= 3 here), accurate to ~1e-13.
fn erf(x: f64) -> f64 {
    let mut term = x;
    let mut sum = x;
    for n in 1..200 {
        term *= -x * x / n as f64;
        let next = term / (2 * n + 1) as f64;
        sum += next;
        if next.abs() < 1e-17 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn unary_ops() {
    let mut rng = Rng::new(1);
    let x = random(&mut rng, DType::F32, &[2, 3, 4], -2.0, 2.0);
    let pos = random(&mut rng, DType::F32, &[2, 3, 4], 0.05, 4.0);
    let f32_ = DType::F32;
    let unary = |name: &str, call: EncodedOp, input: &Input, f: fn(f64) -> f64, ulps: f64| {
        let want = input.value.map(f);
        case(
            name,
            call,
            &[input],
            &[],
            Tol::ulps(f32_, ulps),
            vec![Expect::new(f32_, want)],
        )
    };
    run_cases(vec![
        unary("neg", typed::Neg.encode(()), &x, |v| -v, 0.0),
        unary("abs", typed::Abs.encode(()), &x, f64::abs, 0.0),
        unary("relu", typed::Relu.encode(()), &x, |v| v.max(0.0), 0.0),
        unary("floor", typed::Floor.encode(()), &x, f64::floor, 0.0),
        unary("ceil", typed::Ceil.encode(()), &x, f64::ceil, 0.0),
        unary("sqrt", typed::Sqrt.encode(()), &pos, f64::sqrt, 1.0),
        unary(
            "reciprocal",
            typed::Reciprocal.encode(()),
            &pos,
            |v| 1.0 / v,
            1.0,
        ),
        unary(
            "rsqrt",
            typed::Rsqrt.encode(()),
            &pos,
            |v| 1.0 / v.sqrt(),
            2.0,
        ),
        unary("exp", typed::Exp.encode(()), &x, f64::exp, 4.0),
        unary("log", typed::Log.encode(()), &pos, f64::ln, 4.0),
        unary("sin", typed::Sin.encode(()), &x, f64::sin, 4.0),
        unary("tanh", typed::Tanh.encode(()), &x, f64::tanh, 4.0),
        unary(
            "sigmoid",
            typed::Sigmoid.encode(()),
            &x,
            |v| 1.0 / (1.0 + (-v).exp()),
            4.0,
        ),
        unary(
            "silu",
            typed::Silu.encode(()),
            &x,
            |v| v / (1.0 + (-v).exp()),
            4.0,
        ),
        // XLA's GPU erf is a different approximation than its CPU one: 8 ulps, not 4.
        unary("erf", typed::Erf.encode(()), &x, erf, 8.0),
        unary(
            "gelu",
            typed::Gelu.encode(layout::GeluApproximate { approximate: 0 }),
            &x,
            |v| 0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2)),
            8.0,
        ),
    ]);
}

#[test]
fn binary_ops_broadcast_and_scalars() {
    let mut rng = Rng::new(2);
    let (f32_, f64_, i64_, bool_) = (DType::F32, DType::F64, DType::I64, DType::Bool);
    let a = random(&mut rng, f32_, &[3, 1, 4], -3.0, 3.0);
    let b = random(&mut rng, f32_, &[2, 4], -3.0, 3.0);
    let row = random(&mut rng, f32_, &[4], 0.5, 3.0);
    let ia = random(&mut rng, i64_, &[2, 3], -20.0, 20.0);
    let ib = random(&mut rng, i64_, &[3], 1.0, 7.0);
    let exact = Tol::ulps(f32_, 0.0);
    let one = Tol::ulps(f32_, 1.0);
    let alpha = |x: f64| ScalarArg::float(x);
    // Python numbers and CPU 0-d tensors as scalars.
    let py_f = ScalarArg::float;
    let py_i = ScalarArg::int;
    let cpu0 = |x: f64, d: DType| ScalarArg::tensor(ScalarValue::Float(x), d);
    let rf = |i: &Input| i.value.clone();
    let f32_scale = |r: f64| round_to(f32_, r);
    run_cases(vec![
        case(
            "add broadcast [3,1,4] + [2,4]",
            typed::Add,
            &[&a, &b],
            &[],
            one,
            vec![Expect::new(f32_, rf(&a).zip(&rf(&b), |x, y| x + y))],
        ),
        case(
            "add with alpha 2.5",
            typed::Add,
            &[&a, &b],
            &[alpha(2.5)],
            // PyTorch computes x + alpha * y in f32; the product may be fused (FMA) or not.
            Tol::ulps(f32_, 2.0),
            vec![Expect::scaled(
                f32_,
                rf(&a).zip(&rf(&b), |x, y| x + f32_scale(2.5 * y)),
                &rf(&a).zip(&rf(&b), |x, y| x.abs() + (2.5 * y).abs()),
            )],
        ),
        case(
            "sub with alpha 0.5",
            typed::Sub,
            &[&a, &row],
            &[alpha(0.5)],
            Tol::ulps(f32_, 2.0),
            vec![Expect::scaled(
                f32_,
                rf(&a).zip(&rf(&row), |x, y| x - 0.5 * y),
                &rf(&a).zip(&rf(&row), |x, y| x.abs() + (0.5 * y).abs()),
            )],
        ),
        case(
            "add python float",
            typed::Add,
            &[&a],
            &[py_f(1.25)],
            one,
            vec![Expect::new(f32_, rf(&a).map(|x| x + 1.25))],
        ),
        case(
            "int64 + python int, alpha 3",
            typed::Add,
            &[&ia],
            &[py_i(5), py_i(3)],
            exact,
            vec![Expect::new(i64_, rf(&ia).map(|x| x + 15.0))],
        ),
        case(
            "int64 * python float is float32",
            typed::Mul,
            &[&ia],
            &[py_f(0.5)],
            one,
            vec![Expect::new(f32_, rf(&ia).map(|x| x * 0.5))],
        ),
        case(
            "int64 * cpu 0-d float64 tensor is float64",
            typed::Mul,
            &[&ia],
            &[cpu0(0.1, f64_)],
            Tol::ulps(f64_, 1.0),
            vec![Expect::new(f64_, rf(&ia).map(|x| x * 0.1))],
        ),
        case(
            "float32 * cpu 0-d float64 tensor stays float32",
            typed::Mul,
            &[&a],
            &[cpu0(0.1, f64_)],
            one,
            vec![Expect::new(f32_, rf(&a).map(|x| x * f32_scale(0.1)))],
        ),
        case(
            "int64 / int64 broadcast is float32",
            typed::Div.encode(layout::DivRounding {
                rounding_mode: RoundingMode::True,
            }),
            &[&ia, &ib],
            &[],
            one,
            vec![Expect::new(f32_, rf(&ia).zip(&rf(&ib), |x, y| x / y))],
        ),
        case(
            "int64 floor division",
            typed::Div.encode(layout::DivRounding {
                rounding_mode: RoundingMode::Floor,
            }),
            &[&ia, &ib],
            &[],
            exact,
            vec![Expect::new(
                i64_,
                rf(&ia).zip(&rf(&ib), |x, y| (x / y).floor()),
            )],
        ),
        case(
            "float32 floor division",
            typed::Div.encode(layout::DivRounding {
                rounding_mode: RoundingMode::Floor,
            }),
            &[&a, &row],
            &[],
            exact,
            vec![Expect::new(
                f32_,
                rf(&a).zip(&rf(&row), |x, y| (x / y).floor()),
            )],
        ),
        case(
            "maximum broadcast",
            typed::Maximum,
            &[&a, &b],
            &[],
            exact,
            vec![Expect::new(f32_, rf(&a).zip(&rf(&b), f64::max))],
        ),
        case(
            "pow 2",
            typed::Pow,
            &[&a],
            &[py_f(2.0)],
            one,
            vec![Expect::new(f32_, rf(&a).map(|x| x * x))],
        ),
        case(
            "pow 0.5",
            typed::Pow,
            &[&row],
            &[py_f(0.5)],
            one,
            vec![Expect::new(f32_, rf(&row).map(f64::sqrt))],
        ),
        case(
            "pow 3 (int exponent on a float tensor)",
            typed::Pow,
            &[&a],
            &[py_i(3)],
            Tol::ulps(f32_, 2.0),
            vec![Expect::new(f32_, rf(&a).map(|x| x * x * x))],
        ),
        case(
            "lt broadcast is bool",
            typed::Lt,
            &[&a, &b],
            &[],
            exact,
            vec![Expect::new(
                bool_,
                rf(&a).zip(&rf(&b), |x, y| f64::from(u8::from(x < y))),
            )],
        ),
        case(
            "ge python float",
            typed::Ge,
            &[&a],
            &[py_f(0.0)],
            exact,
            vec![Expect::new(
                bool_,
                rf(&a).map(|x| f64::from(u8::from(x >= 0.0))),
            )],
        ),
    ]);
}

#[test]
fn where_and_mixed_dtypes() {
    let mut rng = Rng::new(3);
    let (f32_, i64_, bool_) = (DType::F32, DType::I64, DType::Bool);
    let cond = random(&mut rng, bool_, &[2, 1], 0.0, 1.0);
    let a = random(&mut rng, f32_, &[2, 3], -3.0, 3.0);
    let b = random(&mut rng, f32_, &[3], -3.0, 3.0);
    let ia = random(&mut rng, i64_, &[2, 3], -9.0, 9.0);
    let rf = |i: &Input| i.value.clone();
    let select = |c: &Ref, x: &Ref, y: &Ref| {
        let cx = c.zip(x, |c, x| if c != 0.0 { x } else { f64::NAN });
        cx.zip(y, |cx, y| if cx.is_nan() { y } else { cx })
    };
    run_cases(vec![
        case(
            "where broadcast",
            typed::Where.encode(layout::WhereOperands {
                self_kind: None,
                other_kind: None,
            }),
            &[&cond, &a, &b],
            &[],
            Tol::exact(),
            vec![Expect::new(f32_, select(&rf(&cond), &rf(&a), &rf(&b)))],
        ),
        case(
            "float32 + int64 promotes to float32",
            typed::Add,
            &[&a, &ia],
            &[],
            Tol::ulps(f32_, 1.0),
            vec![Expect::new(f32_, rf(&a).zip(&rf(&ia), |x, y| x + y))],
        ),
        case(
            "int64 - python float is float32",
            typed::Sub,
            &[&ia],
            &[ScalarArg::float(0.75)],
            Tol::ulps(f32_, 1.0),
            vec![Expect::new(f32_, rf(&ia).map(|x| x - 0.75))],
        ),
    ]);
}

#[test]
fn casts() {
    let mut rng = Rng::new(4);
    let (f32_, f64_, i64_, i32_, bool_, bf16) = (
        DType::F32,
        DType::F64,
        DType::I64,
        DType::I32,
        DType::Bool,
        DType::BF16,
    );
    let mut x = random(&mut rng, f32_, &[3, 5], -50.0, 50.0);
    x.value.data[0] = -2.75;
    x.value.data[1] = 2.75;
    x.value.data[2] = 0.0;
    let d = random(&mut rng, f64_, &[7], -1.0, 1.0);
    let d = Input::new(f64_, d.value.map(|v| v / 3.0));
    let ints = random(&mut rng, i64_, &[6], -1000.0, 1000.0);
    let bools = random(&mut rng, bool_, &[6], 0.0, 1.0);
    let xb = random(&mut rng, bf16, &[4, 3], -8.0, 8.0);
    let yb = random(&mut rng, bf16, &[3], -8.0, 8.0);
    let cast = |name: &str, input: &Input, to: DType, f: &dyn Fn(f64) -> f64| {
        case(
            name,
            typed::Convert.encode(layout::ConvertTo { dtype: to }),
            &[input],
            &[],
            Tol::exact(),
            vec![Expect::new(to, input.value.map(f))],
        )
    };
    run_cases(vec![
        cast("float32 -> int64 truncates", &x, i64_, &f64::trunc),
        cast("float32 -> int32 truncates", &x, i32_, &f64::trunc),
        cast(
            "float32 -> bfloat16 rounds to nearest even",
            &x,
            bf16,
            &|v| round_to(bf16, v),
        ),
        cast("float32 -> bool", &x, bool_, &|v| {
            f64::from(u8::from(v != 0.0))
        }),
        cast("float64 -> float32 rounds", &d, f32_, &|v| v as f32 as f64),
        cast("int64 -> float32", &ints, f32_, &|v| v as f32 as f64),
        cast("bool -> float32", &bools, f32_, &|v| v),
        case(
            "bfloat16 + bfloat16 computes in float32, rounds once",
            typed::Add,
            &[&xb, &yb],
            &[],
            Tol::exact(),
            vec![Expect::new(
                bf16,
                xb.value.zip(&yb.value, |a, b| round_to(bf16, a + b)),
            )],
        ),
    ]);
}

#[test]
fn reductions() {
    let mut rng = Rng::new(5);
    let (f32_, i64_) = (DType::F32, DType::I64);
    let x = random(&mut rng, f32_, &[3, 4, 5], -2.0, 2.0);
    let xi = random(&mut rng, i64_, &[4, 6], -100.0, 100.0);
    let r = x.value.clone();
    let sum_tol = Tol::ulps(f32_, 4.0);
    let argmax = |g: &[f64]| {
        let mut best = 0;
        for (i, &v) in g.iter().enumerate() {
            if v > g[best] {
                best = i;
            }
        }
        best as f64
    };
    let var1 = |g: &[f64]| {
        let m = g.iter().sum::<f64>() / g.len() as f64;
        g.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (g.len() as f64 - 1.0)
    };
    let lse = |g: &[f64]| {
        let m = g.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        m + g.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
    };
    run_cases(vec![
        case(
            "sum dim 1",
            typed::Sum.encode(layout::ReduceDtypeDims {
                keepdim: false,
                dtype: None,
                dims: &[1],
            }),
            &[&x],
            &[],
            sum_tol,
            vec![Expect::scaled(
                f32_,
                r.sum(&[1], false),
                &r.abs_sum(&[1], false),
            )],
        ),
        case(
            "sum all",
            sum_all(),
            &[&x],
            &[],
            sum_tol,
            vec![Expect::scaled(
                f32_,
                r.sum(&[], false),
                &r.abs_sum(&[], false),
            )],
        ),
        case(
            "sum dims -1,0 keepdim",
            typed::Sum.encode(layout::ReduceDtypeDims {
                keepdim: true,
                dtype: None,
                dims: &[-1, 0],
            }),
            &[&x],
            &[],
            sum_tol,
            vec![Expect::scaled(
                f32_,
                r.sum(&[0, 2], true),
                &r.abs_sum(&[0, 2], true),
            )],
        ),
        case(
            "sum int64 is exact int64",
            typed::Sum.encode(layout::ReduceDtypeDims {
                keepdim: false,
                dtype: None,
                dims: &[0],
            }),
            &[&xi],
            &[],
            Tol::exact(),
            vec![Expect::new(i64_, xi.value.sum(&[0], false))],
        ),
        case(
            "sum float32 with dtype float64",
            typed::Sum.encode(layout::ReduceDtypeDims {
                keepdim: false,
                dtype: Some(DType::F64),
                dims: &[2],
            }),
            &[&x],
            &[],
            Tol::ulps(DType::F64, 8.0),
            vec![Expect::scaled(
                DType::F64,
                r.sum(&[2], false),
                &r.abs_sum(&[2], false),
            )],
        ),
        case(
            "mean dims 0,2 keepdim",
            typed::Mean.encode(layout::ReduceDtypeDims {
                keepdim: true,
                dtype: None,
                dims: &[0, 2],
            }),
            &[&x],
            &[],
            sum_tol,
            vec![Expect::scaled(
                f32_,
                r.mean(&[0, 2], true),
                &r.abs_sum(&[0, 2], true).map(|v| v / 15.0),
            )],
        ),
        case(
            "amax dim 2",
            typed::Amax.encode(layout::ReduceDims {
                keepdim: false,
                dims: &[2],
            }),
            &[&x],
            &[],
            Tol::exact(),
            vec![Expect::new(f32_, r.amax(&[2], false))],
        ),
        case(
            "argmax dim 1 keepdim",
            typed::Argmax.encode(layout::ArgReduce {
                keepdim: true,
                dim: Some(1),
            }),
            &[&x],
            &[],
            Tol::exact(),
            vec![Expect::new(i64_, r.reduce(&[1], true, argmax))],
        ),
        case(
            "var dim 1 correction 1",
            typed::Var.encode(layout::ReduceCorrectionDims {
                keepdim: false,
                correction: 1.0,
                dims: &[1],
            }),
            &[&x],
            &[],
            Tol::ulps(f32_, 16.0),
            vec![Expect::scaled(
                f32_,
                r.reduce(&[1], false, var1),
                &r.reduce(&[1], false, |g| g.iter().map(|v| v * v).sum::<f64>()),
            )],
        ),
        case(
            "logsumexp dim 2",
            typed::Logsumexp.encode(layout::ReduceDims {
                keepdim: false,
                dims: &[2],
            }),
            &[&x],
            &[],
            Tol::ulps(f32_, 8.0),
            vec![Expect::scaled(
                f32_,
                r.reduce(&[2], false, lse),
                &r.abs_sum(&[2], false),
            )],
        ),
    ]);
}

/// Batch `b` of a `[B, M, N]` reference as a matrix.
fn batch(r: &Ref, b: usize) -> Ref {
    let (m, n) = (r.shape[1], r.shape[2]);
    let len = (m * n) as usize;
    Ref::new(&[m, n], r.data[b * len..(b + 1) * len].to_vec())
}

#[test]
fn matrix_products() {
    let mut rng = Rng::new(6);
    let f32_ = DType::F32;
    let a = random(&mut rng, f32_, &[5, 7], -1.0, 1.0);
    let b = random(&mut rng, f32_, &[7, 3], -1.0, 1.0);
    let bias = random(&mut rng, f32_, &[3], -1.0, 1.0);
    let ba = random(&mut rng, f32_, &[2, 3, 4], -1.0, 1.0);
    let bb = random(&mut rng, f32_, &[2, 4, 5], -1.0, 1.0);
    let (ra, rb) = (a.value.clone(), b.value.clone());
    let tol = Tol::ulps(f32_, 4.0);
    let bmm: Vec<Ref> = (0..2)
        .map(|i| batch(&ba.value, i).matmul(&batch(&bb.value, i)))
        .collect();
    let bmm_abs: Vec<Ref> = (0..2)
        .map(|i| batch(&ba.value, i).matmul_abs(&batch(&bb.value, i)))
        .collect();
    let stack = |parts: &[Ref]| {
        let data: Vec<f64> = parts.iter().flat_map(|p| p.data.clone()).collect();
        let mut shape = vec![parts.len() as i64];
        shape.extend_from_slice(&parts[0].shape);
        Ref::new(&shape, data)
    };
    let addmm = ra.matmul(&rb).zip(&bias.value, |p, c| 0.5 * c + 2.0 * p);
    let addmm_scale = ra
        .matmul_abs(&rb)
        .zip(&bias.value, |p, c| 0.5 * c.abs() + 2.0 * p);
    run_cases(vec![
        case(
            "mm [5,7] @ [7,3]",
            typed::Mm,
            &[&a, &b],
            &[],
            tol,
            vec![Expect::scaled(f32_, ra.matmul(&rb), &ra.matmul_abs(&rb))],
        ),
        case(
            "matmul [5,7] @ [7,3]",
            typed::Matmul,
            &[&a, &b],
            &[],
            tol,
            vec![Expect::scaled(f32_, ra.matmul(&rb), &ra.matmul_abs(&rb))],
        ),
        case(
            "addmm beta 0.5 alpha 2 with a broadcast bias",
            typed::Addmm,
            &[&bias, &a, &b],
            &[ScalarArg::float(0.5), ScalarArg::float(2.0)],
            tol,
            vec![Expect::scaled(f32_, addmm, &addmm_scale)],
        ),
        case(
            "bmm [2,3,4] @ [2,4,5]",
            typed::Bmm,
            &[&ba, &bb],
            &[],
            tol,
            vec![Expect::scaled(f32_, stack(&bmm), &stack(&bmm_abs))],
        ),
    ]);
}

#[test]
fn cat_softmax_nll_loss() {
    let mut rng = Rng::new(7);
    let (f32_, i64_) = (DType::F32, DType::I64);
    let p0 = random(&mut rng, f32_, &[2, 3], -5.0, 5.0);
    let p1 = random(&mut rng, f32_, &[1, 3], -5.0, 5.0);
    let p2 = random(&mut rng, f32_, &[4, 3], -5.0, 5.0);
    let q = random(&mut rng, f32_, &[2, 2], -5.0, 5.0);
    let qi = random(&mut rng, i64_, &[2, 4], -5.0, 5.0);
    let logits = random(&mut rng, f32_, &[6, 5], -3.0, 3.0);
    let logp = Input::new(f32_, logits.value.log_softmax(1));
    let targets = Input::new(i64_, Ref::new(&[6], vec![0.0, 4.0, 2.0, 2.0, 1.0, 3.0]));
    let t: Vec<i64> = targets.value.data.iter().map(|&v| v as i64).collect();
    let r = logits.value.clone();
    let soft_tol = Tol::ulps(f32_, 8.0);
    let ls_scale = r.map(f64::abs).zip(
        &r.reduce(&[1], true, |g| g.iter().map(|v| v.abs()).sum()),
        |a, b| a + b,
    );
    let nll = |reduction: i64, ignore: i64| {
        let (out, total) = logp.value.nll_loss(&t, reduction, ignore);
        let scale = logp.value.map(f64::abs).sum(&[], false).data[0];
        let out_scale = Ref::new(&out.shape, vec![scale; out.numel()]);
        vec![
            Expect::scaled(f32_, out, &out_scale),
            Expect::new(f32_, Ref::scalar(total)),
        ]
    };
    run_cases(vec![
        case(
            "cat dim 0 of three",
            typed::Cat.encode(layout::Dim { dim: 0 }),
            &[&p0, &p1, &p2],
            &[],
            Tol::exact(),
            vec![Expect::new(
                f32_,
                Ref::cat(&[&p0.value, &p1.value, &p2.value], 0),
            )],
        ),
        case(
            "cat dim -1",
            typed::Cat.encode(layout::Dim { dim: -1 }),
            &[&p0, &q],
            &[],
            Tol::exact(),
            vec![Expect::new(f32_, Ref::cat(&[&p0.value, &q.value], 1))],
        ),
        case(
            "cat float32 with int64 promotes",
            typed::Cat.encode(layout::Dim { dim: 1 }),
            &[&q, &qi],
            &[],
            Tol::exact(),
            vec![Expect::new(f32_, Ref::cat(&[&q.value, &qi.value], 1))],
        ),
        case(
            "softmax dim 1",
            typed::Softmax.encode(layout::SoftmaxDim {
                dim: 1,
                half_to_float: false,
            }),
            &[&logits],
            &[],
            soft_tol,
            vec![Expect::new(f32_, r.softmax(1))],
        ),
        case(
            "softmax dim 0",
            typed::Softmax.encode(layout::SoftmaxDim {
                dim: 0,
                half_to_float: false,
            }),
            &[&logits],
            &[],
            soft_tol,
            vec![Expect::new(f32_, r.softmax(0))],
        ),
        case(
            "log_softmax dim -1",
            typed::LogSoftmax.encode(layout::SoftmaxDim {
                dim: -1,
                half_to_float: false,
            }),
            &[&logits],
            &[],
            soft_tol,
            vec![Expect::scaled(f32_, r.log_softmax(1), &ls_scale)],
        ),
        case(
            "nll_loss mean",
            typed::NllLoss.encode(layout::NllLossReduction {
                reduction: Reduction::Mean,
                ignore_index: -100,
            }),
            &[&logp, &targets],
            &[],
            Tol::ulps(f32_, 4.0),
            nll(1, -100),
        ),
        case(
            "nll_loss sum",
            typed::NllLoss.encode(layout::NllLossReduction {
                reduction: Reduction::Sum,
                ignore_index: -100,
            }),
            &[&logp, &targets],
            &[],
            Tol::ulps(f32_, 4.0),
            nll(2, -100),
        ),
        case(
            "nll_loss none",
            typed::NllLoss.encode(layout::NllLossReduction {
                reduction: Reduction::None,
                ignore_index: -100,
            }),
            &[&logp, &targets],
            &[],
            Tol::exact(),
            nll(0, -100),
        ),
        case(
            "nll_loss mean with ignore_index 2",
            typed::NllLoss.encode(layout::NllLossReduction {
                reduction: Reduction::Mean,
                ignore_index: 2,
            }),
            &[&logp, &targets],
            &[],
            Tol::ulps(f32_, 4.0),
            nll(1, 2),
        ),
    ]);
}

/// Many different ops fused into one region still agree with the reference: every unary op's
/// result is summed into one value, captured in DeferAndFuse and read once.
#[test]
fn mixed_ops_fuse_into_one_region_and_agree() {
    let e = engine(Mode::DeferAndFuse);
    let mut rng = Rng::new(8);
    let xs = rng.values(24, 0.1, 2.0);
    let ys = rng.values(6, -1.0, 1.0);
    let x = upload(&e, DType::F32, &xs, &[4, 6]);
    let y = upload(&e, DType::F32, &ys, &[6]);
    let rx = Ref::new(&[4, 6], xs.clone());
    let ry = Ref::new(&[6], ys.clone());
    e.reset_metrics();
    let terms = [
        typed::Exp,
        typed::Log,
        typed::Sqrt,
        typed::Tanh,
        typed::Sigmoid,
        typed::Neg,
    ];
    let mut acc = op(&e, typed::Mul, &[&x, &y], &[]);
    for t in terms {
        let v = op(&e, t, &[&x], &[]);
        let next = op(&e, typed::Add, &[&acc, &v], &[ScalarArg::float(0.5)]);
        release(&e, v);
        release(&e, std::mem::replace(&mut acc, next));
    }
    let sm = op(
        &e,
        typed::Softmax.encode(layout::SoftmaxDim {
            dim: 1,
            half_to_float: false,
        }),
        &[&acc],
        &[],
    );
    let total = op(
        &e,
        typed::Sum.encode(layout::ReduceDtypeDims {
            keepdim: false,
            dtype: None,
            dims: &[1],
        }),
        &[&sm],
        &[],
    );
    assert_eq!(metric(&e, "regions"), 0.0, "nothing runs before the read");
    let got = read(&e, &total);
    assert_eq!(
        metric(&e, "regions"),
        1.0,
        "one region for the whole program"
    );
    assert_eq!(metric(&e, "compilations"), 1.0);
    let mut want = rx.zip(&ry, |a, b| a * b);
    let fns: [fn(f64) -> f64; 6] = [
        f64::exp,
        f64::ln,
        f64::sqrt,
        f64::tanh,
        |v| 1.0 / (1.0 + (-v).exp()),
        |v| -v,
    ];
    for f in fns {
        want = want.zip(&rx.map(f), |a, b| a + 0.5 * b);
    }
    let want = want.softmax(1).sum(&[1], false);
    assert_close(
        "fused mixed program",
        &got,
        &want.data,
        Tol::ulps(DType::F32, 16.0),
    );
}
