//! Helpers shared by the compile crate's integration tests: one CPU client per process, tiny
//! StableHLO modules, keys and configurations over temp directories.

#![allow(dead_code)]

use compile::{CacheKey, CompileConfig, Compiler};
use pjrt::{Buffer, Client, ElementType, Plugin};
use std::path::Path;
use std::sync::{Arc, OnceLock};

pub fn client() -> Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            // The CPU plugin unless TORCH_PJRT_PLUGIN names another (a CUDA run of these tests).
            let name = pjrt::configured_plugin_name();
            let plugin = Plugin::load(&name).expect("the CPU plugin is installed by `make venv`");
            Client::new(&plugin).expect("client")
        })
        .clone()
}

/// `(a + b) * factor` over `tensor<4xf32>`; a distinct `factor` gives a distinct module.
pub fn module(factor: f32) -> String {
    format!(
        r#"
func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {{
  %s = stablehlo.add %a, %b : tensor<4xf32>
  %c = stablehlo.constant dense<{factor:?}> : tensor<4xf32>
  %m = stablehlo.multiply %s, %c : tensor<4xf32>
  return %m : tensor<4xf32>
}}"#
    )
}

pub const INVALID_MODULE: &str = "func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> { \
    %b = stablehlo.bogus_op %a : tensor<4xf32>\n return %b : tensor<4xf32> }";

pub fn key(compiler: &Compiler, id: u64) -> CacheKey {
    CacheKey::new(id, 0xd1d1, compiler.options_fingerprint())
}

pub fn config() -> CompileConfig {
    CompileConfig {
        threads: 2,
        ..CompileConfig::default()
    }
}

pub fn with_tier3(dir: &Path) -> CompileConfig {
    CompileConfig {
        persistent_dir: Some(dir.to_path_buf()),
        ..config()
    }
}

pub fn with_tier2(dir: &Path) -> CompileConfig {
    CompileConfig {
        shared_dir: Some(dir.to_path_buf()),
        ..config()
    }
}

pub fn compiler(config: CompileConfig) -> Compiler {
    Compiler::new(client(), config).expect("compiler")
}

pub fn f32_buffer(values: &[f32]) -> Buffer {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    client()
        .buffer_from_host(&bytes, ElementType::F32, &[values.len() as i64])
        .unwrap()
}

pub fn f32_values(buffer: &Buffer) -> Vec<f32> {
    buffer
        .to_host()
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Runs a `module(factor)` executable on fixed inputs and checks the result.
pub fn check_runs(executable: &pjrt::LoadedExecutable, factor: f32) {
    let a = f32_buffer(&[1., 2., 3., 4.]);
    let b = f32_buffer(&[10., 20., 30., 40.]);
    let out = executable.execute(&[&a, &b]).unwrap();
    let want: Vec<f32> = [11., 22., 33., 44.].iter().map(|v| v * factor).collect();
    assert_eq!(f32_values(&out[0]), want);
}

/// A build closure that counts its calls.
pub fn counted_build(
    text: String,
    calls: &Arc<std::sync::atomic::AtomicUsize>,
) -> impl FnOnce() -> Result<String, String> + Send + 'static {
    let calls = calls.clone();
    move || {
        calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(text)
    }
}
