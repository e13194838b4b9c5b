//! DeferAndFuse through the engine's metrics: ops are deferred and counted, a chain becomes one
//! region and one compilation, repeated programs and changed scalars hit the cache, scalar kinds
//! and dimensions are named in the key, ordered materialization keeps loops bounded, and a
//! training loop reaches one cached region per step with no explicit sync.

mod common;

use common::reference::Ref;
use common::*;
use defer::{Mode, TensorRef};
use ops::params::Reduction;
use ops::{DType, OpId, ScalarArg};
use std::ops::Neg;
use torch_glue::Engine;

fn f(x: f64) -> ScalarArg {
    ScalarArg::float(x)
}

/// Metrics of interest, read at once.
#[derive(Debug, Clone, Copy, PartialEq)]
struct M {
    compilations: f64,
    cache_hits: f64,
    regions: f64,
    executions: f64,
    deferred: f64,
    pending: f64,
}

fn m(e: &Engine) -> M {
    let s = e.metrics();
    let v = |k: &str| s.values[k];
    M {
        compilations: v("compilations"),
        cache_hits: v("cache_hits"),
        regions: v("regions"),
        executions: v("executions"),
        deferred: v("deferred_ops"),
        pending: v("pending_ops"),
    }
}

/// A 16-op elementwise chain from `x`, releasing intermediates as Python would.
fn chain16(e: &Engine, x: &TensorRef, scale: f64) -> TensorRef {
    let mut t = op(e, typed::Mul, &[x], &[f(scale)]);
    let steps: [(NoParams, Option<f64>); 15] = [
        (typed::Add, Some(1.0)),
        (typed::Tanh, None),
        (typed::Mul, Some(3.0)),
        (typed::Sigmoid, None),
        (typed::Sub, Some(0.25)),
        (typed::Abs, None),
        (typed::Add, Some(0.5)),
        (typed::Sqrt, None),
        (typed::Mul, Some(-2.0)),
        (typed::Exp, None),
        (typed::Add, Some(1.0)),
        (typed::Log, None),
        (typed::Neg, None),
        (typed::Mul, Some(0.75)),
        (typed::Relu, None),
    ];
    for (step, scalar) in steps {
        let scalars: Vec<ScalarArg> = scalar.map(f).into_iter().collect();
        let next = op(e, step, &[&t], &scalars);
        release(e, std::mem::replace(&mut t, next));
    }
    t
}

fn chain16_ref(x: f64, scale: f64) -> f64 {
    let t = ((x * scale + 1.0).tanh() * 3.0).neg();
    let v = 1.0 / (1.0 + t.exp()) - 0.25;
    let v = ((v.abs() + 0.5).sqrt() * -2.0).exp() + 1.0;
    (-(v.ln()) * 0.75).max(0.0)
}

#[test]
fn ops_are_deferred_and_counted_until_read() {
    let e = engine(Mode::DeferAndFuse);
    let x = upload_f32(&e, &[1.0, 2.0, 3.0], &[3]);
    e.reset_metrics();
    let a = op(&e, typed::Mul, &[&x, &x], &[]);
    let b = op(&e, typed::Add, &[&a, &x], &[f(2.0)]);
    let c = op(&e, typed::Neg, &[&b], &[]);
    let before = m(&e);
    assert_eq!(before.deferred, 3.0);
    assert_eq!(before.pending, 3.0);
    assert_eq!(
        (before.regions, before.executions, before.compilations),
        (0.0, 0.0, 0.0)
    );
    assert_eq!(metric(&e, "materializations"), 0.0);
    assert_eq!(read_f32(&e, &c), vec![-3.0, -8.0, -15.0]);
    let after = m(&e);
    assert_eq!(
        (after.regions, after.executions, after.pending),
        (1.0, 1.0, 0.0)
    );
    assert_eq!(metric(&e, "materializations"), 1.0);
    assert_eq!(metric(&e, "region_ops"), 3.0);
    // a and b are still held: they were outputs of the region, so reading them runs nothing.
    assert_eq!(read_f32(&e, &a), vec![1.0, 4.0, 9.0]);
    assert_eq!(read_f32(&e, &b), vec![3.0, 8.0, 15.0]);
    assert_eq!(
        m(&e).regions,
        1.0,
        "values live outside the region were materialized with it"
    );
    assert_eq!(m(&e).executions, 1.0);
}

#[test]
fn a_16_op_chain_is_one_region_and_one_compilation() {
    let e = engine(Mode::DeferAndFuse);
    let mut rng = Rng::new(21);
    let xs = rng.values(64, -2.0, 2.0);
    let x = upload(&e, DType::F32, &xs, &[8, 8]);
    e.reset_metrics();
    let y = chain16(&e, &x, 0.5);
    assert_eq!(m(&e).deferred, 16.0);
    let got = read(&e, &y);
    let s = m(&e);
    assert_eq!((s.regions, s.compilations, s.executions), (1.0, 1.0, 1.0));
    assert_eq!(metric(&e, "region_ops"), 16.0);
    assert_eq!(metric(&e, "largest_region"), 16.0);
    let want: Vec<f64> = xs.iter().map(|&v| chain16_ref(v, 0.5)).collect();
    assert_close("16-op chain", &got, &want, Tol::ulps(DType::F32, 16.0));

    // The same program again (new uploads): a cache hit, no compilation.
    let x2 = upload(&e, DType::F32, &xs, &[8, 8]);
    let y2 = chain16(&e, &x2, 0.5);
    assert_eq!(
        read(&e, &y2),
        got,
        "the same executable gives the same bits"
    );
    let s = m(&e);
    assert_eq!((s.regions, s.compilations, s.cache_hits), (2.0, 1.0, 1.0));

    // A changed scalar is a runtime argument: no compilation, new values.
    let y3 = chain16(&e, &x2, 0.25);
    let got3 = read(&e, &y3);
    let s = m(&e);
    assert_eq!((s.regions, s.compilations, s.cache_hits), (3.0, 1.0, 2.0));
    let want3: Vec<f64> = xs.iter().map(|&v| chain16_ref(v, 0.25)).collect();
    assert_close(
        "16-op chain, scale 0.25",
        &got3,
        &want3,
        Tol::ulps(DType::F32, 16.0),
    );
}

