//! Compiles a small StableHLO module on a PJRT plugin, runs it, and prints the result, the
//! platform and the compile/execute/transfer timings.

use pjrt::{Client, ElementType, Plugin};
use std::time::Instant;

const MODULE: &str = r#"
module @demo {
  func.func public @main(%x: tensor<2x3xf32>, %y: tensor<3x2xf32>) -> (tensor<2x2xf32>, tensor<f32>) {
    %prod = stablehlo.dot_general %x, %y, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
    %exp = stablehlo.exponential %prod : tensor<2x2xf32>
    %log = stablehlo.log %exp : tensor<2x2xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %sum = stablehlo.reduce(%log init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
    return %log, %sum : tensor<2x2xf32>, tensor<f32>
  }
}
"#;

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let plugin_name = pjrt::configured_plugin_name();
    let start = Instant::now();
    let plugin = Plugin::load(&plugin_name)?;
    let client = Client::new(&plugin)?;
    let load_time = start.elapsed();
    let (major, minor) = plugin.api_version();
    println!("plugin:   {}", plugin.path().display());
    println!(
        "platform: {} {} (PJRT C API {major}.{minor}), {} addressable devices",
        client.platform_name(),
        client.platform_version(),
        client.addressable_devices().len()
    );

    let start = Instant::now();
    let exe = client.compile(MODULE)?;
    let compile_time = start.elapsed();

    let x = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = f32_bytes(&[0.5, -1.0, 0.25, 0.0, 1.0, 2.0]);
    let start = Instant::now();
    let xb = client.buffer_from_host(&x, ElementType::F32, &[2, 3])?;
    let yb = client.buffer_from_host(&y, ElementType::F32, &[3, 2])?;
    let upload_time = start.elapsed();

    // Warm up once, then time repeated executions with the result synced each time.
    exe.execute(&[&xb, &yb])?[0].wait_ready()?;
    let runs = 1000;
    let start = Instant::now();
    for _ in 0..runs {
        let outputs = exe.execute(&[&xb, &yb])?;
        outputs[1].wait_ready()?;
    }
    let execute_time = start.elapsed() / runs;

    let outputs = exe.execute(&[&xb, &yb])?;
    let start = Instant::now();
    let matrix = f32_values(&outputs[0].to_host()?);
    let total = f32_values(&outputs[1].to_host()?);
    let download_time = start.elapsed();

    println!("x @ y (through exp/log) = {matrix:?}, sum = {}", total[0]);
    println!(
        "timings: plugin load + client {:.1} ms, compile {:.1} ms, upload {:.1} µs, \
         execute {:.1} µs (mean of 1000 warm runs, synced), download {:.1} µs",
        load_time.as_secs_f64() * 1e3,
        compile_time.as_secs_f64() * 1e3,
        upload_time.as_secs_f64() * 1e6,
        execute_time.as_secs_f64() * 1e6,
        download_time.as_secs_f64() * 1e6
    );
    Ok(())
}
