//! Differential property test: random programs of elementwise, scalar, reduction and softmax ops
//! over shapes from a small fixed pool run in Strict, in DeferAndFuse (one fused region) and in
//! an f64 reference that tracks a first-order error bound for every value; all agree within a
//! few ulps of that bound. `PROPTEST_CASES` scales the number of programs (default 24).

mod common;

use common::reference::{broadcast_shape, Ref};
use common::*;
use defer::{Mode, TensorRef};
use ops::param_layout::of;
use ops::{DType, OpId, ScalarArg, TypedOp};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use torch_glue::Engine;

const SHAPES: [&[i64]; 3] = [&[6], &[4, 5], &[2, 3, 4]];
const MAX_NUMEL: usize = 24;
/// Units of f32 epsilon allowed per unit of tracked error (rounding, FMA contraction, XLA's
/// transcendental approximations, reduction order).
const ULPS: f64 = 8.0;

#[derive(Clone, Debug)]
enum Step {
    Unary(OpId, Index),
    Binary(OpId, Index, Index),
    MulScalar(Index, f32),
    AddScalar(Index, Result<i8, f32>),
    AddAlpha(Index, Index, f32),
    Reduce(OpId, Index, Index),
    Softmax(Index, Index),
}

#[derive(Clone, Debug)]
struct Program {
    shape: usize,
    a: Vec<f32>,
    b: Vec<f32>,
    steps: Vec<Step>,
    keep: Index,
}

fn scalar_value() -> impl Strategy<Value = f32> {
    (-8i32..=8).prop_map(|q| q as f32 * 0.25)
}

fn step() -> impl Strategy<Value = Step> {
    let unary = prop::sample::select(vec![
        OpId::Neg,
        OpId::Abs,
        OpId::Relu,
        OpId::Tanh,
        OpId::Sigmoid,
        OpId::Sin,
    ]);
    let binary = prop::sample::select(vec![OpId::Add, OpId::Sub, OpId::Mul, OpId::Maximum]);
    let reduce = prop::sample::select(vec![OpId::Sum, OpId::Mean, OpId::Amax]);
    prop_oneof![
        3 => (unary, any::<Index>()).prop_map(|(o, i)| Step::Unary(o, i)),
        3 => (binary, any::<Index>(), any::<Index>()).prop_map(|(o, i, j)| Step::Binary(o, i, j)),
        1 => (any::<Index>(), scalar_value()).prop_map(|(i, s)| Step::MulScalar(i, s)),
        1 => (any::<Index>(), prop_oneof![(-3i8..=3).prop_map(Ok), scalar_value().prop_map(Err)])
            .prop_map(|(i, s)| Step::AddScalar(i, s)),
        1 => (any::<Index>(), any::<Index>(), scalar_value())
            .prop_map(|(i, j, s)| Step::AddAlpha(i, j, s)),
        2 => (reduce, any::<Index>(), any::<Index>()).prop_map(|(o, i, d)| Step::Reduce(o, i, d)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(i, d)| Step::Softmax(i, d)),
    ]
}

fn program() -> impl Strategy<Value = Program> {
    let values = || prop::collection::vec(-2.0f32..2.0, MAX_NUMEL);
    (
        0..SHAPES.len(),
        values(),
        values(),
        prop::collection::vec(step(), 1..=6),
        any::<Index>(),
    )
        .prop_map(|(shape, a, b, steps, keep)| Program {
            shape,
            a,
            b,
            steps,
            keep,
        })
}

/// A reference value and its error bound (in units of f32 epsilon), element-wise.
#[derive(Clone, Debug)]
struct Tracked {
    v: Ref,
    e: Ref,
}

impl Tracked {
    fn exact(v: Ref) -> Tracked {
        let e = v.map(|_| 0.0);
        Tracked { v, e }
    }

    fn shape(&self) -> &[i64] {
        &self.v.shape
    }
}

/// Combines two tracked values element-wise: `f` gives the value, `g` the error from
/// `(a, ea, b, eb, result)`.
fn zip2(
    a: &Tracked,
    b: &Tracked,
    f: impl Fn(f64, f64) -> f64,
    g: impl Fn(f64, f64, f64, f64, f64) -> f64,
) -> Tracked {
    let v = a.v.zip(&b.v, &f);
    let shape = broadcast_shape(a.shape(), b.shape());
    let n = v.numel();
    // Broadcast every operand to the result's shape, then combine element by element.
    let bcast = |r: &Ref| r.zip(&Ref::new(&shape, vec![0.0; n]), |x, _| x);
    let (av, ae, bv, be) = (bcast(&a.v), bcast(&a.e), bcast(&b.v), bcast(&b.e));
    let e = (0..n)
        .map(|i| g(av.data[i], ae.data[i], bv.data[i], be.data[i], v.data[i]))
        .collect();
    Tracked {
        v,
        e: Ref::new(&shape, e),
    }
}