#[test]
fn changed_scalars_never_recompile_in_any_mode() {
    for mode in [Mode::Strict, Mode::DeferAndFuse] {
        let e = engine(mode);
        let x = upload_f32(&e, &[1.0, -2.0, 4.0], &[3]);
        let run = |scale: f64, alpha: f64, fill: f64| {
            let a = op(&e, typed::Mul, &[&x], &[f(scale)]);
            let full = op(
                &e,
                typed::Full.encode(layout::Creation {
                    dtype: DType::F32,
                    sizes: &[3],
                }),
                &[],
                &[f(fill)],
            );
            let b = op(&e, typed::Add, &[&a, &full], &[f(alpha)]);
            let v = read_f32(&e, &b);
            for t in [a, full, b] {
                release(&e, t);
            }
            v
        };
        assert_eq!(run(0.5, 1.0, 1.0), vec![1.5, 0.0, 3.0], "{mode:?}");
        let compiled = m(&e).compilations;
        assert_eq!(run(0.25, 2.0, -1.0), vec![-1.75, -2.5, -1.0], "{mode:?}");
        assert_eq!(run(-1.0, 0.5, 8.0), vec![3.0, 6.0, 0.0], "{mode:?}");
        assert_eq!(
            m(&e).compilations,
            compiled,
            "{mode:?}: x * 0.5 vs x * 0.25, alpha, fill"
        );

        // An int scalar where a float was: another key, one compilation.
        let a = op(&e, typed::Mul, &[&x], &[ScalarArg::int(2)]);
        assert_eq!(read_f32(&e, &a), vec![2.0, -4.0, 8.0]);
        assert_eq!(
            m(&e).compilations,
            compiled + 1.0,
            "{mode:?}: int vs float scalar"
        );
    }
}

/// `pow`'s exponent stays a runtime scalar, but the values PyTorch computes another way (2, 3,
/// 0.5, -0.5, -1, -2, 1, 0) each pick their own module, so XLA sees `x * x` rather than `power`.
#[test]
fn special_pow_exponents_pick_a_module_and_others_share_one() {
    for mode in [Mode::Strict, Mode::DeferAndFuse] {
        let e = engine(mode);
        let x = upload_f32(&e, &[0.25, 1.5, 4.0], &[3]);
        let pow = |exponent: f64| {
            let y = op(&e, typed::Pow, &[&x], &[f(exponent)]);
            let v = read_f32(&e, &y);
            release(&e, y);
            v
        };
        let want = |exponent: f64| -> Vec<f32> {
            [0.25f32, 1.5, 4.0]
                .iter()
                .map(|&v| (v as f64).powf(exponent) as f32)
                .collect()
        };
        let start = m(&e).compilations;
        assert_eq!(pow(2.0), want(2.0), "{mode:?}");
        assert_eq!(pow(2.0), want(2.0), "{mode:?}");
        assert_eq!(m(&e).compilations, start + 1.0, "{mode:?}: x ** 2 twice");
        assert_eq!(pow(0.5), want(0.5), "{mode:?}");
        assert_eq!(pow(1.0), want(1.0), "{mode:?}");
        assert_eq!(pow(0.0), want(0.0), "{mode:?}");
        assert_eq!(
            m(&e).compilations,
            start + 4.0,
            "{mode:?}: one module per special value"
        );
        let general = pow(1.7);
        assert_close(
            "x ** 1.7",
            &general.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            &want(1.7).iter().map(|&v| v as f64).collect::<Vec<_>>(),
            Tol::ulps(DType::F32, 4.0),
        );
        let after_general = m(&e).compilations;
        for exponent in [2.5, -3.25, 7.0] {
            let got: Vec<f64> = pow(exponent).iter().map(|&v| v as f64).collect();
            let want: Vec<f64> = want(exponent).iter().map(|&v| v as f64).collect();
            assert_close(
                &format!("x ** {exponent}"),
                &got,
                &want,
                Tol::ulps(DType::F32, 4.0),
            );
        }
        assert_eq!(
            m(&e).compilations,
            after_general,
            "{mode:?}: general exponents share one module"
        );
    }
}

#[test]
fn new_dimensions_compile_and_are_named_as_such() {
    let e = engine(Mode::DeferAndFuse);
    for (n, expect_recompiles) in [(4i64, 0.0), (4, 0.0), (9, 1.0), (9, 1.0), (16, 2.0)] {
        let x = upload(&e, DType::F32, &vec![1.0; n as usize], &[n]);
        let y = chain16(&e, &x, 0.5);
        let got = read(&e, &y);
        assert_close(
            "chain",
            &got,
            &vec![chain16_ref(1.0, 0.5); n as usize],
            Tol::ulps(DType::F32, 16.0),
        );
        assert_eq!(
            metric(&e, "recompiles"),
            expect_recompiles,
            "after size {n}"
        );
    }
    assert_eq!(m(&e).compilations, 3.0, "one compilation per distinct size");
    let metrics = e.metrics();
    let reason = metrics.recompile_reasons.last().unwrap();
    assert!(reason.region.starts_with("region of 16 ops"), "{reason:?}");
    // The earliest op that differs is named first; every op's input and output changed.
    let first = &reason.changes[0];
    assert_eq!(first.op_index, Some(0), "{reason:?}");
    assert_eq!(first.what, "input 0 (self) dim 0");
    assert_eq!((first.old.as_str(), first.new.as_str()), ("9", "16"));
    assert_eq!(reason.total_changes, 32, "{reason:?}");
    let text = metrics.last_recompile_reason.unwrap();
    assert!(
        text.contains("defer_and_fuse mode of region of 16 ops")
            && text.contains("changed 9 -> 16"),
        "{text}"
    );
}

