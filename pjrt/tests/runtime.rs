//! End-to-end tests of the safe PJRT layer on the XLA CPU plugin: transfers of every dtype,
//! compile and execute, serialization, concurrency, events and every bad input.

use pjrt::{Client, ElementType, Error, NamedValue, Plugin};
use std::sync::{Arc, OnceLock};

fn client() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        // The CPU plugin unless TORCH_PJRT_PLUGIN names another (a CUDA run of these tests).
        let name = pjrt::configured_plugin_name();
        let plugin = Plugin::load(&name).expect("the CPU plugin is installed by `make venv`");
        Client::new(&plugin).expect("client")
    })
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn client_reports_platform_and_devices() {
    let c = client();
    assert_eq!(c.platform_name(), "cpu");
    assert!(!c.addressable_devices().is_empty());
    let (major, minor) = c.plugin().api_version();
    assert_eq!(major, pjrt::BUILT_API_VERSION.0);
    assert!(minor > 0);
    assert!(!c.plugin().version_fingerprint().is_empty());
}

#[test]
fn client_creation_options_are_passed() {
    let plugin = Plugin::load("cpu").unwrap();
    let c = Client::with_options(
        &plugin,
        &[("cpu_device_count".to_string(), NamedValue::Int64(2))],
    )
    .unwrap();
    assert_eq!(c.addressable_devices().len(), 2);
}

#[test]
fn plugin_is_loaded_once_per_process() {
    let a = Plugin::load("cpu").unwrap();
    let b = Plugin::load(a.path().to_str().unwrap()).unwrap();
    assert_eq!(a.path(), b.path());
}

#[test]
fn every_dtype_round_trips() {
    let c = client();
    for ty in ElementType::ALL {
        let n = 7usize;
        let bytes: Vec<u8> = (0..n * ty.size_bytes())
            .map(|i| match ty {
                // Booleans must be 0 or 1.
                ElementType::Pred => (i % 2) as u8,
                _ => (i * 37 % 251) as u8,
            })
            .collect();
        let buffer = c.buffer_from_host(&bytes, ty, &[n as i64]).unwrap();
        assert_eq!(buffer.element_type().unwrap(), ty);
        assert_eq!(buffer.dims().unwrap(), vec![n as i64]);
        assert_eq!(buffer.to_host().unwrap(), bytes, "{ty:?}");
    }
}

#[test]
fn zero_dim_and_empty_buffers_round_trip() {
    let c = client();
    let scalar = c
        .buffer_from_host(&f32_bytes(&[2.5]), ElementType::F32, &[])
        .unwrap();
    assert_eq!(scalar.dims().unwrap(), Vec::<i64>::new());
    assert_eq!(f32_values(&scalar.to_host().unwrap()), vec![2.5]);
    let empty = c.buffer_from_host(&[], ElementType::F32, &[0, 3]).unwrap();
    assert_eq!(empty.to_host().unwrap(), Vec::<u8>::new());
}

#[test]
fn elementwise_module_runs() {
    let c = client();
    let exe = c
        .compile(
            r#"
func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %s = stablehlo.add %a, %b : tensor<4xf32>
  %m = stablehlo.multiply %s, %a : tensor<4xf32>
  return %m : tensor<4xf32>
}"#,
        )
        .unwrap();
    let a = c
        .buffer_from_host(&f32_bytes(&[1., 2., 3., 4.]), ElementType::F32, &[4])
        .unwrap();
    let b = c
        .buffer_from_host(&f32_bytes(&[10., 20., 30., 40.]), ElementType::F32, &[4])
        .unwrap();
    let out = exe.execute(&[&a, &b]).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(
        f32_values(&out[0].to_host().unwrap()),
        vec![11., 44., 99., 176.]
    );
}

const DOT_AND_REDUCE: &str = r#"
func.func public @main(%x: tensor<2x3xf32>, %y: tensor<3x2xf32>) -> (tensor<2x2xf32>, tensor<2xf32>, tensor<i64>) {
  %p = stablehlo.dot_general %x, %y, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %r = stablehlo.reduce(%p init: %z) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
  %k = stablehlo.constant dense<42> : tensor<i64>
  return %p, %r, %k : tensor<2x2xf32>, tensor<2xf32>, tensor<i64>
}"#;