fn map1(a: &Tracked, f: impl Fn(f64) -> f64, g: impl Fn(f64, f64, f64) -> f64) -> Tracked {
    let v = a.v.map(&f);
    let e = (0..v.numel())
        .map(|i| g(a.v.data[i], a.e.data[i], v.data[i]))
        .collect();
    Tracked {
        e: Ref::new(&v.shape, e),
        v,
    }
}

fn pick<'a, T>(values: &'a [T], i: &Index) -> (usize, &'a T) {
    let k = i.index(values.len());
    (k, &values[k])
}

/// The reference run of a program: every value with its error bound.
fn reference(p: &Program) -> Vec<Tracked> {
    let shape = SHAPES[p.shape];
    let n = shape.iter().product::<i64>() as usize;
    let input =
        |v: &[f32]| Tracked::exact(Ref::new(shape, v[..n].iter().map(|&x| x as f64).collect()));
    let mut values = vec![input(&p.a), input(&p.b)];
    for s in &p.steps {
        let next = match s {
            Step::Unary(o, i) => {
                let (_, x) = pick(&values, i);
                match o {
                    OpId::Neg => map1(x, |v| -v, |_, e, _| e),
                    OpId::Abs => map1(x, f64::abs, |_, e, _| e),
                    OpId::Relu => map1(x, |v| v.max(0.0), |_, e, _| e),
                    OpId::Tanh => map1(x, f64::tanh, |_, e, y| e + y.abs() + 1e-3),
                    OpId::Sigmoid => {
                        map1(x, |v| 1.0 / (1.0 + (-v).exp()), |_, e, y| e / 4.0 + y.abs())
                    }
                    OpId::Sin => map1(x, f64::sin, |v, e, _| e + v.abs() + 1.0),
                    other => unreachable!("{other:?}"),
                }
            }
            Step::Binary(o, i, j) => {
                let (_, x) = pick(&values, i);
                let (_, y) = pick(&values, j);
                match o {
                    OpId::Add => zip2(x, y, |a, b| a + b, |_, ea, _, eb, r| ea + eb + r.abs()),
                    OpId::Sub => zip2(x, y, |a, b| a - b, |_, ea, _, eb, r| ea + eb + r.abs()),
                    OpId::Mul => zip2(
                        x,
                        y,
                        |a, b| a * b,
                        |a, ea, b, eb, r| b.abs() * ea + a.abs() * eb + r.abs(),
                    ),
                    OpId::Maximum => zip2(x, y, f64::max, |_, ea, _, eb, _| ea.max(eb)),
                    other => unreachable!("{other:?}"),
                }
            }
            Step::MulScalar(i, s) => {
                let s = *s as f64;
                map1(
                    pick(&values, i).1,
                    |v| v * s,
                    |_, e, r| s.abs() * e + r.abs(),
                )
            }
            Step::AddScalar(i, s) => {
                let s = s.map_or_else(|f| f as f64, |i| i as f64);
                map1(pick(&values, i).1, |v| v + s, |_, e, r| e + r.abs())
            }
            Step::AddAlpha(i, j, alpha) => {
                let alpha = *alpha as f64;
                zip2(
                    pick(&values, i).1,
                    pick(&values, j).1,
                    |a, b| a + alpha * b,
                    |_, ea, b, eb, r| ea + alpha.abs() * eb + (alpha * b).abs() + r.abs(),
                )
            }
            Step::Reduce(o, i, d) => {
                let (_, x) = pick(&values, i);
                let dim = d.index(x.shape().len());
                let len = x.shape()[dim] as f64;
                match o {
                    OpId::Sum | OpId::Mean => {
                        let div = if *o == OpId::Mean { len } else { 1.0 };
                        let v = x.v.sum(&[dim], true).map(|s| s / div);
                        let spread = x.v.abs_sum(&[dim], true).map(|s| s * len / div);
                        let carried = x.e.sum(&[dim], true).map(|s| s / div);
                        let e = carried.zip(&spread, |c, s| c + s);
                        Tracked { v, e }
                    }
                    OpId::Amax => Tracked {
                        v: x.v.amax(&[dim], true),
                        e: x.e.amax(&[dim], true),
                    },
                    other => unreachable!("{other:?}"),
                }
            }
            Step::Softmax(i, d) => {
                let (_, x) = pick(&values, i);
                let dim = d.index(x.shape().len());
                let v = x.v.softmax(dim);
                let lane_err = x.e.amax(&[dim], true);
                let lane_mag = x.v.map(f64::abs).amax(&[dim], true);
                let len = x.shape()[dim] as f64;
                let per_lane = lane_err.zip(&lane_mag, |e, m| 2.0 * e + 2.0 * m);
                let e = v.zip(&per_lane, |s, l| s * l + len);
                Tracked { v, e }
            }
        };
        values.push(next);
    }
    values
}

