//! Calls into the engine through its C ABI (`torch_glue::abi::tpjrt_*`), as the C++ plugin does.

use super::Call;
use std::ffi::{CStr, CString};
use std::sync::{Mutex, MutexGuard};
use torch_glue::abi::*;

/// An ABI failure: the status code and the thread's last error message.
#[derive(Clone, Debug, PartialEq)]
pub struct AbiError {
    pub code: i32,
    pub message: String,
}

/// Serializes tests of one binary that change the process-wide mode or read global metrics.
pub fn global_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn last_error() -> String {
    // SAFETY: the ABI returns a valid NUL-terminated string owned by this thread.
    unsafe { CStr::from_ptr(tpjrt_last_error()) }
        .to_string_lossy()
        .into_owned()
}

pub fn check(code: i32) -> Result<(), AbiError> {
    if code == TPJRT_OK {
        Ok(())
    } else {
        Err(AbiError {
            code,
            message: last_error(),
        })
    }
}

pub fn init() {
    // SAFETY: a NULL plugin means "from the environment".
    check(unsafe { tpjrt_init(std::ptr::null()) }).expect("tpjrt_init");
}

pub fn op_id(name: &str) -> i32 {
    let name = CString::new(name).unwrap();
    let mut id = -1;
    // SAFETY: valid string and output.
    check(unsafe { tpjrt_op_id(name.as_ptr(), &mut id) }).expect("tpjrt_op_id");
    id
}

/// A tensor description that owns its size and stride arrays.
#[derive(Clone, Debug)]
pub struct AbiTensor {
    pub storage: u64,
    pub dtype: i32,
    pub sizes: Vec<i64>,
    pub strides: Vec<i64>,
    pub offset: i64,
}

impl AbiTensor {
    pub fn contiguous(storage: u64, dtype: i32, sizes: &[i64]) -> AbiTensor {
        let mut strides = vec![1i64; sizes.len()];
        for i in (0..sizes.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * sizes[i + 1].max(1);
        }
        AbiTensor {
            storage,
            dtype,
            sizes: sizes.to_vec(),
            strides,
            offset: 0,
        }
    }

    pub fn numel(&self) -> i64 {
        self.sizes.iter().product()
    }

    /// The C view of this tensor (borrows its arrays).
    pub fn raw(&self) -> TpjrtTensor {
        TpjrtTensor {
            storage: self.storage,
            dtype: self.dtype,
            ndim: self.sizes.len() as i32,
            sizes: self.sizes.as_ptr(),
            strides: self.strides.as_ptr(),
            offset: self.offset,
        }
    }

    pub fn from_output(out: &TpjrtOutput) -> AbiTensor {
        AbiTensor::contiguous(out.storage, out.dtype, &out.sizes[..out.ndim as usize])
    }
}

pub const F32: i32 = 6;
pub const I64: i32 = 4;
pub const F64: i32 = 7;

pub fn scalar_float(x: f64) -> TpjrtScalar {
    TpjrtScalar {
        kind: TPJRT_SCALAR_FLOAT,
        tensor_dtype: -1,
        int_value: 0,
        float_value: x,
    }
}

pub fn scalar_int(i: i64) -> TpjrtScalar {
    TpjrtScalar {
        kind: TPJRT_SCALAR_INT,
        tensor_dtype: -1,
        int_value: i,
        float_value: 0.0,
    }
}

pub fn storage_new(nbytes: u64) -> u64 {
    let mut id = 0;
    // SAFETY: valid output.
    check(unsafe { tpjrt_storage_new(nbytes, &mut id) }).expect("tpjrt_storage_new");
    id
}

pub fn write(t: &AbiTensor, bytes: &[u8]) -> Result<(), AbiError> {
    let raw = t.raw();
    // SAFETY: `raw` borrows `t`; `bytes` is readable.
    check(unsafe { tpjrt_write_host(&raw, bytes.as_ptr().cast(), bytes.len() as u64) })
}

pub fn read_bytes(t: &AbiTensor, nbytes: usize) -> Result<Vec<u8>, AbiError> {
    let raw = t.raw();
    let mut bytes = vec![0u8; nbytes];
    // SAFETY: `raw` borrows `t`; `bytes` is writable.
    check(unsafe { tpjrt_read_host(&raw, bytes.as_mut_ptr().cast(), nbytes as u64) })?;
    Ok(bytes)
}

pub fn upload_f32(values: &[f32], sizes: &[i64]) -> AbiTensor {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let t = AbiTensor::contiguous(storage_new(bytes.len() as u64), F32, sizes);
    write(&t, &bytes).expect("tpjrt_write_host");
    t
}

pub fn upload_i64(values: &[i64], sizes: &[i64]) -> AbiTensor {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let t = AbiTensor::contiguous(storage_new(bytes.len() as u64), I64, sizes);
    write(&t, &bytes).expect("tpjrt_write_host");
    t
}