fn run_dot_and_reduce(exe: &pjrt::LoadedExecutable) -> (Vec<f32>, Vec<f32>, i64) {
    let c = client();
    let x = c
        .buffer_from_host(
            &f32_bytes(&[1., 2., 3., 4., 5., 6.]),
            ElementType::F32,
            &[2, 3],
        )
        .unwrap();
    let y = c
        .buffer_from_host(
            &f32_bytes(&[1., 0., 0., 1., 1., 1.]),
            ElementType::F32,
            &[3, 2],
        )
        .unwrap();
    let out = exe.execute(&[&x, &y]).unwrap();
    assert_eq!(out.len(), 3);
    assert_eq!(out[2].element_type().unwrap(), ElementType::S64);
    let k = i64::from_le_bytes(out[2].to_host().unwrap().try_into().unwrap());
    (
        f32_values(&out[0].to_host().unwrap()),
        f32_values(&out[1].to_host().unwrap()),
        k,
    )
}

#[test]
fn dot_general_reduce_and_multiple_results() {
    let exe = client().compile(DOT_AND_REDUCE).unwrap();
    assert_eq!(exe.num_outputs(), 3);
    let (p, r, k) = run_dot_and_reduce(&exe);
    assert_eq!(p, vec![4., 5., 10., 11.]);
    assert_eq!(r, vec![9., 21.]);
    assert_eq!(k, 42);
}

#[test]
fn serialize_deserialize_gives_same_result() {
    let c = client();
    let exe = c.compile(DOT_AND_REDUCE).unwrap();
    let bytes = exe.serialize().unwrap();
    assert!(!bytes.is_empty());
    let loaded = c.deserialize(&bytes).unwrap();
    assert_eq!(run_dot_and_reduce(&exe), run_dot_and_reduce(&loaded));
}

#[test]
fn corrupt_serialized_executable_is_an_error() {
    let c = client();
    let exe = c.compile(DOT_AND_REDUCE).unwrap();
    let mut bytes = exe.serialize().unwrap();
    bytes.truncate(bytes.len() / 3);
    assert!(c.deserialize(&bytes).is_err());
    assert!(c.deserialize(b"not an executable").is_err());
}