/// A unary or binary op of a step (none takes params).
fn no_params(o: OpId) -> NoParams {
    NoParams::of(o).expect("an op without params")
}

/// Runs a program on the engine in its current mode; returns the last value and the kept one.
fn run(e: &Engine, p: &Program) -> (Vec<f64>, usize, Vec<f64>) {
    let shape = SHAPES[p.shape];
    let n = shape.iter().product::<i64>() as usize;
    let up = |v: &[f32]| {
        let v: Vec<f64> = v[..n].iter().map(|&x| x as f64).collect();
        upload(e, DType::F32, &v, shape)
    };
    let mut values: Vec<TensorRef> = vec![up(&p.a), up(&p.b)];
    for s in &p.steps {
        let t = |i: &Index| pick(&values, i).1.clone();
        let next = match s {
            Step::Unary(o, i) => op(e, no_params(*o), &[&t(i)], &[]),
            Step::Binary(o, i, j) => op(e, no_params(*o), &[&t(i), &t(j)], &[]),
            Step::MulScalar(i, s) => op(e, typed::Mul, &[&t(i)], &[ScalarArg::float(*s as f64)]),
            Step::AddScalar(i, s) => {
                let s = s.map_or_else(|f| ScalarArg::float(f as f64), |i| ScalarArg::int(i as i64));
                op(e, typed::Add, &[&t(i)], &[s])
            }
            Step::AddAlpha(i, j, a) => op(
                e,
                typed::Add,
                &[&t(i), &t(j)],
                &[ScalarArg::float(*a as f64)],
            ),
            Step::Reduce(o, i, d) => {
                let x = t(i);
                let dim = d.index(x.sizes.len()) as i64;
                let dims = [dim];
                let call = match o {
                    OpId::Amax => typed::Amax.encode(layout::ReduceDims {
                        keepdim: true,
                        dims: &dims,
                    }),
                    _ => TypedOp::<of::ReduceDtypeDims>::of(*o)
                        .expect("sum or mean")
                        .encode(layout::ReduceDtypeDims {
                            keepdim: true,
                            dtype: None,
                            dims: &dims,
                        }),
                };
                op(e, call, &[&x], &[])
            }
            Step::Softmax(i, d) => {
                let x = t(i);
                let dim = d.index(x.sizes.len()) as i64;
                op(
                    e,
                    typed::Softmax.encode(layout::SoftmaxDim {
                        dim,
                        half_to_float: false,
                    }),
                    &[&x],
                    &[],
                )
            }
        };
        values.push(next);
    }
    // Keep the last value and one other (still held, so an output of the fused region too);
    // release the rest as Python would.
    let last = values.len() - 1;
    let (kept, _) = pick(&values[..last], &p.keep);
    for (k, t) in values.iter().enumerate() {
        if k != last && k != kept {
            release(e, t.clone());
        }
    }
    let out = read(e, &values[last]);
    let kept_values = read(e, &values[kept]);
    release(e, values[last].clone());
    release(e, values[kept].clone());
    (out, kept, kept_values)
}

fn check(what: &str, got: &[f64], want: &Tracked) -> Result<(), TestCaseError> {
    let eps = f32::EPSILON as f64;
    for (i, &g) in got.iter().enumerate() {
        let (w, err) = (want.v.data[i], want.e.data[i]);
        let allowed = ULPS * eps * err + 1e-30;
        prop_assert!(
            (g - w).abs() <= allowed,
            "{what}: element {i} is {g:e}, reference {w:e}, allowed difference {allowed:e}"
        );
    }
    Ok(())
}

#[test]
fn random_programs_agree_in_strict_defer_and_fuse_and_f64() {
    let e = engine(Mode::Strict);
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 24;
    }
    config.source_file = Some(file!());
    let mut runner = TestRunner::new(config);
    let fused_regions = std::cell::Cell::new(0.0);
    let result = runner.run(&program(), |p| {
        let want = reference(&p);
        let (strict, kept, strict_kept) = run(&e, &p);
        let regions_before = metric(&e, "regions");
        let (fused, _, fused_kept) = with_mode(&e, Mode::DeferAndFuse, || run(&e, &p));
        let regions = metric(&e, "regions") - regions_before;
        prop_assert_eq!(regions, 1.0, "the whole program is one region");
        fused_regions.set(fused_regions.get() + regions);
        let last = want.len() - 1;
        check("Strict", &strict, &want[last])?;
        check("DeferAndFuse", &fused, &want[last])?;
        check("Strict, kept value", &strict_kept, &want[kept])?;
        check("DeferAndFuse, kept value", &fused_kept, &want[kept])?;
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(fused_regions.get() >= 1.0);
}