#[test]
fn dead_ops_are_dropped_and_a_read_runs_everything_pending() {
    let e = engine(Mode::DeferAndFuse);
    let x = upload_f32(&e, &[1.0, 2.0], &[2]);
    let y = upload_f32(&e, &[3.0, 4.0], &[2]);
    e.reset_metrics();
    let old = op(&e, typed::Mul, &[&y, &y], &[]); // unrelated, captured first
    let dead = op(&e, typed::Exp, &[&x], &[]);
    release(&e, dead);
    let wanted = op(&e, typed::Add, &[&x, &x], &[]);
    let younger = op(&e, typed::Sub, &[&y, &x], &[]);
    assert_eq!(read_f32(&e, &wanted), vec![2.0, 4.0]);
    assert_eq!(metric(&e, "dropped_ops"), 1.0);
    // A read runs every pending op, older and younger (RFC 0012): the step a loss is read from
    // runs whole, in one region.
    assert_eq!(
        metric(&e, "region_ops"),
        3.0,
        "older, requested and younger ops ran"
    );
    assert_eq!(m(&e).pending, 0.0);
    assert_eq!(read_f32(&e, &old), vec![9.0, 16.0]);
    assert_eq!(read_f32(&e, &younger), vec![2.0, 2.0]);
    assert_eq!(
        m(&e).regions,
        1.0,
        "every value was materialized by the first read"
    );
}

