//! Shared code for engine tests: engines per mode, host tensors in and out, tolerances.
#![allow(dead_code)]

pub mod abi;
pub mod reference;

use defer::{Captured, EngineError, Mode, StorageId, TensorRef};
use ops::param_layout::of;
use ops::{DType, EncodedOp, ScalarArg, TypedOp};
use torch_glue::{Engine, EngineConfig};

// Not every test names a layout.
#[allow(unused_imports)]
pub use ops::{param_layout as layout, typed};

/// An op with its params, named through the op's layout: `typed::Sum.encode(layout::
/// ReduceDtypeDims { .. })`, or an op without params as it is (`typed::Neg`). A struct of
/// another layout, a field left out or a field misnamed does not compile.
pub trait Call {
    fn encoded(self) -> EncodedOp;
}

impl Call for EncodedOp {
    fn encoded(self) -> EncodedOp {
        self
    }
}

/// An op without params (`typed::Neg`), for tables of such ops.
pub type NoParams = TypedOp<of::None>;

impl Call for NoParams {
    fn encoded(self) -> EncodedOp {
        self.encode(())
    }
}

/// `sum` of every element to a 0-d result, in the input's dtype (int64 for integers).
pub fn sum_all() -> EncodedOp {
    typed::Sum.encode(layout::ReduceDtypeDims {
        keepdim: false,
        dtype: None,
        dims: &[],
    })
}

/// An engine whose default mode is `mode`, with no disk cache tiers.
pub fn engine(mode: Mode) -> Engine {
    engine_with(mode, None)
}

/// [`engine`] with a region-size cap.
pub fn engine_with(mode: Mode, max_region_ops: Option<usize>) -> Engine {
    let mut config = EngineConfig::from_env().expect("config");
    config.default_mode = mode;
    config.compile.persistent_dir = None;
    config.compile.shared_dir = None;
    config.compile.dump_dir = None;
    if let Some(cap) = max_region_ops {
        config.max_region_ops = cap;
    }
    Engine::new(config).expect("engine")
}

/// Runs `f` with `mode` pushed on the engine's mode stack.
pub fn with_mode<T>(e: &Engine, mode: Mode, f: impl FnOnce() -> T) -> T {
    e.modes().push(mode);
    let out = f();
    e.modes().pop().expect("pop the mode pushed above");
    out
}

/// Host values as `dtype` bytes (C++ conversion for ints, 0/1 for bool, nearest-even for bf16).
pub fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size_bytes());
    for &x in values {
        match dtype {
            DType::Bool => out.push(u8::from(x != 0.0)),
            DType::U8 => out.push(x as i64 as u8),
            DType::I8 => out.push(x as i64 as i8 as u8),
            DType::I16 => out.extend_from_slice(&(x as i64 as i16).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(x as i64 as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&(x as i64).to_le_bytes()),
            // C++ conversions wrap; values past int64 (uint64's top half) convert directly.
            DType::U16 => out.extend_from_slice(&(x as i64 as u16).to_le_bytes()),
            DType::U32 => out.extend_from_slice(&(x as i64 as u32).to_le_bytes()),
            DType::U64 if x >= 2f64.powi(63) => out.extend_from_slice(&(x as u64).to_le_bytes()),
            DType::U64 => out.extend_from_slice(&(x as i64 as u64).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&x.to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&bf16_bits(x as f32).to_le_bytes()),
            DType::F16 | DType::C32 => panic!("float16 host values are not used by these tests"),
            // A real value as a complex element: imaginary part 0.
            DType::C64 => {
                out.extend_from_slice(&(x as f32).to_le_bytes());
                out.extend_from_slice(&0f32.to_le_bytes());
            }
            DType::C128 => {
                out.extend_from_slice(&x.to_le_bytes());
                out.extend_from_slice(&0f64.to_le_bytes());
            }
        }
    }
    out
}

fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x40;
    }
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// `dtype` bytes as f64 values.
pub fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(dtype.size_bytes())
        .map(|c| match dtype {
            DType::Bool => f64::from(u8::from(c[0] != 0)),
            DType::U8 => c[0] as f64,
            DType::I8 => c[0] as i8 as f64,
            DType::I16 => i16::from_le_bytes([c[0], c[1]]) as f64,
            DType::I32 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::I64 => i64::from_le_bytes(c.try_into().unwrap()) as f64,
            DType::U16 => u16::from_le_bytes([c[0], c[1]]) as f64,
            DType::U32 => u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::U64 => u64::from_le_bytes(c.try_into().unwrap()) as f64,
            DType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::F64 => f64::from_le_bytes(c.try_into().unwrap()),
            DType::BF16 => f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16) as f64,
            DType::F16 => panic!("float16 host values are not used by these tests"),
            DType::C32 | DType::C64 | DType::C128 => {
                panic!("complex values are read with decode_complex")
            }
        })
        .collect()
}

/// `x` rounded to what `dtype` holds.
pub fn round_to(dtype: DType, x: f64) -> f64 {
    decode(dtype, &encode(dtype, &[x]))[0]
}

/// A new contiguous tensor of `dtype` holding `values`.
pub fn upload(e: &Engine, dtype: DType, values: &[f64], sizes: &[i64]) -> TensorRef {
    assert_eq!(
        values.len() as i64,
        sizes.iter().product::<i64>(),
        "values for {sizes:?}"
    );
    let bytes = encode(dtype, values);
    let storage = e.new_storage(bytes.len() as u64);
    let t = TensorRef::contiguous(storage, dtype, sizes);
    e.write_host(&t, &bytes).expect("upload");
    t
}

