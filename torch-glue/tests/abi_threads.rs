//! Several threads use the C ABI at once, each on its own tensors, in every eager mode: results
//! are right, errors stay with the thread that made them, and nothing deadlocks.

mod common;

use common::abi::*;
use common::typed;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;
use torch_glue::abi::*;

const THREADS: usize = 4;
const STEPS: usize = 40;

/// One thread's work: a running value updated and read back every step, plus a reduction.
fn worker(index: usize) -> Result<(), String> {
    let base: Vec<f32> = (0..8).map(|i| (index * 100 + i) as f32).collect();
    let x = upload_f32(&base, &[2, 4]);
    let mut acc = upload_f32(&[0.0; 8], &[2, 4]);
    let mut want = vec![0.0f32; 8];
    for step in 0..STEPS {
        let k = (step % 3) as f64;
        // acc = acc + (x * k); k is a lifted scalar, so every step reuses one executable.
        let scaled = op1(typed::Mul, &[&x], &[scalar_float(k)]);
        let next = op1(typed::Add, &[&acc, &scaled], &[]);
        for t in [&scaled, &acc] {
            release(t).map_err(|e| e.message)?;
        }
        acc = next;
        for (w, b) in want.iter_mut().zip(&base) {
            *w += b * k as f32;
        }
        if step % 4 == 0 {
            let got = read_f32(&acc).map_err(|e| e.message)?;
            if got != want {
                return Err(format!(
                    "thread {index} step {step}: got {got:?}, want {want:?}"
                ));
            }
        }
    }
    let total = op1(common::sum_all(), &[&acc], &[]);
    let got = read_f32(&total).map_err(|e| e.message)?[0];
    let expected: f32 = want.iter().sum();
    if got != expected {
        return Err(format!("thread {index}: sum {got}, want {expected}"));
    }
    // A bad call on this thread: its message is this thread's, not another's.
    let other = upload_f32(&[1.0; 3], &[3]);
    match op(typed::Add, &[&acc, &other], &[]) {
        Ok(_) => return Err(format!("thread {index}: a shape mismatch succeeded")),
        Err(e)
            if e.message
                .contains("(4) must match the size of tensor b (3)") => {}
        Err(e) => return Err(format!("thread {index}: unexpected error {e:?}")),
    }
    for t in [&x, &acc, &total, &other] {
        release(t).map_err(|e| e.message)?;
    }
    Ok(())
}

/// Runs the workers (plus a thread that syncs and reads metrics meanwhile) with a deadline.
fn run_threads() {
    let (done, finished) = mpsc::channel();
    let mut handles = Vec::new();
    for index in 0..THREADS {
        let done = done.clone();
        handles.push(thread::spawn(move || {
            let _ = done.send((index, worker(index)));
        }));
    }
    let syncer = {
        let done = done.clone();
        thread::spawn(move || {
            let mut outcome = Ok(());
            for _ in 0..20 {
                if let Err(e) = check(tpjrt_sync()) {
                    outcome = Err(format!("sync: {e:?}"));
                }
                if !metrics_json().starts_with('{') {
                    outcome = Err("metrics are not JSON".to_string());
                }
                thread::sleep(Duration::from_millis(2));
            }
            let _ = done.send((THREADS, outcome));
        })
    };
    drop(done);
    for _ in 0..=THREADS {
        match finished.recv_timeout(Duration::from_secs(120)) {
            Ok((index, Ok(()))) => eprintln!("thread {index} done"),
            Ok((index, Err(e))) => panic!("thread {index} failed: {e}"),
            Err(_) => panic!("threads did not finish within 120 s: deadlock"),
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    syncer.join().unwrap();
}

#[test]
fn threads_run_ops_and_reads_at_once_in_every_mode() {
    init();
    let _guard = global_lock();
    for mode in [0, 1, 2] {
        let live = metric("live_storages");
        with_mode(mode, run_threads);
        assert_eq!(
            metric("live_storages"),
            live,
            "mode {mode}: every storage was released"
        );
    }
}