#[test]
fn writes_and_in_place_ops_keep_capture_semantics() {
    for mode in [Mode::Strict, Mode::DeferAndFuse] {
        let e = engine(mode);
        let x = upload_f32(&e, &[1.0, 2.0], &[2]);
        let before = op(&e, typed::Mul, &[&x], &[f(10.0)]);
        // x.add_(1) three times, in place (outs = x).
        for _ in 0..3 {
            let captured = e
                .op(
                    OpId::Add,
                    std::slice::from_ref(&x),
                    &[f(1.0)],
                    &[],
                    std::slice::from_ref(&x),
                )
                .expect("in-place add");
            assert_eq!(captured.outputs[0].0, x.storage, "written into x's storage");
        }
        let after = op(&e, typed::Mul, &[&x], &[f(10.0)]);
        // A host write replaces x; ops captured before it keep the old value.
        let bytes: Vec<u8> = [100f32, 200.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        e.write_host(&x, &bytes).unwrap();
        assert_eq!(read_f32(&e, &before), vec![10.0, 20.0], "{mode:?}");
        assert_eq!(read_f32(&e, &after), vec![40.0, 50.0], "{mode:?}");
        assert_eq!(read_f32(&e, &x), vec![100.0, 200.0], "{mode:?}");
    }
}

#[test]
fn out_of_a_lower_category_dtype_is_refused() {
    // torch.add(a_float, b_float, out=long_tensor) raises "result type Float can't be cast to the
    // desired output type Long".
    let e = engine(Mode::DeferAndFuse);
    let a = upload_f32(&e, &[1.5, 2.5], &[2]);
    let out = upload_i64(&e, &[0, 0], &[2]);
    let err = e
        .op(
            OpId::Add,
            &[a.clone(), a.clone()],
            &[],
            &[],
            std::slice::from_ref(&out),
        )
        .expect_err("float result into a long out= tensor");
    assert!(
        err.message
            .contains("can't be cast to the desired output type Long"),
        "{}",
        err.message
    );
}

#[test]
fn accumulating_a_metric_on_the_device_keeps_the_pending_graph_bounded() {
    let e = engine(Mode::DeferAndFuse);
    let x = upload_f32(&e, &[0.5, -1.0, 2.0, 0.25], &[4]);
    let mut acc = upload_f32(&e, &[0.0], &[]);
    e.reset_metrics();
    let mut want = 0.0f64;
    let mut pending_seen = Vec::new();
    for step in 0..200 {
        let w = 1.0 + (step % 7) as f64 * 0.125;
        let y = op(&e, typed::Mul, &[&x], &[f(w)]);
        let sq = op(&e, typed::Mul, &[&y, &y], &[]);
        let loss = op(
            &e,
            typed::Mean.encode(layout::ReduceDtypeDims {
                keepdim: false,
                dtype: None,
                dims: &[],
            }),
            &[&sq],
            &[],
        );
        let next = op(&e, typed::Add, &[&acc, &loss], &[]);
        release(&e, std::mem::replace(&mut acc, next));
        let l = read(&e, &loss)[0]; // loss.item()
        let want_l: f64 = [0.5f64, -1.0, 2.0, 0.25]
            .iter()
            .map(|v| (v * w) * (v * w))
            .sum::<f64>()
            / 4.0;
        assert!(
            (l - want_l).abs() <= 1e-6 * want_l,
            "step {step}: {l} vs {want_l}"
        );
        want += l;
        for t in [y, sq, loss] {
            release(&e, t);
        }
        pending_seen.push(m(&e).pending);
    }
    let max_pending = pending_seen.iter().cloned().fold(0.0, f64::max);
    assert!(
        max_pending <= 2.0,
        "pending ops stay bounded, saw up to {max_pending}"
    );
    let s = m(&e);
    assert_eq!(s.regions, 200.0, "one region per loss.item()");
    assert!(
        s.compilations <= 2.0,
        "a steady state: {} compilations",
        s.compilations
    );
    let total = read(&e, &acc)[0];
    assert!(
        (total - want).abs() <= 1e-5 * want,
        "accumulated {total} vs {want}"
    );
}

#[test]
fn a_thousand_step_loop_compiles_a_fixed_number_of_regions() {
    // Reading every 10 steps: 100 regions of one shape.
    let e = engine(Mode::DeferAndFuse);
    let mut x = upload_f32(&e, &[1.0; 16], &[16]);
    e.reset_metrics();
    let mut want = 1.0f64;
    for step in 0..1000 {
        let s = 1.0 + (step % 5) as f64 * 1e-3;
        let a = op(&e, typed::Mul, &[&x], &[f(s)]);
        let b = op(&e, typed::Sub, &[&a], &[f(1e-3)]);
        release(&e, a);
        release(&e, std::mem::replace(&mut x, b));
        want = (want as f32 * s as f32 - 1e-3) as f64;
        if step % 10 == 9 {
            let v = read(&e, &x)[0];
            assert!(
                (v - want).abs() <= 1e-4 * want.abs().max(1.0),
                "step {step}: {v} vs {want}"
            );
        }
    }
    let s = m(&e);
    assert_eq!(s.regions, 100.0);
    assert!(
        s.compilations <= 2.0,
        "{} compilations for 100 regions",
        s.compilations
    );
    assert_eq!(s.deferred, 2000.0);

    // Never reading: the region-size cap flushes on its own, with a fixed set of shapes.
    let e = engine_with(Mode::DeferAndFuse, Some(64));
    let mut x = upload_f32(&e, &[1.0; 16], &[16]);
    e.reset_metrics();
    for step in 0..1000 {
        let a = op(&e, typed::Mul, &[&x], &[f(1.0 + (step % 3) as f64 * 1e-3)]);
        let b = op(&e, typed::Sub, &[&a], &[f(1e-3)]);
        release(&e, a);
        release(&e, std::mem::replace(&mut x, b));
        assert!(m(&e).pending < 64.0, "the cap bounds the pending graph");
    }
    let _ = read(&e, &x);
    let s = m(&e);
    assert_eq!(s.regions, 32.0, "2000 ops in regions of 64, then the rest");
    assert!(s.compilations <= 3.0, "{} compilations", s.compilations);
}

/// A two-layer MLP step in engine ops: forward, read the loss, backward, SGD update.
struct Mlp {
    x: TensorRef,
    target: TensorRef,
    w1: TensorRef,
    w2: TensorRef,
    running: TensorRef,
}

const BATCH: i64 = 8;
const IN: i64 = 4;
const HIDDEN: i64 = 16;
const CLASSES: i64 = 3;

fn mlp_data() -> (Vec<f64>, Vec<i64>, Vec<f64>, Vec<f64>) {
    let mut rng = Rng::new(33);
    let x = rng.values((BATCH * IN) as usize, -1.0, 1.0);
    let target: Vec<i64> = (0..BATCH)
        .map(|_| rng.below(CLASSES as u64) as i64)
        .collect();
    let w1 = rng.values((IN * HIDDEN) as usize, -0.5, 0.5);
    let w2 = rng.values((HIDDEN * CLASSES) as usize, -0.5, 0.5);
    (x, target, w1, w2)
}

impl Mlp {
    fn new(e: &Engine) -> Mlp {
        let (x, target, w1, w2) = mlp_data();
        Mlp {
            x: upload(e, DType::F32, &x, &[BATCH, IN]),
            target: upload_i64(e, &target, &[BATCH]),
            w1: upload(e, DType::F32, &w1, &[IN, HIDDEN]),
            w2: upload(e, DType::F32, &w2, &[HIDDEN, CLASSES]),
            running: upload_f32(e, &[0.0], &[]),
        }
    }

    /// One step; returns `loss.item()`.
    fn step(&mut self, e: &Engine, lr: f64) -> f64 {
        let t = |a: &TensorRef| {
            op(
                e,
                typed::Transpose.encode(layout::TransposeDims { dim0: 0, dim1: 1 }),
                &[a],
                &[],
            )
        };
        // forward
        let h = op(e, typed::Mm, &[&self.x, &self.w1], &[]);
        let a = op(e, typed::Relu, &[&h], &[]);
        let logits = op(e, typed::Mm, &[&a, &self.w2], &[]);
        let logp = op(
            e,
            typed::LogSoftmax.encode(layout::SoftmaxDim {
                dim: 1,
                half_to_float: false,
            }),
            &[&logits],
            &[],
        );
        let outs = op_all(
            e,
            typed::NllLoss.encode(layout::NllLossReduction {
                reduction: Reduction::Mean,
                ignore_index: -100,
            }),
            &[&logp, &self.target],
            &[],
        );
        let (loss, total_weight) = (outs[0].clone(), outs[1].clone());
        let running = op(e, typed::Add, &[&self.running, &loss], &[]);
        release(e, std::mem::replace(&mut self.running, running));
        let value = read(e, &loss)[0];
        // backward
        let one = op(
            e,
            typed::Ones.encode(layout::Creation {
                dtype: DType::F32,
                sizes: &[],
            }),
            &[],
            &[],
        );
        let g_logp = op(
            e,
            typed::NllLossBackward.encode(layout::NllLossReduction {
                reduction: Reduction::Mean,
                ignore_index: -100,
            }),
            &[&one, &logp, &self.target, &total_weight],
            &[],
        );
        let g_logits = op(
            e,
            typed::LogSoftmaxBackward.encode(layout::SoftmaxBackwardDim {
                dim: 1,
                input_dtype: DType::F32,
            }),
            &[&g_logp, &logp],
            &[],
        );
        let a_t = t(&a);
        let g_w2 = op(e, typed::Mm, &[&a_t, &g_logits], &[]);
        let w2_t = t(&self.w2);
        let g_a = op(e, typed::Mm, &[&g_logits, &w2_t], &[]);
        let g_h = op(e, typed::ThresholdBackward, &[&g_a, &h], &[f(0.0)]);
        let x_t = t(&self.x);
        let g_w1 = op(e, typed::Mm, &[&x_t, &g_h], &[]);
        // update: w -= lr * g (lr is a lifted scalar)
        let w1 = op(e, typed::Sub, &[&self.w1, &g_w1], &[f(lr)]);
        let w2 = op(e, typed::Sub, &[&self.w2, &g_w2], &[f(lr)]);
        release(e, std::mem::replace(&mut self.w1, w1));
        release(e, std::mem::replace(&mut self.w2, w2));
        for t in [
            h,
            a,
            logits,
            logp,
            loss,
            total_weight,
            one,
            g_logp,
            g_logits,
            a_t,
            g_w2,
            w2_t,
        ] {
            release(e, t);
        }
        for t in [g_a, g_h, x_t, g_w1] {
            release(e, t);
        }
        value
    }
}

/// The same training in f64; returns the loss of each step.
fn mlp_reference(steps: usize, lr: impl Fn(usize) -> f64) -> Vec<f64> {
    let (x, target, w1, w2) = mlp_data();
    let x = Ref::new(&[BATCH, IN], x);
    let mut w1 = Ref::new(&[IN, HIDDEN], w1);
    let mut w2 = Ref::new(&[HIDDEN, CLASSES], w2);
    let mut losses = Vec::new();
    for step in 0..steps {
        let h = x.matmul(&w1);
        let a = h.map(|v| v.max(0.0));
        let logits = a.matmul(&w2);
        let logp = logits.log_softmax(1);
        let (loss, _) = logp.nll_loss(&target, 1, -100);
        losses.push(loss.data[0]);
        let mut g_logits = logp.map(f64::exp);
        for (n, &t) in target.iter().enumerate() {
            g_logits.data[n * CLASSES as usize + t as usize] -= 1.0;
        }
        let g_logits = g_logits.map(|v| v / BATCH as f64);
        let g_w2 = a.transpose2().matmul(&g_logits);
        let g_a = g_logits.matmul(&w2.transpose2());
        let g_h = g_a.zip(&h, |g, hv| if hv > 0.0 { g } else { 0.0 });
        let g_w1 = x.transpose2().matmul(&g_h);
        let r = lr(step);
        w1 = w1.zip(&g_w1, |w, g| w - r * g);
        w2 = w2.zip(&g_w2, |w, g| w - r * g);
    }
    losses
}

#[test]
fn a_training_loop_reaches_one_cached_region_per_step() {
    const STEPS: usize = 12;
    let lr = |step: usize| 0.5 / (1.0 + step as f64 * 0.1); // a schedule: lr changes every step
    let want = mlp_reference(STEPS, lr);

    let strict = engine(Mode::Strict);
    let mut model = Mlp::new(&strict);
    let strict_losses: Vec<f64> = (0..STEPS).map(|s| model.step(&strict, lr(s))).collect();

    let e = engine(Mode::DeferAndFuse);
    let mut model = Mlp::new(&e);
    e.reset_metrics();
    let mut per_step = Vec::new();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let before = m(&e);
        losses.push(model.step(&e, lr(step)));
        let after = m(&e);
        per_step.push((
            after.regions - before.regions,
            after.compilations - before.compilations,
            after.cache_hits - before.cache_hits,
            after.pending,
        ));
    }
    let steady_pending = per_step[1].3;
    assert!(
        steady_pending <= 30.0,
        "backward and update of one step wait: {steady_pending}"
    );
    for (step, &(regions, compilations, hits, pending)) in per_step.iter().enumerate() {
        assert_eq!(regions, 1.0, "step {step}: one region per loss.item()");
        assert_eq!(
            pending, steady_pending,
            "step {step}: the pending graph does not grow"
        );
        if step >= 2 {
            assert_eq!(
                (compilations, hits),
                (0.0, 1.0),
                "step {step}: the steady state is cached"
            );
        }
    }
    assert!(
        m(&e).compilations <= 2.0,
        "{} compilations in all",
        m(&e).compilations
    );
    assert!(
        losses[STEPS - 1] < losses[0] * 0.9,
        "training makes progress: {losses:?}"
    );
    for step in 0..STEPS {
        let tol = 1e-5 * want[step].abs().max(1.0);
        assert!(
            (losses[step] - want[step]).abs() <= tol,
            "step {step}: {} vs f64 {}",
            losses[step],
            want[step]
        );
        let tol = 1e-5 * strict_losses[step].abs();
        assert!(
            (losses[step] - strict_losses[step]).abs() <= tol,
            "step {step}: DeferAndFuse {} vs Strict {}",
            losses[step],
            strict_losses[step]
        );
    }
    // The loss accumulated on the device without ever being read during the loop.
    let running = read(&e, &model.running)[0];
    let sum: f64 = losses.iter().sum();
    assert!(
        (running - sum).abs() <= 1e-5 * sum,
        "running {running} vs {sum}"
    );
}

