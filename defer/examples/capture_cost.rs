//! Host cost of capture alone and of capture + a one-op flush, with plain device values.

use defer::{FlushRequest, Graph, TensorRef};
use ops::{DType, OpId, ScalarArg};
use std::time::Instant;

fn main() {
    let n: usize = std::env::var("CAPTURE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let mut g: Graph<u32> = Graph::new();
    let s = g.new_storage(64);
    let x = TensorRef::contiguous(s, DType::F32, &[16]);
    g.write_device(&x, 0).unwrap();
    let only_capture = std::env::args().nth(1).as_deref() == Some("capture");
    let start = Instant::now();
    for _ in 0..if only_capture { 0 } else { n } {
        let c = g
            .capture(
                OpId::Add,
                std::slice::from_ref(&x),
                &[ScalarArg::float(1.0)],
                &[],
                &[],
            )
            .unwrap();
        g.flush(FlushRequest::All, |_| 1).unwrap();
        g.release_storage(c.outputs[0].0).unwrap();
    }
    println!(
        "capture + one-op flush: {:.0} ns/op",
        start.elapsed().as_nanos() as f64 / n as f64
    );
    // Capture alone: the clock runs only around the captures; flushes and releases, which
    // bound the pending list as a program's syncs would, are not counted.
    let mut captured = std::time::Duration::ZERO;
    // Per-batch times: the fastest batches are the ones no other process interrupted.
    let mut batches: Vec<f64> = Vec::new();
    let mut cur = x.clone();
    let mut batch: Vec<defer::StorageId> = Vec::with_capacity(1000);
    let mut done = 0;
    while done < n {
        let start = Instant::now();
        for _ in 0..1000 {
            let c = g
                .capture(
                    OpId::Add,
                    std::slice::from_ref(&cur),
                    &[ScalarArg::float(1.0)],
                    &[],
                    &[],
                )
                .unwrap();
            cur = TensorRef::contiguous(c.outputs[0].0, DType::F32, &[16]);
            batch.push(cur.storage);
        }
        let elapsed = start.elapsed();
        captured += elapsed;
        batches.push(elapsed.as_nanos() as f64 / 1000.0);
        done += 1000;
        g.flush(FlushRequest::All, |_| 1).unwrap();
        for storage in batch.drain(..) {
            if storage != cur.storage {
                g.release_storage(storage).unwrap();
            }
        }
    }
    batches.sort_by(f64::total_cmp);
    println!(
        "capture alone: {:.0} ns/op on average, {:.0} median batch, {:.0} fastest decile",
        captured.as_nanos() as f64 / done as f64,
        batches[batches.len() / 2],
        batches[batches.len() / 10]
    );
}
