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
    let start = Instant::now();
    let mut cur = x.clone();
    for i in 0..n {
        let c = g
            .capture(
                OpId::Add,
                &[cur.clone()],
                &[ScalarArg::float(1.0)],
                &[],
                &[],
            )
            .unwrap();
        let next = TensorRef::contiguous(c.outputs[0].0, DType::F32, &[16]);
        if cur.storage != x.storage {
            g.release_storage(cur.storage).unwrap();
        }
        cur = next;
        if i % 1000 == 999 {
            g.flush(FlushRequest::All, |_| 1).unwrap();
        }
    }
    println!(
        "capture (flush every 1000): {:.0} ns/op",
        start.elapsed().as_nanos() as f64 / n as f64
    );
}