#[test]
fn a_sync_with_only_dead_ops_compiles_and_runs_nothing() {
    let e = engine(Mode::DeferAndFuse);
    let x = upload_f32(&e, &[1.0, 2.0], &[2]);
    e.reset_metrics();
    let a = op(&e, typed::Exp, &[&x], &[]);
    let b = op(&e, typed::Neg, &[&a], &[]);
    release(&e, a);
    release(&e, b);
    e.sync().unwrap();
    let s = m(&e);
    assert_eq!(s.pending, 0.0, "dead ops are dropped");
    assert_eq!(metric(&e, "dropped_ops"), 2.0);
    assert_eq!(
        (s.compilations, s.executions),
        (0.0, 0.0),
        "an empty region is neither compiled nor run"
    );
}

#[test]
fn leaving_defer_and_fuse_runs_the_pending_ops_first() {
    let e = engine(Mode::DeferAndFuse);
    let x = upload_f32(&e, &[1.0, 2.0], &[2]);
    e.reset_metrics();
    let a = op(&e, typed::Mul, &[&x], &[f(3.0)]);
    let b = op(&e, typed::Add, &[&a], &[f(1.0)]);
    assert_eq!(m(&e).pending, 2.0);
    for mode in [Mode::Strict, Mode::Debug] {
        let c = with_mode(&e, mode, || op(&e, typed::Neg, &[&b], &[]));
        assert_eq!(
            m(&e).pending,
            0.0,
            "{mode:?} runs everything pending with its op"
        );
        assert_eq!(read_f32(&e, &c), vec![-4.0, -7.0]);
    }
    assert_eq!(
        m(&e).regions,
        2.0,
        "the pending ops fused with the first op-by-op op; then one op"
    );
    assert_eq!(metric(&e, "region_ops"), 4.0);
    assert_eq!(read_f32(&e, &a), vec![3.0, 6.0]);
}