pub fn upload_f32(e: &Engine, values: &[f32], sizes: &[i64]) -> TensorRef {
    let values: Vec<f64> = values.iter().map(|&v| v as f64).collect();
    upload(e, DType::F32, &values, sizes)
}

pub fn upload_i64(e: &Engine, values: &[i64], sizes: &[i64]) -> TensorRef {
    let values: Vec<f64> = values.iter().map(|&v| v as f64).collect();
    upload(e, DType::I64, &values, sizes)
}

/// Reads a tensor (materializing it) as f64 values.
pub fn read(e: &Engine, t: &TensorRef) -> Vec<f64> {
    let mut bytes = vec![0u8; t.numel() as usize * t.dtype.size_bytes()];
    e.read_host(t, &mut bytes).expect("read");
    decode(t.dtype, &bytes)
}

pub fn read_f32(e: &Engine, t: &TensorRef) -> Vec<f32> {
    assert_eq!(t.dtype, DType::F32);
    read(e, t).into_iter().map(|v| v as f32).collect()
}

pub fn read_i64(e: &Engine, t: &TensorRef) -> Vec<i64> {
    assert_eq!(t.dtype, DType::I64);
    read(e, t).into_iter().map(|v| v as i64).collect()
}

/// Runs an op through [`Engine::op`] (into `outs` when given).
pub fn try_op(
    e: &Engine,
    call: impl Call,
    inputs: &[TensorRef],
    scalars: &[ScalarArg],
    outs: &[TensorRef],
) -> Result<Captured, EngineError> {
    let call = call.encoded();
    e.op(call.op, inputs, scalars, &call.params, outs)
}

/// Runs an op with new outputs and returns every output as a tensor.
pub fn op_all(
    e: &Engine,
    call: impl Call,
    inputs: &[&TensorRef],
    scalars: &[ScalarArg],
) -> Vec<TensorRef> {
    let call = call.encoded();
    let inputs: Vec<TensorRef> = inputs.iter().map(|t| (*t).clone()).collect();
    let captured = e
        .op(call.op, &inputs, scalars, &call.params, &[])
        .unwrap_or_else(|err| panic!("{}: {}", call.op.name(), err.message));
    captured
        .outputs
        .iter()
        .map(|(storage, ty): &(StorageId, _)| TensorRef::contiguous(*storage, ty.dtype, &ty.shape))
        .collect()
}

/// Runs an op with new outputs and returns its first output as a tensor.
pub fn op(e: &Engine, call: impl Call, inputs: &[&TensorRef], scalars: &[ScalarArg]) -> TensorRef {
    op_all(e, call, inputs, scalars).swap_remove(0)
}

/// Drops a tensor's storage, as PyTorch does when its last reference goes away.
pub fn release(e: &Engine, t: TensorRef) {
    e.release_storage(t.storage).expect("release");
}

pub fn metric(e: &Engine, name: &str) -> f64 {
    *e.metrics()
        .values
        .get(name)
        .unwrap_or_else(|| panic!("no metric {name}"))
}

/// Deterministic pseudo-random numbers (splitmix64), so failures reproduce.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`, rounded to f32.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        (lo + (hi - lo) * unit) as f32 as f64
    }

    pub fn values(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// How close a result must be to the f64 reference: `ulps` units in the last place of `dtype`,
/// relative to the larger of the reference value and `scale` (the magnitude of the terms that
/// were combined: a reduction's error grows with the sum of its terms' magnitudes, not its result).
#[derive(Copy, Clone, Debug)]
pub struct Tol {
    pub ulps: f64,
    pub dtype: DType,
}

impl Tol {
    pub fn ulps(dtype: DType, ulps: f64) -> Tol {
        Tol { ulps, dtype }
    }

    pub fn exact() -> Tol {
        Tol {
            ulps: 0.0,
            dtype: DType::F64,
        }
    }

    fn epsilon(&self) -> f64 {
        match self.dtype {
            DType::F64 => f64::EPSILON,
            DType::F32 => f32::EPSILON as f64,
            DType::BF16 => 2f64.powi(-7),
            DType::F16 => 2f64.powi(-10),
            _ => 0.0,
        }
    }

    /// The largest accepted difference for reference `want` combined from terms of magnitude
    /// `scale`.
    pub fn allowed(&self, want: f64, scale: f64) -> f64 {
        let tiny = match self.dtype {
            DType::F32 => f32::MIN_POSITIVE as f64,
            _ => f64::MIN_POSITIVE,
        };
        self.ulps * self.epsilon() * want.abs().max(scale).max(tiny)
    }
}

/// Asserts element-wise agreement; NaNs must match NaNs and infinities must match exactly.
pub fn assert_close_scaled(what: &str, got: &[f64], want: &[f64], scale: &[f64], tol: Tol) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: {} values, expected {}",
        got.len(),
        want.len()
    );
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= tol.allowed(w, scale.get(i).copied().unwrap_or(0.0))
        };
        assert!(
            ok,
            "{what}: element {i} is {g:e}, expected {w:e} within {} ulps of {} (|diff| = {:e})\n\
             got:      {got:?}\nexpected: {want:?}",
            tol.ulps,
            tol.dtype.name(),
            (g - w).abs()
        );
    }
}

pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: Tol) {
    assert_close_scaled(what, got, want, &[], tol)
}
