//! The ordered execution queue: order, values flowing between jobs, error propagation with
//! labels, flush, asynchrony behind a slow compile, donation and device completion.

mod common;

use common::*;
use compile::{CacheKey, CompileError, CompileHandle, DeviceValue, ExecError, ExecJob, ExecQueue};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn ready_executable(factor: f32) -> CompileHandle {
    let executable = client().compile(&module(factor)).unwrap();
    CompileHandle::ready(
        CacheKey::new(factor.to_bits() as u64, 0, 0),
        Arc::new(executable),
    )
}

fn value(values: &[f32]) -> DeviceValue {
    DeviceValue::ready(f32_buffer(values))
}

#[test]
fn outputs_feed_later_jobs_in_order() {
    let queue = ExecQueue::new().unwrap();
    let times_two = ready_executable(2.0);
    let a = value(&[1., 2., 3., 4.]);
    let b = value(&[0., 0., 0., 0.]);
    let order = Arc::new(Mutex::new(Vec::new()));

    let first = DeviceValue::pending();
    queue.enqueue(ExecJob::new(
        "first",
        times_two.clone(),
        vec![a.clone(), b.clone()],
        vec![first.clone()],
    ));
    let seen = order.clone();
    queue.enqueue_fn("note 1", vec![], move || {
        seen.lock().push(1);
        Ok(vec![])
    });
    let second = DeviceValue::pending();
    queue.enqueue(ExecJob::new(
        "second",
        times_two,
        vec![first.clone(), a],
        vec![second.clone()],
    ));
    let seen = order.clone();
    let read_back = second.clone();
    queue.enqueue_fn("read second", vec![], move || {
        // Earlier jobs have run: the value exists.
        assert!(read_back.is_resolved());
        seen.lock().push(2);
        Ok(vec![])
    });
    // (a + b) * 2 = [2,4,6,8]; (that + a) * 2 = [6,12,18,24].
    assert_eq!(
        f32_values(&second.wait_ready().unwrap()),
        vec![6., 12., 18., 24.]
    );
    queue.flush();
    assert_eq!(*order.lock(), vec![1, 2]);
    let stats = queue.stats();
    assert_eq!((stats.executions, stats.tasks, stats.pending), (2, 2, 0));
}

#[test]
fn errors_propagate_to_dependents_with_labels() {
    let queue = ExecQueue::new().unwrap();
    let broken = CompileHandle::failed(
        CacheKey::new(1, 2, 3),
        CompileError::Compile {
            key: CacheKey::new(1, 2, 3),
            message: "error: 'stablehlo.bogus_op' is unknown".into(),
        },
    );
    let x = value(&[1., 1., 1., 1.]);
    let bad = DeviceValue::pending();
    queue.enqueue(ExecJob::new(
        "region of 2 ops: bogus, add",
        broken,
        vec![x.clone(), x.clone()],
        vec![bad.clone()],
    ));
    let dependent = DeviceValue::pending();
    queue.enqueue(ExecJob::new(
        "mul",
        ready_executable(3.0),
        vec![x.clone(), bad.clone()],
        vec![dependent.clone()],
    ));
    let grandchild = DeviceValue::pending();
    queue.enqueue(ExecJob::new(
        "sub",
        ready_executable(4.0),
        vec![dependent.clone(), x.clone()],
        vec![grandchild.clone()],
    ));
    let independent = DeviceValue::pending();
    queue.enqueue(ExecJob::new(
        "add",
        ready_executable(5.0),
        vec![x.clone(), x],
        vec![independent.clone()],
    ));

    let error = bad.wait().unwrap_err();
    assert_eq!(error.label(), Some("region of 2 ops: bogus, add"));
    assert!(error.to_string().contains("bogus_op"), "{error}");

    let error = dependent.wait().unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, ExecError::Argument { index: 1, .. }),
        "{message}"
    );
    assert!(message.starts_with("mul:"), "{message}");
    assert!(message.contains("region of 2 ops: bogus, add"), "{message}");
    assert!(message.contains("bogus_op"), "{message}");

    // The chain does not nest: the grandchild names itself and the first failure only.
    let error = grandchild.wait().unwrap_err();
    assert_eq!(
        error.root_cause().label(),
        Some("region of 2 ops: bogus, add")
    );
    assert!(!error.to_string().contains("mul:"), "{error}");

    assert_eq!(f32_values(&independent.wait_ready().unwrap()), vec![10.; 4]);
    assert_eq!(queue.stats().failed, 3);
}

