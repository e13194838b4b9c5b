//! Runs ops on the XLA CPU PJRT plugin for value tests: host encoding, batching, comparison.
#![allow(dead_code)]

use ops::{
    emitter::float_bits, meta, DType, Emitter, OpId, ScalarArg, ScalarValue, TensorType, Value,
};
use std::sync::OnceLock;

pub fn client() -> &'static pjrt::Client {
    static CLIENT: OnceLock<pjrt::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let plugin = pjrt::Plugin::load("cpu").expect("load the XLA CPU PJRT plugin");
        pjrt::Client::new(&plugin).expect("create a PJRT client")
    })
}

pub fn element_type(d: DType) -> pjrt::ElementType {
    use pjrt::ElementType as E;
    match d {
        DType::Bool => E::Pred,
        DType::U8 => E::U8,
        DType::U16 => E::U16,
        DType::U32 => E::U32,
        DType::U64 => E::U64,
        DType::I8 => E::S8,
        DType::I16 => E::S16,
        DType::I32 => E::S32,
        DType::I64 => E::S64,
        DType::F16 => E::F16,
        DType::BF16 => E::BF16,
        DType::F32 => E::F32,
        DType::F64 => E::F64,
        // complex32's device values are complex64.
        DType::C32 | DType::C64 => E::C64,
        DType::C128 => E::C128,
    }
}

/// Round `x` to what `dtype` can hold (C++ conversion semantics for ints; 0/1 for bool).
pub fn round_to(dtype: DType, x: f64) -> f64 {
    decode(dtype, &encode(dtype, &[x]))[0]
}

pub fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size_bytes());
    for &x in values {
        match dtype {
            DType::Bool => out.push((x != 0.0) as u8),
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
            DType::F16 | DType::BF16 => {
                out.extend_from_slice(&(float_bits(dtype, x) as u16).to_le_bytes())
            }
            DType::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&x.to_le_bytes()),
            // A real value as a complex element: imaginary part 0 (complex32 as on the device).
            DType::C32 | DType::C64 => {
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

fn f16_to_f64(h: u16) -> f64 {
    let sign = if h >> 15 == 1 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let man = (h & 0x3ff) as f64;
    match exp {
        0 => sign * man * 2f64.powi(-24),
        31 if man == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        _ => sign * (1.0 + man / 1024.0) * 2f64.powi(exp - 15),
    }
}

pub fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    let n = dtype.size_bytes();
    bytes
        .chunks_exact(n)
        .map(|c| match dtype {
            DType::Bool => (c[0] != 0) as i64 as f64,
            DType::U8 => c[0] as f64,
            DType::I8 => c[0] as i8 as f64,
            DType::I16 => i16::from_le_bytes([c[0], c[1]]) as f64,
            DType::I32 => i32::from_le_bytes(c.try_into().unwrap()) as f64,
            DType::I64 => i64::from_le_bytes(c.try_into().unwrap()) as f64,
            DType::U16 => u16::from_le_bytes([c[0], c[1]]) as f64,
            DType::U32 => u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::U64 => u64::from_le_bytes(c.try_into().unwrap()) as f64,
            DType::F16 => f16_to_f64(u16::from_le_bytes([c[0], c[1]])),
            DType::BF16 => f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16) as f64,
            DType::F32 => f32::from_le_bytes(c.try_into().unwrap()) as f64,
            DType::F64 => f64::from_le_bytes(c.try_into().unwrap()),
            DType::C32 | DType::C64 | DType::C128 => {
                panic!("complex values are read with decode_complex")
            }
        })
        .collect()
}

/// A host tensor: its type and row-major values (as f64).
#[derive(Clone, Debug)]
pub struct Host {
    pub ty: TensorType,
    pub data: Vec<f64>,
}

impl Host {
    /// Values are rounded to the dtype, so references see exactly what the device sees.
    pub fn new(dtype: DType, shape: &[i64], data: &[f64]) -> Self {
        let ty = TensorType::new(dtype, shape);
        assert_eq!(ty.numel() as usize, data.len(), "data length for {ty}");
        Host {
            data: data.iter().map(|&x| round_to(dtype, x)).collect(),
            ty,
        }
    }

    /// Deterministic pseudo-random values in `[lo, hi)`.
    pub fn random(dtype: DType, shape: &[i64], lo: f64, hi: f64, seed: u64) -> Self {
        let n = shape.iter().product::<i64>() as usize;
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let data: Vec<f64> = (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (state >> 11) as f64 / (1u64 << 53) as f64;
                let x = lo + (hi - lo) * u;
                if dtype.is_float() {
                    x
                } else {
                    x.floor()
                }
            })
            .collect();
        Host::new(dtype, shape, &data)
    }
}