/// `s = s * a + b` over 512×512 floats, `steps` times with no sync (the scalars change every
/// step, as a schedule would), then one read; the pending-op counts seen after each step.
fn unsynced_affine_loop(e: &Engine, steps: usize) -> (Vec<f64>, Vec<f64>) {
    let n = 512 * 512;
    let init: Vec<f32> = (0..n).map(|i| (i % 7) as f32 / 7.0).collect();
    let mut s = upload_f32(e, &init, &[512, 512]);
    let mut pending = Vec::new();
    for step in 0..steps {
        let a = 0.9 + (step % 3) as f64 * 0.01;
        let t = op(e, typed::Mul, &[&s], &[f(a)]);
        let next = op(e, typed::Add, &[&t], &[f(0.01)]);
        release(e, t);
        release(e, std::mem::replace(&mut s, next));
        pending.push(m(e).pending);
    }
    let values = read(e, &s);
    release(e, s);
    (values, pending)
}

#[test]
fn a_loop_without_syncs_is_cut_between_repetitions_into_one_program() {
    let e = engine(Mode::DeferAndFuse);
    e.reset_metrics();
    let steps = 200;
    let (values, pending) = unsynced_affine_loop(&e, steps);
    // Two ops of 2^18 elements a step: a block of 16 steps (32 ops, 2^23 elements). The loop
    // is found once two blocks are pending (both are cut); from then on each block is cut as
    // soon as it is captured, so the device runs one while the next is captured.
    let cuts = metric(&e, "repeat_cuts");
    assert_eq!(cuts, (steps / 16) as f64, "one cut per whole block");
    let found_at = 2 * 16 - 1;
    let before = pending[..found_at].iter().cloned().fold(0.0, f64::max);
    assert_eq!(before, 62.0, "nothing is cut before two blocks are seen");
    let after = pending[found_at..].iter().cloned().fold(0.0, f64::max);
    assert!(after <= 32.0, "then at most one block is pending: {after}");
    // Three programs: the cut that finds the loop (a block still pending reads what it
    // materializes), every later cut, and the read's remainder.
    assert!(
        metric(&e, "compilations") <= 3.0,
        "every later cut is alike: {} compilations",
        metric(&e, "compilations")
    );
    for (i, got) in values.iter().enumerate().step_by(9973) {
        let mut want = (i % 7) as f32 as f64 / 7.0;
        for step in 0..steps {
            want = want * (0.9 + (step % 3) as f64 * 0.01) + 0.01;
        }
        assert!((got - want).abs() <= 1e-5, "element {i}: {got} vs {want}");
    }
}

#[test]
fn a_loop_found_before_is_cut_at_its_first_repetition_after_a_sync() {
    let e = engine(Mode::DeferAndFuse);
    unsynced_affine_loop(&e, 40);
    e.reset_metrics();
    // The same loop again: its block is known, so it is cut as soon as one is captured.
    let (_, pending) = unsynced_affine_loop(&e, 48);
    assert_eq!(metric(&e, "repeat_cuts"), 3.0);
    let most = pending.iter().cloned().fold(0.0, f64::max);
    assert!(most <= 32.0, "at most one block pending: {most}");
    assert_eq!(
        metric(&e, "compilations"),
        0.0,
        "the loop's programs are cached"
    );
}

#[test]
fn loops_of_small_ops_are_not_cut() {
    // 16 floats a step: far less work than a region launch is worth, so the loop stays one
    // region until the read.
    let e = engine(Mode::DeferAndFuse);
    let mut x = upload_f32(&e, &[1.0; 16], &[16]);
    e.reset_metrics();
    for _ in 0..600 {
        let next = op(&e, typed::Add, &[&x], &[f(1.0)]);
        release(&e, std::mem::replace(&mut x, next));
    }
    assert_eq!(read(&e, &x), vec![601.0; 16]);
    assert_eq!(metric(&e, "repeat_cuts"), 0.0);
    assert_eq!(m(&e).regions, 1.0);
}

/// A two-layer MLP's forward and backward pass as the engine sees it (no optimizer), every
/// intermediate released as Python would; returns the two weight gradients, read.
fn mlp_gradients(e: &Engine) -> (Vec<f64>, Vec<f64>) {
    let fill = |n: usize, k: usize| -> Vec<f32> {
        (0..n).map(|i| ((i * k) % 17) as f32 / 17.0 - 0.5).collect()
    };
    // Batch, inputs, hidden: large enough that the cut saves more than a cut must (a MiB).
    const B: usize = 256;
    const I: usize = 1024;
    const H: usize = 1024;
    let x = upload_f32(e, &fill(B * I, 3), &[B as i64, I as i64]);
    let w1t = upload_f32(e, &fill(I * H, 5), &[I as i64, H as i64]);
    let w2 = upload_f32(e, &fill(10 * H, 7), &[10, H as i64]);
    let t = |a: &TensorRef| {
        op(
            e,
            typed::Transpose.encode(layout::TransposeDims { dim0: 0, dim1: 1 }),
            &[a],
            &[],
        )
    };
    let h = op(e, typed::Mm, &[&x, &w1t], &[]);
    let r = op(e, typed::Relu, &[&h], &[]);
    release(e, h);
    let w2t = t(&w2);
    let y = op(e, typed::Mm, &[&r, &w2t], &[]);
    release(e, w2t);
    let dy = op(e, typed::Mul, &[&y], &[f(2.0)]);
    release(e, y);
    let dyt = t(&dy);
    let gw2 = op(e, typed::Mm, &[&dyt, &r], &[]);
    release(e, dyt);
    let dr = op(e, typed::Mm, &[&dy, &w2], &[]);
    release(e, dy);
    let dh = op(e, typed::Mul, &[&dr, &r], &[]);
    release(e, dr);
    release(e, r);
    let dht = t(&dh);
    release(e, dh);
    let gw1 = op(e, typed::Mm, &[&dht, &x], &[]);
    release(e, dht);
    e.sync().expect("sync");
    let out = (read(e, &gw1), read(e, &gw2));
    for v in [x, w1t, w2, gw1, gw2] {
        release(e, v);
    }
    out
}