#[test]
fn two_threads_execute_at_once() {
    let c = client();
    let exe = Arc::new(
        c.compile(
            r#"
func.func public @main(%a: tensor<1024xf32>) -> tensor<f32> {
  %e = stablehlo.exponential %a : tensor<1024xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %r = stablehlo.reduce(%e init: %z) applies stablehlo.add across dimensions = [0] : (tensor<1024xf32>, tensor<f32>) -> tensor<f32>
  return %r : tensor<f32>
}"#,
        )
        .unwrap(),
    );
    let handles: Vec<_> = (0..2)
        .map(|t| {
            let exe = exe.clone();
            std::thread::spawn(move || {
                let c = client();
                let value = t as f32;
                let input = c
                    .buffer_from_host(&f32_bytes(&[value; 1024]), ElementType::F32, &[1024])
                    .unwrap();
                for _ in 0..200 {
                    let out = exe.execute(&[&input]).unwrap();
                    let got = f32_values(&out[0].to_host().unwrap())[0];
                    let want = 1024.0 * value.exp();
                    assert!((got - want).abs() <= want * 1e-5, "{got} vs {want}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn events_fire_callbacks_and_contain_panics() {
    let c = client();
    let a = c
        .buffer_from_host(&f32_bytes(&[1.0]), ElementType::F32, &[1])
        .unwrap();
    let event = a.ready_event().unwrap();
    event.wait().unwrap();
    assert!(event.is_ready().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    event
        .on_ready(move |result| {
            tx.send(result.is_ok()).unwrap();
        })
        .unwrap();
    assert!(rx.recv().unwrap());
    // A panicking callback is caught on the plugin's side of the boundary.
    let event = a.ready_event().unwrap();
    event.on_ready(|_| panic!("callback panic")).unwrap();
    assert_eq!(f32_values(&a.to_host().unwrap()), vec![1.0]);
}

#[test]
fn execution_event_is_returned() {
    let exe = client().compile(DOT_AND_REDUCE).unwrap();
    let c = client();
    let x = c
        .buffer_from_host(&f32_bytes(&[0.; 6]), ElementType::F32, &[2, 3])
        .unwrap();
    let y = c
        .buffer_from_host(&f32_bytes(&[0.; 6]), ElementType::F32, &[3, 2])
        .unwrap();
    let (outs, event) = exe
        .execute_with(&[&x, &y], &pjrt::ExecuteOptions::default())
        .unwrap();
    if let Some(event) = event {
        event.wait().unwrap();
    }
    outs[0].wait_ready().unwrap();
}

#[test]
fn compiled_memory_stats_work_and_device_stats_are_an_error() {
    let c = client();
    let exe = c.compile(DOT_AND_REDUCE).unwrap();
    let stats = exe.compiled_memory_stats().unwrap();
    assert!(stats.output_bytes >= 16 + 8 + 8, "{stats:?}");
    // The CPU plugin has no allocator statistics: an error, not a crash.
    let device = c.addressable_devices()[0].clone();
    let err = c.device_memory_stats(&device).unwrap_err();
    assert!(!err.to_string().is_empty());
}

#[test]
fn missing_plugin_names_places_and_fix() {
    let err = Plugin::load("/nonexistent/dir/plugin.so").unwrap_err();
    let message = err.to_string();
    assert!(message.contains("/nonexistent/dir/plugin.so"), "{message}");
    assert!(message.contains("TORCH_PJRT_PLUGIN"), "{message}");
    let err = Plugin::load("tpu").unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, Error::PluginNotFound { .. }), "{message}");
    assert!(message.contains("libtpu/libtpu.so"), "{message}");
    assert!(message.contains("pip install libtpu"), "{message}");
}

#[test]
fn a_library_that_is_not_a_plugin_is_refused() {
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("libc.so.6");
    let err = Plugin::load(libc).unwrap_err();
    assert!(matches!(err, Error::NotAPlugin { .. }), "{err}");
    assert!(err.to_string().contains("GetPjrtApi"), "{err}");
    // Not a shared library at all.
    let dir = std::env::temp_dir().join(format!("pjrt-not-elf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("plugin.so");
    std::fs::write(&text, b"plain text").unwrap();
    let err = Plugin::load(text.to_str().unwrap()).unwrap_err();
    assert!(matches!(err, Error::NotAPlugin { .. }), "{err}");
}

#[test]
fn invalid_stablehlo_carries_the_diagnostic() {
    let err = client()
        .compile("func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> { %b = stablehlo.bogus_op %a : tensor<4xf32>\n return %b : tensor<4xf32> }")
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("bogus_op"), "{message}");
    // The client keeps working after a failed compile.
    elementwise_module_runs();
}

#[test]
fn host_slice_length_is_checked_before_pjrt() {
    let err = client()
        .buffer_from_host(&[0u8; 10], ElementType::F32, &[3])
        .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, Error::InvalidArgument(_)));
    assert!(
        message.contains("12 bytes") && message.contains("10 bytes"),
        "{message}"
    );
    let err = client()
        .buffer_from_host(&[], ElementType::F32, &[-1])
        .unwrap_err();
    assert!(err.to_string().contains("non-negative"));
}

/// A client of its own: the shared one's ledger moves with the tests running beside this one.
fn private_client() -> Client {
    let plugin = Plugin::load("cpu").expect("the CPU plugin is installed by `make venv`");
    Client::new(&plugin).expect("a client")
}

#[test]
fn memory_ledger_counts_live_buffers_and_donations() {
    let c = private_client();
    assert_eq!(c.memory_usage().live_bytes, 0);
    let x = c
        .buffer_from_host(&f32_bytes(&[1.0; 1024]), ElementType::F32, &[1024])
        .unwrap();
    assert_eq!(c.memory_usage().live_bytes, 4096);
    let module = r#"
module {
  func.func public @main(%arg0: tensor<1024xf32> {tf.aliasing_output = 0 : i32}) -> (tensor<1024xf32>) {
    %0 = "stablehlo.add"(%arg0, %arg0) : (tensor<1024xf32>, tensor<1024xf32>) -> tensor<1024xf32>
    "func.return"(%0) : (tensor<1024xf32>) -> ()
  }
}
"#;
    let exe = c.compile(module).unwrap();
    let kept = exe
        .execute_with(
            &[&x],
            &pjrt::ExecuteOptions {
                non_donatable: vec![0],
                ..Default::default()
            },
        )
        .unwrap()
        .0;
    // An aliased argument passed as non-donatable is copied, not consumed.
    assert_eq!(c.memory_usage().live_bytes, 8192, "input kept, result new");
    assert!(!x.is_deleted().unwrap());
    assert_eq!(f32_values(&kept[0].to_host().unwrap())[0], 2.0);
    assert_eq!(f32_values(&x.to_host().unwrap())[0], 1.0);
    drop(kept);
    let donated = exe.execute(&[&x]).unwrap();
    assert!(x.is_deleted().unwrap(), "the argument was donated");
    assert_eq!(
        c.memory_usage().live_bytes,
        4096,
        "the result took the argument's memory"
    );
    assert_eq!(f32_values(&donated[0].to_host().unwrap())[0], 2.0);
    drop(x);
    assert_eq!(
        c.memory_usage().live_bytes,
        4096,
        "a donated buffer is not released twice"
    );
    drop(donated);
    let usage = c.memory_usage();
    assert_eq!(usage.live_bytes, 0);
    assert!(usage.peak_bytes >= 8192);
    c.reset_peak_memory();
    assert_eq!(c.memory_usage().peak_bytes, 0);
}

#[test]
fn warm_up_runs_a_product_outside_the_ledger() {
    let c = private_client();
    let x = c
        .buffer_from_host(&f32_bytes(&[1.0; 16]), ElementType::F32, &[16])
        .unwrap();
    c.reset_peak_memory();
    let before = c.memory_usage();
    c.warm_up().expect("the warm-up product runs");
    assert_eq!(c.memory_usage(), before, "live and peak bytes unchanged");
    // Buffers made after it count as before.
    let y = c
        .buffer_from_host(&f32_bytes(&[1.0; 16]), ElementType::F32, &[16])
        .unwrap();
    assert_eq!(c.memory_usage().live_bytes, before.live_bytes + 64);
    drop((x, y));
    assert_eq!(c.memory_usage().live_bytes, 0);
}

#[test]
fn compile_options_set_by_name_reach_the_compiler() {
    const ADD: &str = r#"
func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %s = stablehlo.add %a, %b : tensor<4xf32>
  return %s : tensor<4xf32>
}"#;
    let c = client();
    let with = |name: &str, value: pjrt::CompileOverride| pjrt::CompileOptions {
        overrides: vec![(name.to_string(), value)],
        ..pjrt::CompileOptions::default()
    };
    // A debug option the plugin knows compiles and runs.
    let exe = c
        .compile_with_options(
            ADD,
            &with(
                "xla_cpu_enable_fast_math",
                pjrt::CompileOverride::Bool(false),
            ),
        )
        .unwrap();
    let a = c
        .buffer_from_host(&f32_bytes(&[1., 2., 3., 4.]), ElementType::F32, &[4])
        .unwrap();
    let out = exe.execute(&[&a, &a]).unwrap();
    assert_eq!(f32_values(&out[0].to_host().unwrap()), vec![2., 4., 6., 8.]);
    // A name it does not know is refused with that name, and the client keeps working.
    let err = c
        .compile_with_options(
            ADD,
            &with("xla_no_such_option", pjrt::CompileOverride::Bool(true)),
        )
        .unwrap_err();
    assert!(err.to_string().contains("xla_no_such_option"), "{err}");
    elementwise_module_runs();
}

#[test]
fn a_computed_buffer_is_read_in_place_on_the_cpu_plugin() {
    let c = client();
    let exe = c
        .compile(
            r#"
func.func public @main(%a: tensor<3x4xf32>) -> (tensor<3x4xf32>, tensor<4x3xf32>, tensor<i1>) {
  %s = stablehlo.add %a, %a : tensor<3x4xf32>
  %t = stablehlo.transpose %a, dims = [1, 0] : (tensor<3x4xf32>) -> tensor<4x3xf32>
  %z = stablehlo.constant dense<true> : tensor<i1>
  return %s, %t, %z : tensor<3x4xf32>, tensor<4x3xf32>, tensor<i1>
}"#,
        )
        .unwrap();
    let values: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let a = c
        .buffer_from_host(&f32_bytes(&values), ElementType::F32, &[3, 4])
        .unwrap();
    let out = exe.execute(&[&a]).unwrap();
    let on_host_memory = c.platform_name() == "cpu";
    let mut doubled = vec![0u8; 48];
    assert_eq!(out[0].read_in_place(&mut doubled).unwrap(), on_host_memory);
    let mut transposed = vec![0u8; 48];
    out[1].to_host_into(&mut transposed).unwrap();
    let mut flag = vec![0u8; 1];
    out[2].to_host_into(&mut flag).unwrap();
    if on_host_memory {
        let expected: Vec<f32> = values.iter().map(|v| v * 2.0).collect();
        assert_eq!(f32_values(&doubled), expected);
    }
    let expected_t: Vec<f32> = (0..4)
        .flat_map(|j| (0..3).map(move |i| (i * 4 + j) as f32))
        .collect();
    assert_eq!(f32_values(&transposed), expected_t);
    assert_eq!(flag, vec![1]);
    // A destination of the wrong size is not read in place (the copy path reports the error).
    let mut short = vec![0u8; 8];
    assert!(!out[0].read_in_place(&mut short).unwrap());
}

/// A StableHLO `all_reduce` over the process's own devices runs as one program: one replica per
/// device, each given its own device's buffer, each receiving the sum.
#[test]
fn all_reduce_runs_across_the_devices_of_one_process() {
    let plugin = Plugin::load("cpu").unwrap();
    let c = Client::with_options(
        &plugin,
        &[("cpu_device_count".to_string(), NamedValue::Int64(4))],
    )
    .unwrap();
    let module = "module @all_reduce attributes {mhlo.num_replicas = 4 : i32, mhlo.num_partitions = 1 : i32} {
  func.func public @main(%x: tensor<3xf32>) -> tensor<3xf32> {
    %r = \"stablehlo.all_reduce\"(%x) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<3xf32>) -> tensor<3xf32>
    return %r : tensor<3xf32>
  }
}";
    let options = pjrt::CompileOptions {
        num_replicas: 4,
        ..Default::default()
    };
    let exe = c.compile_with_options(module, &options).unwrap();
    let devices = c.addressable_devices().to_vec();
    let inputs: Vec<_> = (0..4)
        .map(|i| {
            let v = [i as f32, 10.0 * i as f32, 1.0];
            c.buffer_from_host_on(&f32_bytes(&v), ElementType::F32, &[3], &devices[i])
                .unwrap()
        })
        .collect();
    let lists: Vec<Vec<&pjrt::Buffer>> = inputs.iter().map(|b| vec![b]).collect();
    let results = exe.execute_replicated(&lists).unwrap();
    assert_eq!(results.len(), 4);
    for replica in &results {
        assert_eq!(
            f32_values(&replica[0].to_host().unwrap()),
            vec![6.0, 60.0, 4.0]
        );
    }
    // Unequal argument lists are refused, not handed to the plugin.
    let uneven = vec![vec![&inputs[0]], vec![]];
    assert!(exe.execute_replicated(&uneven).is_err());
}

fn four_device_client() -> Client {
    let plugin = Plugin::load("cpu").unwrap();
    Client::with_options(
        &plugin,
        &[("cpu_device_count".to_string(), NamedValue::Int64(4))],
    )
    .unwrap()
}

/// One portable executable runs on whichever device each execution names, its results on that
/// device; a buffer copies from one device to another without the host.
#[test]
fn portable_executables_run_on_the_device_each_execution_names() {
    let c = four_device_client();
    let devices = c.addressable_devices().to_vec();
    let module = "module @double {
  func.func public @main(%x: tensor<3xf32>) -> tensor<3xf32> {
    %r = stablehlo.add %x, %x : tensor<3xf32>
    return %r : tensor<3xf32>
  }
}";
    let portable = pjrt::CompileOptions {
        portable: true,
        ..Default::default()
    };
    let exe = c.compile_with_options(module, &portable).unwrap();
    for device in &devices {
        let x = c
            .buffer_from_host_on(&f32_bytes(&[1.0, 2.0, 3.0]), ElementType::F32, &[3], device)
            .unwrap();
        assert_eq!(x.device().unwrap().id, device.id);
        let options = pjrt::ExecuteOptions {
            device: Some(device.clone()),
            ..Default::default()
        };
        let (out, _) = exe.execute_with(&[&x], &options).unwrap();
        assert_eq!(out[0].device().unwrap().id, device.id);
        assert_eq!(f32_values(&out[0].to_host().unwrap()), vec![2.0, 4.0, 6.0]);
        // Copied to the next device, the values arrive there unchanged.
        let next = &devices[(device.id as usize + 1) % devices.len()];
        let moved = out[0].copy_to_device(next).unwrap();
        assert_eq!(moved.device().unwrap().id, next.id);
        assert_eq!(f32_values(&moved.to_host().unwrap()), vec![2.0, 4.0, 6.0]);
    }
    // An executable compiled for the default device refuses another one.
    let fixed = c.compile(module).unwrap();
    let x = c
        .buffer_from_host_on(
            &f32_bytes(&[1.0, 2.0, 3.0]),
            ElementType::F32,
            &[3],
            &devices[2],
        )
        .unwrap();
    let elsewhere = pjrt::ExecuteOptions {
        device: Some(devices[2].clone()),
        ..Default::default()
    };
    assert!(fixed.execute_with(&[&x], &elsewhere).is_err());
    // A portable executable survives serialization and still runs anywhere.
    let restored = c.deserialize(&exe.serialize().unwrap()).unwrap();
    let (out, _) = restored.execute_with(&[&x], &elsewhere).unwrap();
    assert_eq!(out[0].device().unwrap().id, 2);
}

/// A replicated program runs its replicas on the devices the compile assigned them.
#[test]
fn replicas_run_on_their_assigned_devices() {
    let c = four_device_client();
    let devices = c.addressable_devices().to_vec();
    let module = "module @all_reduce attributes {mhlo.num_replicas = 2 : i32, mhlo.num_partitions = 1 : i32} {
  func.func public @main(%x: tensor<2xf32>) -> tensor<2xf32> {
    %r = \"stablehlo.all_reduce\"(%x) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<2xf32>) -> tensor<2xf32>
    return %r : tensor<2xf32>
  }
}";
    let options = pjrt::CompileOptions {
        num_replicas: 2,
        replica_devices: vec![3, 1],
        ..Default::default()
    };
    let exe = c.compile_with_options(module, &options).unwrap();
    let a = c
        .buffer_from_host_on(&f32_bytes(&[1.0, 2.0]), ElementType::F32, &[2], &devices[3])
        .unwrap();
    let b = c
        .buffer_from_host_on(
            &f32_bytes(&[10.0, 20.0]),
            ElementType::F32,
            &[2],
            &devices[1],
        )
        .unwrap();
    let results = exe.execute_replicated(&[vec![&a], vec![&b]]).unwrap();
    assert_eq!(results[0][0].device().unwrap().id, 3);
    assert_eq!(results[1][0].device().unwrap().id, 1);
    for replica in &results {
        assert_eq!(f32_values(&replica[0].to_host().unwrap()), vec![11.0, 22.0]);
    }
}
