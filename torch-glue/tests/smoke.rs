//! First end-to-end check: an add in each mode.
mod common;
use common::*;
use defer::Mode;
use ops::OpId;

#[test]
fn add_in_every_mode() {
    for mode in [Mode::Strict, Mode::Debug, Mode::DeferAndFuse] {
        let e = engine(mode);
        let a = upload_f32(&e, &[1., 2., 3.], &[3]);
        let b = upload_f32(&e, &[10., 20., 30.], &[3]);
        let c = op(&e, typed::Add, &[&a, &b], &[]);
        let d = op(&e, typed::Mul, &[&c, &a], &[]);
        assert_eq!(read_f32(&e, &d), vec![11., 44., 99.], "{mode:?}");
        println!("{mode:?}: {}", e.metrics().report());
    }
}

#[test]
fn assert_async_is_kept_and_checked_at_materialization() {
    use ops::ScalarArg;
    for mode in [Mode::Strict, Mode::Debug, Mode::DeferAndFuse] {
        let e = engine(mode);
        let x = upload_f32(&e, &[1., 2., 3.], &[3]);
        let total = op(&e, sum_all(), &[&x], &[]);
        // Passes: the sum is nonzero. Nothing reads the verdict, yet it runs.
        e.op(
            OpId::AssertAsync,
            std::slice::from_ref(&total),
            &[],
            &[],
            &[],
        )
        .unwrap();
        let y = op(&e, typed::Mul, &[&x], &[ScalarArg::float(2.0)]);
        assert_eq!(read_f32(&e, &y), vec![2., 4., 6.], "{mode:?}");
        // Fails: x - x sums to zero. The error surfaces at the op in Debug, else at the next
        // materialization, naming the op; the engine stays usable afterwards.
        let zero = op(&e, typed::Sub, &[&x, &x], &[]);
        let zero_sum = op(&e, sum_all(), &[&zero], &[]);
        let at_op = e.op(
            OpId::AssertAsync,
            std::slice::from_ref(&zero_sum),
            &[],
            &[],
            &[],
        );
        let err = match (mode, at_op) {
            (Mode::Debug, Err(err)) => err,
            (Mode::Debug, Ok(_)) => panic!("Debug must raise at the op"),
            (_, Ok(_)) => e.sync().unwrap_err(),
            (_, Err(err)) => panic!("{mode:?} raised at capture: {err:?}"),
        };
        assert!(
            err.message.contains("_assert_async") && err.message.contains("got zero"),
            "{}",
            err.message
        );
        assert_eq!(read_f32(&e, &y), vec![2., 4., 6.], "{mode:?} after error");
        if mode == Mode::DeferAndFuse {
            assert_eq!(metric(&e, "dropped_ops"), 0.0);
        }
    }
}

#[test]
fn dead_inputs_of_in_place_updates_are_donated() {
    use ops::ScalarArg;
    for mode in [Mode::Strict, Mode::DeferAndFuse] {
        let mut config = torch_glue::EngineConfig::from_env().unwrap();
        config.default_mode = mode;
        config.donate = true;
        let e = torch_glue::Engine::new(config).unwrap();
        let w = upload_f32(&e, &[10.; 256], &[256]);
        let g = upload_f32(&e, &[1.; 256], &[256]);
        for step in 0..5 {
            // w.sub_(g, alpha=lr): the old value of w is dead once the update is planned.
            e.op(
                OpId::Sub,
                &[w.clone(), g.clone()],
                &[ScalarArg::float(0.5)],
                &[],
                std::slice::from_ref(&w),
            )
            .unwrap();
            let expected = 10.0 - 0.5 * (step + 1) as f32;
            assert_eq!(
                read_f32(&e, &w),
                vec![expected; 256],
                "{mode:?} step {step}"
            );
        }
        // g is still held by its storage: never donated; w's old values are.
        assert!(
            metric(&e, "donated_buffers") >= 3.0,
            "{mode:?}: {}",
            e.metrics().report()
        );
        assert_eq!(read_f32(&e, &g), vec![1.; 256]);
    }
}

/// An engine whose compiles carry `TORCH_PJRT_COMPILE_OPTIONS`-style overrides.
fn engine_with_compile_options(text: &str) -> torch_glue::Engine {
    let mut config = torch_glue::EngineConfig::from_env().expect("config");
    config.default_mode = Mode::Strict;
    config.compile.persistent_dir = None;
    config.compile.shared_dir = None;
    config.compile.dump_dir = None;
    config.compile.compile_options.overrides =
        torch_glue::engine::parse_compile_options(text).expect("options");
    torch_glue::Engine::new(config).expect("engine")
}

#[test]
fn compile_options_reach_xla_and_name_a_bad_option() {
    let e = engine_with_compile_options("xla_cpu_enable_fast_math=false");
    let a = upload_f32(&e, &[1., 2., 3.], &[3]);
    let c = op(&e, typed::Add, &[&a, &a], &[]);
    assert_eq!(read_f32(&e, &c), vec![2., 4., 6.]);

    let e = engine_with_compile_options("xla_no_such_option=true");
    let a = upload_f32(&e, &[1., 2., 3.], &[3]);
    let c = op(&e, typed::Add, &[&a, &a], &[]);
    let mut bytes = [0u8; 12];
    let err = e
        .read_host(&c, &mut bytes)
        .expect_err("the compile is refused");
    assert!(
        err.message.contains("xla_no_such_option"),
        "{}",
        err.message
    );
}