#[test]
fn a_late_large_result_runs_apart_from_the_scratch_before_it() {
    let engine_cutting = |cut: bool| {
        let mut config = torch_glue::EngineConfig::from_env().expect("config");
        config.default_mode = Mode::DeferAndFuse;
        config.compile.persistent_dir = None;
        config.compile.shared_dir = None;
        config.compile.dump_dir = None;
        config.memory_cuts = cut;
        Engine::new(config).expect("engine")
    };
    let whole = engine_cutting(false);
    let cut = engine_cutting(true);
    let mut peaks = Vec::new();
    let mut results = Vec::new();
    for e in [&whole, &cut] {
        let live = metric(e, "live_device_bytes");
        e.reset_metrics();
        results.push(mlp_gradients(e));
        peaks.push(metric(e, "peak_device_bytes") - live);
    }
    // One region allocates the first layer's weight gradient (4 MiB) while the hidden
    // activation and its gradients (1 MiB each) are live; cut before its product, the first region ends
    // with the hidden gradient and the second holds only it and the two weight gradients.
    assert_eq!(metric(&whole, "memory_cuts"), 0.0);
    assert_eq!(metric(&whole, "regions"), 1.0);
    assert_eq!(metric(&cut, "memory_cuts"), 1.0);
    assert_eq!(metric(&cut, "regions"), 2.0);
    assert!(
        peaks[1] < peaks[0],
        "peaks without and with the cut: {peaks:?}"
    );
    assert_eq!(
        results[0], results[1],
        "a cut changes where values live, not what they are"
    );
    // The plan is remembered: the same program again plans nothing and cuts the same way.
    cut.reset_metrics();
    assert_eq!(mlp_gradients(&cut), results[1]);
    assert_eq!(metric(&cut, "memory_cuts"), 1.0);
    assert_eq!(metric(&cut, "compilations"), 0.0);
}

#[test]
fn a_compiled_graph_is_one_region_past_the_cap_between_launched_boundaries() {
    // Strict around the graph, a cap of 64 ops: the graph's 300 ops still run as one region,
    // and what was pending before it (nothing in Strict) never joins it.
    let e = engine_with(Mode::Strict, Some(64));
    let x = upload_f32(&e, &[1.0; 16], &[16]);
    e.reset_metrics();
    for call in 0..3 {
        e.graph_begin().expect("graph_begin");
        assert_eq!(e.modes().current(), Mode::DeferAndFuse);
        let mut y = op(&e, typed::Mul, &[&x], &[f(1.0)]);
        for _ in 0..299 {
            let next = op(&e, typed::Add, &[&y], &[f(1.0)]);
            release(&e, std::mem::replace(&mut y, next));
        }
        assert_eq!(
            m(&e).pending,
            300.0,
            "call {call}: nothing cut inside the graph"
        );
        e.graph_end().expect("graph_end");
        assert_eq!(e.modes().current(), Mode::Strict);
        assert_eq!(m(&e).pending, 0.0, "graph_end launches the region");
        assert_eq!(read_f32(&e, &y), vec![300.0; 16]);
    }
    let s = m(&e);
    assert_eq!(s.regions, 3.0);
    assert_eq!(s.compilations, 1.0, "one program for the three calls");

    // DeferAndFuse around it: pending work is launched at graph_begin, on its own.
    let e = engine_with(Mode::DeferAndFuse, None);
    let x = upload_f32(&e, &[2.0; 4], &[4]);
    let before = op(&e, typed::Mul, &[&x], &[f(3.0)]);
    e.reset_metrics();
    e.graph_begin().expect("graph_begin");
    assert_eq!(m(&e).regions, 1.0, "the outside op ran before the graph");
    let inside = op(&e, typed::Add, &[&before], &[f(1.0)]);
    e.graph_end().expect("graph_end");
    assert_eq!(read_f32(&e, &inside), vec![7.0; 4]);
    assert_eq!(m(&e).regions, 2.0);

    // An unmatched end is an error that leaves the mode alone.
    let err = e.graph_end().expect_err("no open graph");
    assert!(err.message.contains("graph_begin"), "{}", err.message);
    assert_eq!(e.modes().current(), Mode::DeferAndFuse);
}