#[test]
fn task_failures_panics_and_wrong_output_counts_are_errors() {
    let queue = ExecQueue::new().unwrap();
    let failed = DeviceValue::pending();
    queue.enqueue_fn("to_device", vec![failed.clone()], || {
        Err("out of host memory".into())
    });
    let panicked = DeviceValue::pending();
    queue.enqueue_fn("to_host", vec![panicked.clone()], || panic!("reader bug"));
    let (one, two) = (DeviceValue::pending(), DeviceValue::pending());
    queue.enqueue(ExecJob::new(
        "add",
        ready_executable(1.0),
        vec![value(&[0.; 4]), value(&[0.; 4])],
        vec![one.clone(), two.clone()],
    ));
    let uploaded = DeviceValue::pending();
    queue.enqueue_fn("upload", vec![uploaded.clone()], || {
        Ok(vec![Arc::new(f32_buffer(&[7.; 4]))])
    });

    let error = failed.wait().unwrap_err();
    assert_eq!(error.to_string(), "to_device: out of host memory");
    let error = panicked.wait().unwrap_err();
    assert!(error.to_string().contains("reader bug"), "{error}");
    let error = two.wait().unwrap_err();
    assert!(
        matches!(
            error,
            ExecError::OutputCount {
                expected: 2,
                got: 1,
                ..
            }
        ),
        "{error}"
    );
    assert!(one.wait().is_err());
    // The worker survived all of it.
    assert_eq!(f32_values(&uploaded.wait().unwrap()), vec![7.; 4]);
}

#[test]
fn enqueue_returns_before_a_slow_compile_finishes() {
    let compiler = compiler(config());
    let queue = ExecQueue::new().unwrap();
    let handle = compiler.request(key(&compiler, 1), || {
        std::thread::sleep(Duration::from_millis(600));
        Ok(module(2.0))
    });
    let out = DeviceValue::pending();
    let start = Instant::now();
    queue.enqueue(ExecJob::new(
        "slow",
        handle,
        vec![value(&[1.; 4]), value(&[1.; 4])],
        vec![out.clone()],
    ));
    let after = DeviceValue::pending();
    queue.enqueue_fn("after", vec![after.clone()], || {
        Ok(vec![Arc::new(f32_buffer(&[0.; 4]))])
    });
    let enqueue_time = start.elapsed();
    assert!(
        enqueue_time < Duration::from_millis(200),
        "{enqueue_time:?}"
    );
    assert!(!out.is_resolved() && !after.is_resolved());
    assert_eq!(queue.stats().pending, 2);
    assert_eq!(f32_values(&out.wait().unwrap()), vec![4.; 4]);
    assert!(start.elapsed() >= Duration::from_millis(550));
    after.wait().unwrap();
}

#[test]
fn flush_waits_for_everything_enqueued() {
    let queue = Arc::new(ExecQueue::new().unwrap());
    let done = Arc::new(Mutex::new(0));
    for _ in 0..3 {
        let done = done.clone();
        queue.enqueue_fn("sleep", vec![], move || {
            std::thread::sleep(Duration::from_millis(30));
            *done.lock() += 1;
            Ok(vec![])
        });
    }
    // A flush from inside the queue returns instead of waiting for itself.
    let inner = queue.clone();
    queue.enqueue_fn("nested flush", vec![], move || {
        inner.flush();
        Ok(vec![])
    });
    queue.flush();
    assert_eq!(*done.lock(), 3);
    assert_eq!(queue.stats().pending, 0);
}

#[test]
fn donated_arguments_and_device_completion() {
    let queue = ExecQueue::new().unwrap();
    let out = DeviceValue::pending();
    queue.enqueue(
        ExecJob::new(
            "add_",
            ready_executable(1.0),
            vec![value(&[1.; 4]), value(&[2.; 4])],
            vec![out.clone()],
        )
        .donate([0]),
    );
    queue.synchronize(std::slice::from_ref(&out)).unwrap();
    assert_eq!(f32_values(&out.try_get().unwrap().unwrap()), vec![3.; 4]);
    compile::wait_all_ready(&[out, value(&[0.; 4])]).unwrap();
}