pub fn read_f32(t: &AbiTensor) -> Result<Vec<f32>, AbiError> {
    Ok(read_bytes(t, t.numel() as usize * 4)?
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

pub fn release(t: &AbiTensor) -> Result<(), AbiError> {
    check(tpjrt_storage_release(t.storage))
}

/// Calls `tpjrt_op` with an op code and params as given, unchecked, with room for `room`
/// outputs; returns the outputs written. For tests of the ABI's errors: every other call names
/// its op and params through [`op`] and [`op1`].
pub fn op_raw(
    op: i32,
    inputs: &[&AbiTensor],
    scalars: &[TpjrtScalar],
    params: &[i64],
    outs: &[&AbiTensor],
    room: usize,
) -> Result<Vec<TpjrtOutput>, AbiError> {
    let raw_inputs: Vec<TpjrtTensor> = inputs.iter().map(|t| t.raw()).collect();
    let raw_outs: Vec<TpjrtTensor> = outs.iter().map(|t| t.raw()).collect();
    let call = TpjrtOpCall {
        op,
        inputs: raw_inputs.as_ptr(),
        num_inputs: raw_inputs.len() as u64,
        scalars: scalars.as_ptr(),
        num_scalars: scalars.len() as u64,
        params: params.as_ptr(),
        num_params: params.len() as u64,
        outs: raw_outs.as_ptr(),
        num_outs: raw_outs.len() as u64,
        default_float: -1,
        matmul_precision: 0,
        device: 0,
    };
    let mut outputs: Vec<TpjrtOutput> = (0..room)
        .map(|_| TpjrtOutput {
            storage: 0,
            dtype: -1,
            ndim: 0,
            sizes: [0; TPJRT_MAX_DIMS],
            nbytes: 0,
        })
        .collect();
    let mut n = 0u64;
    // SAFETY: every pointer borrows a live vector of the stated length.
    check(unsafe { tpjrt_op(&call, outputs.as_mut_ptr(), room as u64, &mut n) })?;
    outputs.truncate(n as usize);
    Ok(outputs)
}

/// The ABI's code for `op`, looked up by its name (`tpjrt_op_id`).
pub fn code_of(op: ops::OpId) -> i32 {
    op_id(op.name())
}

/// Calls `tpjrt_op` with room for `room` outputs; returns the outputs written.
pub fn op_room(
    call: impl Call,
    inputs: &[&AbiTensor],
    scalars: &[TpjrtScalar],
    outs: &[&AbiTensor],
    room: usize,
) -> Result<Vec<TpjrtOutput>, AbiError> {
    let call = call.encoded();
    op_raw(code_of(call.op), inputs, scalars, &call.params, outs, room)
}

pub fn op(
    call: impl Call,
    inputs: &[&AbiTensor],
    scalars: &[TpjrtScalar],
) -> Result<Vec<TpjrtOutput>, AbiError> {
    op_room(call, inputs, scalars, &[], 4)
}

/// The first output of a successful op, as a tensor.
pub fn op1(call: impl Call, inputs: &[&AbiTensor], scalars: &[TpjrtScalar]) -> AbiTensor {
    let call = call.encoded();
    let name = call.op.name();
    let outs = op(call, inputs, scalars).unwrap_or_else(|e| panic!("{name} failed: {e:?}"));
    AbiTensor::from_output(&outs[0])
}

/// The metrics as JSON text.
pub fn metrics_json() -> String {
    let mut len = 0u64;
    // SAFETY: a null buffer asks only for the length.
    check(unsafe { tpjrt_metrics_json(std::ptr::null_mut(), 0, &mut len) }).expect("metrics");
    let mut buffer = vec![0u8; len as usize + 1];
    // SAFETY: `buffer` has room for `len + 1` bytes.
    check(unsafe { tpjrt_metrics_json(buffer.as_mut_ptr().cast(), buffer.len() as u64, &mut len) })
        .expect("metrics");
    buffer.truncate(len as usize);
    String::from_utf8(buffer).expect("utf-8 metrics")
}

/// One numeric metric from the JSON text.
pub fn metric(name: &str) -> f64 {
    let json = metrics_json();
    let key = format!("\"{name}\":");
    let start = json
        .find(&key)
        .unwrap_or_else(|| panic!("no metric {name} in {json}"))
        + key.len();
    let rest = &json[start..];
    let end = rest.find([',', '}']).unwrap();
    rest[..end]
        .parse()
        .unwrap_or_else(|_| panic!("metric {name} in {json}"))
}

/// Runs `f` with `mode` (0 strict, 1 debug, 2 defer_and_fuse) pushed on the global stack.
pub fn with_mode<T>(mode: i32, f: impl FnOnce() -> T) -> T {
    check(tpjrt_mode_push(mode)).expect("mode push");
    let out = f();
    check(tpjrt_mode_pop()).expect("mode pop");
    out
}