#[test]
fn a_recorded_graph_replays_on_new_storages_without_capturing() {
    let e = engine_with(Mode::Strict, None);
    let w = upload_f32(&e, &[2.0; 4], &[4]);
    let acc = upload_f32(&e, &[0.0; 4], &[4]);
    // The graph: z = x * w + 1 (a fresh output), and acc += x in place (an input it writes).
    let x = upload_f32(&e, &[1.0, 2.0, 3.0, 4.0], &[4]);
    e.graph_begin().expect("graph_begin");
    let y = op(&e, typed::Mul, &[&x, &w], &[]);
    let z = op(&e, typed::Add, &[&y], &[f(1.0)]);
    release(&e, y);
    e.op(
        OpId::Add,
        &[acc.clone(), x.clone()],
        &[f(1.0)],
        &[],
        std::slice::from_ref(&acc),
    )
    .expect("acc += x");
    let handle = e
        .graph_end_record(&[x.storage, w.storage, acc.storage], &[z.storage])
        .expect("record");
    assert!(
        handle > 0,
        "one region over the graph's storages is recordable"
    );
    assert_eq!(read_f32(&e, &z), vec![3.0, 5.0, 7.0, 9.0]);
    assert_eq!(e.modes().current(), Mode::Strict);

    e.reset_metrics();
    for round in 1..=3 {
        let x = upload_f32(&e, &[10.0, 20.0, 30.0, 40.0], &[4]);
        let out = TensorRef::contiguous(e.new_storage(16), DType::F32, &[4]);
        let ran = e
            .graph_replay(handle, &[x.storage, w.storage, acc.storage], &[out.storage])
            .expect("replay");
        assert!(ran);
        assert_eq!(read_f32(&e, &out), vec![21.0, 41.0, 61.0, 81.0]);
        let r = round as f32;
        assert_eq!(
            read_f32(&e, &acc),
            vec![
                1.0 + 10.0 * r,
                2.0 + 20.0 * r,
                3.0 + 30.0 * r,
                4.0 + 40.0 * r
            ]
        );
    }
    let s = e.metrics();
    assert_eq!(s.values["graph_replays"], 3.0);
    assert_eq!(s.values["compilations"], 0.0);
    assert_eq!(
        s.values["regions"], 0.0,
        "nothing captured, nothing planned"
    );

    // An input of another type is not replayed: the caller runs the graph's ops instead.
    let longer = upload_f32(&e, &[1.0; 8], &[8]);
    let out = TensorRef::contiguous(e.new_storage(16), DType::F32, &[4]);
    let ran = e
        .graph_replay(
            handle,
            &[longer.storage, w.storage, acc.storage],
            &[out.storage],
        )
        .expect("replay");
    assert!(!ran);
    // Wrong arity and unknown handles are errors that name the program.
    let err = e
        .graph_replay(handle, &[x.storage], &[out.storage])
        .expect_err("arity");
    assert!(
        err.message.contains("recorded with 3 inputs"),
        "{}",
        err.message
    );
    let err = e
        .graph_replay(handle + 100, &[], &[])
        .expect_err("unknown handle");
    assert!(
        err.message.contains("no recorded program"),
        "{}",
        err.message
    );
}

#[test]
fn a_graph_that_reads_a_value_outside_its_inputs_is_not_recorded() {
    let e = engine_with(Mode::Strict, None);
    let hidden = upload_f32(&e, &[5.0; 4], &[4]);
    let x = upload_f32(&e, &[1.0; 4], &[4]);
    e.graph_begin().expect("graph_begin");
    let z = op(&e, typed::Mul, &[&x, &hidden], &[]);
    // `hidden` is not named as an input: a replay could not find its value.
    let handle = e
        .graph_end_record(&[x.storage], &[z.storage])
        .expect("record");
    assert_eq!(handle, 0);
    assert_eq!(read_f32(&e, &z), vec![5.0; 4], "the graph still ran");
}

#[test]
fn a_graph_that_read_an_unwritten_input_is_not_recorded() {
    let e = engine_with(Mode::Strict, None);
    let x = upload_f32(&e, &[1.0; 4], &[4]);
    let unwritten = TensorRef::contiguous(e.new_storage(16), DType::F32, &[4]);
    e.graph_begin().expect("graph_begin");
    let z = op(&e, typed::Add, &[&x, &unwritten], &[f(1.0)]);
    // The unwritten input read as zeros inside the region: a replay could not follow it.
    let handle = e
        .graph_end_record(&[x.storage, unwritten.storage], &[z.storage])
        .expect("record");
    assert_eq!(handle, 0);
    assert_eq!(read_f32(&e, &z), vec![1.0; 4]);
}

#[test]
fn a_recorded_graph_computes_the_pending_ops_that_make_its_inputs() {
    let e = engine_with(Mode::DeferAndFuse, None);
    let x = upload_f32(&e, &[1.0, 2.0, 3.0, 4.0], &[4]);
    let seed = |value: f64| {
        op(
            &e,
            typed::Full.encode(layout::Creation {
                dtype: DType::F32,
                sizes: &[4],
            }),
            &[],
            &[f(value)],
        )
    };
    // A fill pending when the graph opens, held by one of its inputs: its prologue.
    let s = seed(2.0);
    e.graph_begin_record(&[x.storage, s.storage])
        .expect("graph_begin_record");
    let z = op(&e, typed::Mul, &[&x, &s], &[]);
    let handle = e
        .graph_end_record(&[x.storage, s.storage], &[z.storage])
        .expect("record");
    assert!(handle > 0, "the fill and the graph are one region");
    assert_eq!(read_f32(&e, &z), vec![2.0, 4.0, 6.0, 8.0]);
    release(&e, s);

    e.reset_metrics();
    for round in 1..=3 {
        // The same fill with another value, pending again: the replay computes it.
        let value = 1.0 + round as f64;
        let s = seed(value);
        let out = TensorRef::contiguous(e.new_storage(16), DType::F32, &[4]);
        let ran = e
            .graph_replay(handle, &[x.storage, s.storage], &[out.storage])
            .expect("replay");
        assert!(ran);
        let v = value as f32;
        assert_eq!(read_f32(&e, &out), vec![v, 2.0 * v, 3.0 * v, 4.0 * v]);
        assert_eq!(
            read_f32(&e, &s),
            vec![v; 4],
            "the seed's storage holds its value"
        );
        release(&e, s);
        release(&e, out);
    }
    let s = e.metrics();
    assert_eq!(s.values["graph_replays"], 3.0);
    assert_eq!(
        s.values["executions"], 3.0,
        "one program a round, the fill in it"
    );
    assert_eq!(s.values["regions"], 0.0, "the fills were never launched");
    assert_eq!(s.values["compilations"], 0.0);

    // A seed that is no pending fill (an upload) does not replay: the graph's ops run instead.
    let uploaded = upload_f32(&e, &[5.0; 4], &[4]);
    let out = TensorRef::contiguous(e.new_storage(16), DType::F32, &[4]);
    let ran = e
        .graph_replay(handle, &[x.storage, uploaded.storage], &[out.storage])
        .expect("replay");
    assert!(!ran);
}