#[test]
fn an_aliased_argument_held_elsewhere_is_copied_not_consumed() {
    let module = "func.func public @main(%a: tensor<4xf32> {tf.aliasing_output = 0 : i32}, \
                  %b: tensor<4xf32>) -> tensor<4xf32> {\n  %s = stablehlo.add %a, %b : \
                  tensor<4xf32>\n  return %s : tensor<4xf32>\n}";
    let executable = Arc::new(client().compile(module).unwrap());
    let add_ = || CompileHandle::ready(CacheKey::new(7, 0, 0), executable.clone());
    let queue = ExecQueue::new().unwrap();

    // Held by the caller too (a read in flight): the execution must leave it intact.
    let held = value(&[1.; 4]);
    let out = DeviceValue::pending();
    let job = ExecJob::new(
        "add_",
        add_(),
        vec![held.clone(), value(&[2.; 4])],
        vec![out.clone()],
    );
    queue.enqueue(job.donate([0]));
    queue.synchronize(std::slice::from_ref(&out)).unwrap();
    assert_eq!(f32_values(&out.try_get().unwrap().unwrap()), vec![3.; 4]);
    let held_buffer = held.wait().unwrap();
    assert!(!held_buffer.is_deleted().unwrap());
    assert_eq!(f32_values(&held_buffer), vec![1.; 4]);

    // Held by the job alone: consumed.
    let alone = value(&[5.; 4]);
    let buffer = alone.wait().unwrap();
    let out = DeviceValue::pending();
    queue.enqueue(
        ExecJob::new(
            "add_",
            add_(),
            vec![alone, value(&[1.; 4])],
            vec![out.clone()],
        )
        .donate([0]),
    );
    queue.synchronize(std::slice::from_ref(&out)).unwrap();
    assert!(
        buffer.is_deleted().unwrap(),
        "the only holder's buffer was donated"
    );
    assert_eq!(f32_values(&out.try_get().unwrap().unwrap()), vec![6.; 4]);
}

#[test]
fn a_queued_job_does_not_keep_its_results_alive() {
    let queue = ExecQueue::new().unwrap();
    let gate = Arc::new(Mutex::new(()));
    let closed = gate.lock();
    let waiting = gate.clone();
    queue.enqueue_fn("gate", vec![], move || {
        drop(waiting.lock());
        Ok(vec![])
    });
    let out = DeviceValue::pending();
    queue.enqueue(ExecJob::new(
        "add",
        ready_executable(1.0),
        vec![value(&[1.; 4]), value(&[2.; 4])],
        vec![out.clone()],
    ));
    assert!(out.is_unique(), "the queued job holds its result weakly");
    drop(out);
    drop(closed);
    queue.flush();
    assert_eq!(queue.stats().executions, 1, "the job still ran");
    // Work whose results nobody holds is still waited for.
    queue.wait_launched().unwrap();
}

#[test]
fn dropping_the_queue_runs_what_was_enqueued() {
    let out = DeviceValue::pending();
    {
        let queue = ExecQueue::new().unwrap();
        queue.enqueue_fn("late", vec![out.clone()], || {
            std::thread::sleep(Duration::from_millis(20));
            Ok(vec![Arc::new(f32_buffer(&[1.; 4]))])
        });
    }
    assert!(out.is_resolved());
    assert!(out.wait().is_ok());
}

#[test]
fn a_waiting_caller_runs_queued_executions_itself() {
    let queue = ExecQueue::new().unwrap();
    let times_two = ready_executable(2.0);
    let a = value(&[1., 2., 3., 4.]);
    let zeros = value(&[0., 0., 0., 0.]);
    // Let the new worker reach its first sleep: an awake worker may take work a hold covers.
    std::thread::sleep(Duration::from_millis(20));
    for _ in 0..20 {
        let first = DeviceValue::pending();
        let second = DeviceValue::pending();
        let hold = queue.hold_worker();
        queue.enqueue(ExecJob::new(
            "first",
            times_two.clone(),
            vec![a.clone(), zeros.clone()],
            vec![first.clone()],
        ));
        queue.enqueue(ExecJob::new(
            "second",
            times_two.clone(),
            vec![first.clone(), zeros.clone()],
            vec![second.clone()],
        ));
        // The held worker was not woken: the caller runs both, in order, before returning.
        assert!(queue.run_here());
        assert!(first.is_resolved() && second.is_resolved());
        drop(hold);
        assert_eq!(
            f32_values(&second.wait_ready().unwrap()),
            vec![4., 8., 12., 16.]
        );
    }
    let stats = queue.stats();
    assert_eq!(
        (stats.executions, stats.caller_launches, stats.pending),
        (40, 40, 0)
    );

    // Without a hold the worker is woken and may take the work first; either way it runs
    // once, in order.
    let out = DeviceValue::pending();
    queue.enqueue(ExecJob::new(
        "unheld",
        times_two.clone(),
        vec![a.clone(), zeros.clone()],
        vec![out.clone()],
    ));
    queue.run_here();
    assert_eq!(f32_values(&out.wait_ready().unwrap()), vec![2., 4., 6., 8.]);

    // Work left queued when a hold ends wakes the worker.
    let out = DeviceValue::pending();
    let hold = queue.hold_worker();
    queue.enqueue(ExecJob::new(
        "left to the worker",
        times_two,
        vec![a, zeros],
        vec![out.clone()],
    ));
    drop(hold);
    assert_eq!(f32_values(&out.wait_ready().unwrap()), vec![2., 4., 6., 8.]);
    queue.flush();
    assert_eq!(queue.stats().pending, 0);
}

