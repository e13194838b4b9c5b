//! Helpers shared by the view and cache-tier engine tests: engines per mode, raw host transfers,
//! views over a storage and metric reads.
#![allow(dead_code)]

pub mod training;

use defer::{Mode, TensorRef};
use ops::DType;
use smallvec::SmallVec;
use std::path::PathBuf;
use torch_glue::{Engine, EngineConfig};

/// An engine in `mode` with the given disk tiers (tier 2: `shared_dir`, tier 3:
/// `persistent_dir`).
pub fn engine_with(
    mode: Mode,
    shared_dir: Option<PathBuf>,
    persistent_dir: Option<PathBuf>,
) -> Engine {
    let mut config = EngineConfig::from_env().expect("engine configuration");
    config.default_mode = mode;
    config.compile.shared_dir = shared_dir;
    config.compile.persistent_dir = persistent_dir;
    config.compile.dump_dir = None;
    Engine::new(config).expect("engine")
}

/// An engine in `mode` with tier 1 only.
pub fn engine(mode: Mode) -> Engine {
    engine_with(mode, None, None)
}

/// A new storage holding `bytes`, seen as a contiguous tensor of `dtype` and `sizes`.
pub fn upload(e: &Engine, dtype: DType, sizes: &[i64], bytes: &[u8]) -> TensorRef {
    let storage = e.new_storage(bytes.len() as u64);
    let t = TensorRef::contiguous(storage, dtype, sizes);
    e.write_host(&t, bytes).expect("upload");
    t
}

pub fn upload_f32(e: &Engine, values: &[f32], sizes: &[i64]) -> TensorRef {
    upload(e, DType::F32, sizes, &f32_bytes(values))
}

/// The bytes of tensor `t`, read through its view.
pub fn download(e: &Engine, t: &TensorRef) -> Vec<u8> {
    let mut bytes = vec![0u8; t.numel() as usize * t.dtype.size_bytes()];
    e.read_host(t, &mut bytes).expect("read");
    bytes
}

pub fn download_f32(e: &Engine, t: &TensorRef) -> Vec<f32> {
    f32_values(&download(e, t))
}

pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A view of `base`'s storage with another dtype, sizes, strides and offset (`as_strided`).
pub fn view_as(
    base: &TensorRef,
    dtype: DType,
    sizes: &[i64],
    strides: &[i64],
    offset: i64,
) -> TensorRef {
    TensorRef {
        storage: base.storage,
        dtype,
        sizes: SmallVec::from_slice(sizes),
        strides: SmallVec::from_slice(strides),
        offset,
    }
}

/// A view of `base`'s storage with its dtype.
pub fn view(base: &TensorRef, sizes: &[i64], strides: &[i64], offset: i64) -> TensorRef {
    view_as(base, base.dtype, sizes, strides, offset)
}

/// A contiguous view over the storage of a tensor an op produced.
pub fn output(captured: &defer::Captured) -> TensorRef {
    let (storage, ty) = captured.outputs[0].clone();
    TensorRef::contiguous(storage, ty.dtype, &ty.shape)
}

pub fn metric(e: &Engine, name: &str) -> f64 {
    *e.metrics()
        .values
        .get(name)
        .unwrap_or_else(|| panic!("no metric {name}"))
}
