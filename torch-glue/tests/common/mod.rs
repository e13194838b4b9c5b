//! Shared helpers for engine tests: engines per mode, host tensors in and out.
#![allow(dead_code)]

use defer::{Mode, StorageId, TensorRef};
use ops::{DType, OpId, ScalarArg};
use torch_glue::{Engine, EngineConfig};

pub fn engine(mode: Mode) -> Engine {
    let mut config = EngineConfig::from_env().expect("config");
    config.default_mode = mode;
    config.compile.persistent_dir = None;
    config.compile.shared_dir = None;
    Engine::new(config).expect("engine")
}

pub fn upload_f32(e: &Engine, values: &[f32], sizes: &[i64]) -> TensorRef {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let storage = e.new_storage(bytes.len() as u64);
    let t = TensorRef::contiguous(storage, DType::F32, sizes);
    e.write_host(&t, &bytes).expect("upload");
    t
}

pub fn upload_i64(e: &Engine, values: &[i64], sizes: &[i64]) -> TensorRef {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let storage = e.new_storage(bytes.len() as u64);
    let t = TensorRef::contiguous(storage, DType::I64, sizes);
    e.write_host(&t, &bytes).expect("upload");
    t
}

pub fn read_f32(e: &Engine, t: &TensorRef) -> Vec<f32> {
    let mut bytes = vec![0u8; t.numel() as usize * 4];
    e.read_host(t, &mut bytes).expect("read");
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub fn read_i64(e: &Engine, t: &TensorRef) -> Vec<i64> {
    let mut bytes = vec![0u8; t.numel() as usize * 8];
    e.read_host(t, &mut bytes).expect("read");
    bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Runs an op with new outputs and returns its first output as a tensor.
pub fn op(
    e: &Engine,
    op: OpId,
    inputs: &[&TensorRef],
    scalars: &[ScalarArg],
    params: &[i64],
) -> TensorRef {
    let inputs: Vec<TensorRef> = inputs.iter().map(|t| (*t).clone()).collect();
    let captured = e.op(op, &inputs, scalars, params, &[]).expect("op");
    let (storage, ty): (StorageId, _) = captured.outputs[0].clone();
    TensorRef::contiguous(storage, ty.dtype, &ty.shape)
}

pub fn metric(e: &Engine, name: &str) -> f64 {
    *e.metrics()
        .values
        .get(name)
        .unwrap_or_else(|| panic!("no metric {name}"))
}