/// Queues a closure that holds the worker until the returned sender sends; returns once the
/// worker is inside it.
fn block_worker(queue: &ExecQueue) -> std::sync::mpsc::Sender<()> {
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let (started, worker_started) = std::sync::mpsc::channel::<()>();
    queue.enqueue_fn("gate", vec![], move || {
        let _ = started.send(());
        let _ = gate.recv();
        Ok(vec![])
    });
    worker_started.recv().unwrap();
    release
}

#[test]
fn a_caller_leaves_work_to_a_busy_worker_or_behind_a_closure() {
    let queue = ExecQueue::new().unwrap();
    let times_two = ready_executable(2.0);
    let release = block_worker(&queue);
    let out = DeviceValue::pending();
    queue.enqueue(ExecJob::new(
        "after the gate",
        times_two.clone(),
        vec![value(&[1., 1., 1., 1.]), value(&[0., 0., 0., 0.])],
        vec![out.clone()],
    ));
    // The worker is inside the closure: the job must wait for it, not run beside it.
    assert!(!queue.run_here());
    assert!(!out.is_resolved());
    release.send(()).unwrap();
    assert_eq!(f32_values(&out.wait_ready().unwrap()), vec![2., 2., 2., 2.]);

    // A queued closure keeps the batch on the worker's thread.
    queue.flush();
    let release = block_worker(&queue);
    queue.enqueue_fn("a closure", vec![], || Ok(vec![]));
    assert!(!queue.run_here());
    release.send(()).unwrap();
    queue.flush();
    assert_eq!(queue.stats().pending, 0);
}

#[test]
fn the_device_time_of_queued_executions_is_counted_once() {
    let queue = ExecQueue::new().unwrap();
    let times_two = ready_executable(2.0);
    let zeros = value(&[0., 0., 0., 0.]);
    let started = Instant::now();
    let mut last = value(&[1., 1., 1., 1.]);
    for _ in 0..50 {
        let next = DeviceValue::pending();
        queue.enqueue(ExecJob::new(
            "chained",
            times_two.clone(),
            vec![last, zeros.clone()],
            vec![next.clone()],
        ));
        last = next;
    }
    queue.wait_launched().unwrap();
    let wall = started.elapsed();
    assert_eq!(f32_values(&last.wait_ready().unwrap())[0], 2f32.powi(50));
    let stats = queue.stats();
    // Completion callbacks may still be running for the last executions: the sum must never
    // exceed the wall time the executions spanned, however many were queued at once.
    assert!(stats.device_nanos > 0);
    assert!(
        stats.device_nanos <= wall.as_nanos() as u64,
        "{} ns of device time in {wall:?}",
        stats.device_nanos
    );
    assert!(stats.launch_nanos > 0 && stats.queue_nanos > 0);
}

#[test]
fn marks_complete_after_the_work_launched_before_them_in_order() {
    let queue = ExecQueue::new().unwrap();
    let times_two = ready_executable(2.0);
    let first = queue.mark();
    assert!(first.done_at().is_some(), "nothing launched: done at once");
    let out = DeviceValue::pending();
    queue.enqueue(ExecJob::new(
        "before the mark",
        times_two.clone(),
        vec![value(&[1., 2., 3., 4.]), value(&[0., 0., 0., 0.])],
        vec![out.clone()],
    ));
    let second = queue.mark();
    let done = second.wait();
    // The mark's work is computed, and the marks completed in queue order.
    assert!(out.is_resolved());
    assert!(done >= first.done_at().unwrap());
    assert_eq!(second.done_at(), Some(done));
}