/// One op application to run on the device.
#[derive(Clone, Debug)]
pub struct Case {
    pub op: OpId,
    pub inputs: Vec<Host>,
    pub scalars: Vec<ScalarArg>,
    pub params: Vec<i64>,
}

impl Case {
    pub fn new(op: OpId, inputs: Vec<Host>, scalars: Vec<ScalarArg>, params: Vec<i64>) -> Self {
        Case {
            op,
            inputs,
            scalars,
            params,
        }
    }
}

fn scalar_f64(v: ScalarValue) -> f64 {
    v.as_f64()
}

/// Run many cases in one module (one compile); returns each case's outputs.
pub fn run_batch(cases: &[Case]) -> Vec<Vec<Host>> {
    let mut e = Emitter::new();
    let mut host_args: Vec<Host> = Vec::new();
    let mut results: Vec<Value> = Vec::new();
    let mut per_case = Vec::new();
    for c in cases {
        let in_types: Vec<TensorType> = c.inputs.iter().map(|h| h.ty.clone()).collect();
        let m = meta(c.op, &in_types, &c.scalars, &c.params)
            .unwrap_or_else(|err| panic!("meta of {:?}: {}", c, err));
        let inputs: Vec<Value> = c
            .inputs
            .iter()
            .map(|h| {
                host_args.push(h.clone());
                e.argument(h.ty.clone())
            })
            .collect();
        let scalars: Vec<Value> = c
            .scalars
            .iter()
            .zip(&m.scalar_dtypes)
            .map(|(s, &d)| {
                host_args.push(Host::new(d, &[], &[scalar_f64(s.value)]));
                e.argument(TensorType::scalar(d))
            })
            .collect();
        let outs = ops::lower(c.op, &mut e, &inputs, &scalars, &c.params, &m)
            .unwrap_or_else(|err| panic!("lower of {:?}: {}", c, err));
        per_case.push(outs.len());
        results.extend(outs);
    }
    let text = e.finish(&results);
    let client = client();
    let exe = client
        .compile(&text)
        .unwrap_or_else(|err| panic!("compile failed: {err}\n{text}"));
    let buffers: Vec<pjrt::Buffer> = host_args
        .iter()
        .map(|h| {
            client
                .buffer_from_host(
                    &encode(h.ty.dtype, &h.data),
                    element_type(h.ty.dtype),
                    &h.ty.shape,
                )
                .expect("upload")
        })
        .collect();
    let refs: Vec<&pjrt::Buffer> = buffers.iter().collect();
    let outs = exe.execute(&refs).expect("execute");
    let mut outs = outs.into_iter();
    let mut result_types = Vec::new();
    for c in cases {
        let in_types: Vec<TensorType> = c.inputs.iter().map(|h| h.ty.clone()).collect();
        result_types.push(
            meta(c.op, &in_types, &c.scalars, &c.params)
                .unwrap()
                .outputs,
        );
    }
    result_types
        .into_iter()
        .map(|types| {
            types
                .into_iter()
                .map(|ty| {
                    let buf = outs.next().expect("an output per result");
                    let bytes = buf.to_host().expect("download");
                    Host {
                        data: decode(ty.dtype, &bytes),
                        ty,
                    }
                })
                .collect()
        })
        .collect()
}

/// Tolerances per dtype: (relative, absolute).
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-12, 1e-12),
        DType::F32 => (2e-6, 1e-6),
        DType::F16 => (2e-3, 1e-4),
        DType::BF16 => (1.6e-2, 1e-3),
        _ => (0.0, 0.0),
    }
}

pub fn close(got: f64, want: f64, rtol: f64, atol: f64) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    if got.is_infinite() || want.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= atol + rtol * want.abs()
}

/// Check `got` against `want` elementwise; returns a description of the first mismatches.
pub fn compare(
    label: &str,
    got: &Host,
    want_ty: &TensorType,
    want: &[f64],
    scale: f64,
) -> Result<(), String> {
    if &got.ty != want_ty {
        return Err(format!("{label}: type {} != expected {}", got.ty, want_ty));
    }
    let (rtol, atol) = tolerance(got.ty.dtype);
    let (rtol, atol) = (rtol * scale, atol * scale);
    let bad: Vec<String> = got
        .data
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| !close(**g, **w, rtol, atol))
        .take(5)
        .map(|(i, (g, w))| format!("[{i}] got {g} want {w}"))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("{label}: {}", bad.join(", ")))
    }
}

/// Panic with every failure, if any.
pub fn report(failures: Vec<String>) {
    if !failures.is_empty() {
        panic!(
            "{} value mismatches:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}