/// Queues `count` closures one at a time, each after the previous one has run and a pause, and
/// returns how many times the worker had to be woken for them.
fn wakes_for_spaced_work(queue: &ExecQueue, count: usize, pause: Duration) -> u64 {
    let before = queue.stats();
    for _ in 0..count {
        let (ran, done) = std::sync::mpsc::channel();
        queue.enqueue_fn("spaced", vec![], move || {
            let _ = ran.send(());
            Ok(vec![])
        });
        done.recv().unwrap();
        std::thread::sleep(pause);
    }
    queue.stats().since(&before).worker_wakes
}

#[test]
fn a_watching_worker_takes_spaced_work_without_being_woken() {
    // Op-by-op execution queues one program at a time with host work in between: a worker
    // that keeps watching for a while sees each one without a wake-up call.
    let watching = ExecQueue::with_worker_spin(Duration::from_secs(5)).unwrap();
    let wakes = wakes_for_spaced_work(&watching, 20, Duration::from_micros(200));
    assert!(wakes <= 1, "{wakes} wakes for 20 pieces of work");

    // A worker that sleeps at once must be woken for nearly every one.
    let sleeping = ExecQueue::with_worker_spin(Duration::ZERO).unwrap();
    let wakes = wakes_for_spaced_work(&sleeping, 20, Duration::from_millis(5));
    assert!(wakes >= 10, "only {wakes} wakes for 20 pieces of work");
}

fn upload_of(values: &[f32]) -> compile::HostArgument {
    compile::HostArgument {
        client: client(),
        bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        element_type: pjrt::ElementType::F32,
        dims: smallvec::smallvec![values.len() as i64],
        what: "test scalars",
    }
}

#[test]
fn an_upload_of_a_value_uploaded_before_reuses_its_buffer() {
    let queue = ExecQueue::new().unwrap();
    let times_two = ready_executable(2.0);
    let a = value(&[1., 2., 3., 4.]);
    let before = queue.stats();
    let mut results = Vec::new();
    // The same lifted values twice, then others, then the first again.
    for b in [[1.0f32; 4], [1.0; 4], [0.5; 4], [1.0; 4]] {
        let out = DeviceValue::pending();
        queue.enqueue(
            ExecJob::new(
                "with scalars",
                times_two.clone(),
                vec![a.clone()],
                vec![out.clone()],
            )
            .upload(upload_of(&b)),
        );
        results.push(out);
    }
    let values: Vec<Vec<f32>> = results
        .iter()
        .map(|out| f32_values(&out.wait().unwrap()))
        .collect();
    assert_eq!(values[0], [4., 6., 8., 10.]);
    assert_eq!(values[1], [4., 6., 8., 10.]);
    assert_eq!(values[2], [3., 5., 7., 9.]);
    assert_eq!(values[3], [4., 6., 8., 10.]);
    assert_eq!(queue.stats().since(&before).upload_reuses, 2);
}

#[test]
fn work_a_holder_declines_is_taken_by_a_watching_worker() {
    // A caller holding the worker queues a closure, which it may not run itself: it declines and
    // blocks on the result. A worker that was watching (not asleep) when the caller declined
    // must take that work rather than leave it to the holder.
    let queue = ExecQueue::with_worker_spin(Duration::from_secs(5)).unwrap();
    for _ in 0..100 {
        // Work of the worker's own first, so that it is watching when the next piece comes.
        let (ran, done) = std::sync::mpsc::channel();
        queue.enqueue_fn("first", vec![], move || {
            let _ = ran.send(());
            Ok(vec![])
        });
        done.recv().unwrap();
        let out = DeviceValue::pending();
        let hold = queue.hold_worker();
        queue.enqueue_fn("second", vec![out.clone()], || {
            Ok(vec![Arc::new(f32_buffer(&[1.; 4]))])
        });
        assert!(!queue.run_here(), "a closure is the worker's to run");
        assert!(
            out.wait_timeout(Duration::from_secs(10)).is_some(),
            "the worker left declined work to the holder"
        );
        drop(hold);
    }
}
