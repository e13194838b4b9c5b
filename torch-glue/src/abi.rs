//! The C ABI: the only way the C++ PrivateUse1 plugin (or any C program) reaches the engine.
//!
//! Every function returns a status code (`TPJRT_OK` or the Python exception class of the
//! error), sets a thread-local message readable with `tpjrt_last_error`, and never lets a panic
//! cross into the caller.

use crate::global;
use defer::{EngineError, ErrorKind, Mode, StorageId, TensorRef};
use ops::{DType, OpId, ScalarArg, ScalarValue, Shape};
use smallvec::SmallVec;
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Success.
pub const TPJRT_OK: i32 = 0;
/// Maps to Python's `RuntimeError`.
pub const TPJRT_RUNTIME_ERROR: i32 = 1;
/// Maps to `ValueError`.
pub const TPJRT_VALUE_ERROR: i32 = 2;
/// Maps to `TypeError`.
pub const TPJRT_TYPE_ERROR: i32 = 3;
/// Maps to `NotImplementedError`.
pub const TPJRT_NOT_IMPLEMENTED: i32 = 4;
/// Maps to `IndexError`.
pub const TPJRT_INDEX_ERROR: i32 = 5;

/// The most dimensions an output description carries (views of many size-1 dims reach past 16).
pub const TPJRT_MAX_DIMS: usize = 64;

/// Scalar kinds of `TpjrtScalar::kind`.
pub const TPJRT_SCALAR_BOOL: i32 = 0;
pub const TPJRT_SCALAR_INT: i32 = 1;
pub const TPJRT_SCALAR_FLOAT: i32 = 2;

/// A tensor: a strided window `(sizes, strides, offset)` in elements of `dtype` on `storage`.
/// `dtype` is PyTorch's ScalarType code.
#[repr(C)]
pub struct TpjrtTensor {
    pub storage: u64,
    pub dtype: i32,
    pub ndim: i32,
    pub sizes: *const i64,
    pub strides: *const i64,
    pub offset: i64,
}

/// A value scalar: a Python number (`tensor_dtype` = -1) or a CPU 0-d tensor of that dtype.
#[repr(C)]
pub struct TpjrtScalar {
    pub kind: i32,
    pub tensor_dtype: i32,
    pub int_value: i64,
    pub float_value: f64,
}

/// One op call. `outs` (may be empty) are existing destination tensors for in-place and `out=`
/// variants; without them the engine creates new storages.
#[repr(C)]
pub struct TpjrtOpCall {
    pub op: i32,
    pub inputs: *const TpjrtTensor,
    pub num_inputs: u64,
    pub scalars: *const TpjrtScalar,
    pub num_scalars: u64,
    pub params: *const i64,
    pub num_params: u64,
    pub outs: *const TpjrtTensor,
    pub num_outs: u64,
    /// PyTorch's default float dtype (`torch.get_default_dtype()`) as the op is called, a dtype
    /// code; -1 or 0 (a zero-initialized call: uint8 is never a default float dtype) mean
    /// float32. Integer inputs of float ops, and Python floats, take it.
    pub default_float: i32,
    /// PyTorch's float32 product precision (`torch.get_float32_matmul_precision()`) as the op
    /// is called: 0 `"highest"` (also a zero-initialized call), 1 `"high"`, 2 `"medium"`.
    pub matmul_precision: i32,
    /// The device the op runs on (`pjrt:device`; 0 in a zero-initialized call): its tensors
    /// must all be there, and the storages it makes are.
    pub device: i32,
}

/// One result of an op: its storage (0 from `tpjrt_op_meta`), dtype and contiguous sizes.
#[repr(C)]
pub struct TpjrtOutput {
    pub storage: u64,
    pub dtype: i32,
    pub ndim: i32,
    pub sizes: [i64; TPJRT_MAX_DIMS],
    pub nbytes: u64,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let clean: String = message.chars().filter(|&c| c != '\0').collect();
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::new(clean).unwrap_or_default());
}

fn code_of(kind: ErrorKind) -> i32 {
    match kind {
        ErrorKind::Runtime => TPJRT_RUNTIME_ERROR,
        ErrorKind::Value => TPJRT_VALUE_ERROR,
        ErrorKind::Type => TPJRT_TYPE_ERROR,
        ErrorKind::NotImplemented => TPJRT_NOT_IMPLEMENTED,
        ErrorKind::Index => TPJRT_INDEX_ERROR,
    }
}

/// Runs `f`, turning errors and panics into a status code and the thread's last error.
fn guarded(f: impl FnOnce() -> Result<(), EngineError>) -> i32 {
    let ran = catch_unwind(AssertUnwindSafe(f));
    if crate::recompile::awaits_location_here() {
        // Every engine lock is released now: the hook may take Python's interpreter lock.
        let _ = catch_unwind(|| {
            if let Some(engine) = global::running() {
                engine.locate_recompiles(user_location);
            }
        });
    }
    match ran {
        Ok(Ok(())) => TPJRT_OK,
        Ok(Err(e)) => {
            set_last_error(&e.message);
            code_of(e.kind)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            let stopped = global::running().is_some_and(|engine| engine.stopped().is_some());
            set_last_error(&if stopped {
                format!(
                    "internal error in the torch-pjrt engine: {what}. It left the engine's state \
                     half-updated, so the engine has stopped: pjrt tensors can no longer be used \
                     in this process. Restart the process, and please report this with the code \
                     that triggered it"
                )
            } else {
                format!(
                    "internal error in the torch-pjrt engine: {what}. The engine is still usable; \
                     please report this with the code that triggered it"
                )
            });
            TPJRT_RUNTIME_ERROR
        }
    }
}

/// Writes the user's current Python `file:line` into a buffer of the given capacity and
/// returns its length (0: none known). Installed by the Python package.
pub type TpjrtLocationHook = unsafe extern "C" fn(*mut c_char, u64) -> u64;

static LOCATION_HOOK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn user_location() -> Option<String> {
    let hook = LOCATION_HOOK.load(std::sync::atomic::Ordering::Acquire);
    if hook == 0 {
        return None;
    }
    // SAFETY: only `tpjrt_set_location_hook` stores here, and it stores a function pointer.
    let hook: TpjrtLocationHook = unsafe { std::mem::transmute::<usize, TpjrtLocationHook>(hook) };
    let mut buffer = vec![0u8; 512];
    // SAFETY: the hook writes at most `capacity` bytes into the buffer.
    let len = unsafe { hook(buffer.as_mut_ptr().cast(), buffer.len() as u64) } as usize;
    if len == 0 || len > buffer.len() {
        return None;
    }
    buffer.truncate(len);
    Some(String::from_utf8_lossy(&buffer).into_owned())
}

/// Installs (or, with NULL, removes) the function that names the user's Python line in a
/// recompile's reason. It is called only after a recompile, with no engine lock held.
#[no_mangle]
pub extern "C" fn tpjrt_set_location_hook(hook: Option<TpjrtLocationHook>) -> i32 {
    LOCATION_HOOK.store(
        hook.map_or(0, |h| h as usize),
        std::sync::atomic::Ordering::Release,
    );
    TPJRT_OK
}

/// Enters a recompile budget: while it is active, a compile past `limit` recompiles fails with
/// its explanation (`warn` != 0: prints a warning instead).
#[no_mangle]
pub extern "C" fn tpjrt_recompile_limit_push(limit: u64, warn: i32) -> i32 {
    guarded(|| {
        let action = if warn != 0 {
            crate::recompile::BudgetAction::Warn
        } else {
            crate::recompile::BudgetAction::Raise
        };
        global::engine()?.push_recompile_limit(crate::recompile::Budget { limit, action });
        Ok(())
    })
}

/// Leaves the innermost recompile budget.
#[no_mangle]
pub extern "C" fn tpjrt_recompile_limit_pop() -> i32 {
    guarded(|| global::engine()?.pop_recompile_limit())
}

fn invalid(message: String) -> EngineError {
    EngineError::runtime(message)
}

/// # Safety
/// `ptr` must point to `len` readable values, or `len` must be 0.
unsafe fn slice<'a, T>(ptr: *const T, len: u64) -> Result<&'a [T], EngineError> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(invalid(format!(
            "a null pointer was passed for {len} elements"
        )));
    }
    Ok(std::slice::from_raw_parts(ptr, len as usize))
}

fn dtype(code: i32) -> Result<DType, EngineError> {
    DType::from_code(code).ok_or_else(|| {
        EngineError::new(
            ErrorKind::Type,
            format!(
                "dtype code {code} is not supported on pjrt; supported: float64, float32, \
                 float16, bfloat16, int64, int32, int16, int8, uint64, uint32, uint16, uint8, \
                 bool, complex32, complex64, complex128"
            ),
        )
    })
}

/// # Safety
/// `t` must describe valid size/stride arrays of `ndim` elements.
#[inline(always)]
unsafe fn tensor_ref(t: &TpjrtTensor) -> Result<TensorRef, EngineError> {
    if t.ndim < 0 {
        return Err(invalid(format!("a tensor with ndim {} was passed", t.ndim)));
    }
    let sizes = slice(t.sizes, t.ndim as u64)?;
    let strides = slice(t.strides, t.ndim as u64)?;
    Ok(TensorRef {
        storage: StorageId(t.storage),
        dtype: dtype(t.dtype)?,
        sizes: Shape::from_slice(sizes),
        strides: SmallVec::from_slice(strides),
        offset: t.offset,
    })
}

fn scalar(s: &TpjrtScalar) -> Result<ScalarArg, EngineError> {
    let value = match s.kind {
        TPJRT_SCALAR_BOOL => ScalarValue::Bool(s.int_value != 0),
        TPJRT_SCALAR_INT => ScalarValue::Int(s.int_value),
        TPJRT_SCALAR_FLOAT => ScalarValue::Float(s.float_value),
        other => {
            return Err(invalid(format!(
                "scalar kind {other} is unknown: expected 0 (bool), 1 (int) or 2 (float)"
            )))
        }
    };
    Ok(ScalarArg {
        value,
        tensor_dtype: if s.tensor_dtype < 0 {
            None
        } else {
            Some(dtype(s.tensor_dtype)?)
        },
    })
}

/// Inline lists sized for common ops: decoding runs on every op call.
struct DecodedCall {
    op: OpId,
    inputs: SmallVec<[TensorRef; 3]>,
    scalars: SmallVec<[ScalarArg; 4]>,
    params: SmallVec<[i64; 8]>,
    outs: SmallVec<[TensorRef; 1]>,
    default_float: DType,
    matmul_precision: ops::Precision,
    device: i32,
}

/// # Safety
/// `call` must be a valid call description.
/// Inlined: the decoded call is large, and built in the caller's frame it is not copied out.
#[inline(always)]
unsafe fn decode(call: *const TpjrtOpCall) -> Result<DecodedCall, EngineError> {
    let call = call
        .as_ref()
        .ok_or_else(|| invalid("a null op call was passed".into()))?;
    let op = u16::try_from(call.op)
        .ok()
        .and_then(OpId::from_u16)
        .ok_or_else(|| {
            EngineError::new(
                ErrorKind::NotImplemented,
                format!(
                    "op id {} is not an op of this engine (it knows {} ops); look ids up with \
                     tpjrt_op_id",
                    call.op,
                    OpId::ALL.len()
                ),
            )
        })?;
    let default_float = match call.default_float {
        -1 | 0 => DType::F32,
        code => match dtype(code)? {
            d if d.is_float() => d,
            d => {
                return Err(EngineError::new(
                    ErrorKind::Type,
                    format!(
                        "the default dtype must be a floating point dtype, got {}",
                        d.name()
                    ),
                ))
            }
        },
    };
    let matmul_precision = ops::Precision::from_code(call.matmul_precision).ok_or_else(|| {
        invalid(format!(
            "matmul precision code {} is not one of 0 (highest), 1 (high), 2 (medium)",
            call.matmul_precision
        ))
    })?;
    // Pushed one by one: collecting into a `Result` moves each (large) tensor record twice.
    let mut decoded = DecodedCall {
        default_float,
        matmul_precision,
        device: call.device,
        op,
        inputs: SmallVec::new(),
        scalars: SmallVec::new(),
        params: SmallVec::from_slice(slice(call.params, call.num_params)?),
        outs: SmallVec::new(),
    };
    for t in slice(call.inputs, call.num_inputs)? {
        decoded.inputs.push(tensor_ref(t)?);
    }
    for s in slice(call.scalars, call.num_scalars)? {
        decoded.scalars.push(scalar(s)?);
    }
    for t in slice(call.outs, call.num_outs)? {
        decoded.outs.push(tensor_ref(t)?);
    }
    Ok(decoded)
}

fn write_outputs(
    results: &[(StorageId, ops::TensorType)],
    outputs: *mut TpjrtOutput,
    max_outputs: u64,
    num_outputs: *mut u64,
) -> Result<(), EngineError> {
    if !num_outputs.is_null() {
        // SAFETY: the caller passed a writable u64.
        unsafe { *num_outputs = results.len() as u64 };
    }
    if results.len() as u64 > max_outputs {
        return Err(invalid(format!(
            "the op has {} outputs but room for {max_outputs} was passed",
            results.len()
        )));
    }
    if results.is_empty() {
        return Ok(());
    }
    if outputs.is_null() {
        return Err(invalid("a null outputs array was passed".into()));
    }
    for (i, (storage, ty)) in results.iter().enumerate() {
        if ty.shape.len() > TPJRT_MAX_DIMS {
            return Err(invalid(format!(
                "a result of {} dimensions exceeds the ABI's {TPJRT_MAX_DIMS}",
                ty.shape.len()
            )));
        }
        let mut sizes = [0i64; TPJRT_MAX_DIMS];
        sizes[..ty.shape.len()].copy_from_slice(&ty.shape);
        // SAFETY: the caller passed room for `max_outputs` outputs.
        unsafe {
            *outputs.add(i) = TpjrtOutput {
                storage: storage.0,
                dtype: ty.dtype.code(),
                ndim: ty.shape.len() as i32,
                sizes,
                nbytes: ty.nbytes(),
            };
        }
    }
    Ok(())
}

/// Starts the engine if it is not running: `plugin` is `cpu`, `cuda`, `tpu` or a path (NULL:
/// `TORCH_PJRT_PLUGIN`, default `cpu`). Configuration errors are reported here.
///
/// # Safety
/// `plugin` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_init(plugin: *const c_char) -> i32 {
    guarded(|| {
        let plugin = if plugin.is_null() {
            None
        } else {
            Some(CStr::from_ptr(plugin).to_string_lossy().into_owned())
        };
        global::init(plugin.as_deref()).map(|_| ())
    })
}

/// The message of this thread's last error (valid until the thread's next failing call).
#[no_mangle]
pub extern "C" fn tpjrt_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The name of the Python exception class a status code maps to (`"ValueError"`, …;
/// `"RuntimeError"` for a code it does not know), a static NUL-terminated string. The
/// bindings take the mapping from here rather than keeping a table of their own.
#[no_mangle]
pub extern "C" fn tpjrt_error_class(code: i32) -> *const c_char {
    let name: &'static CStr = match code {
        TPJRT_VALUE_ERROR => c"ValueError",
        TPJRT_TYPE_ERROR => c"TypeError",
        TPJRT_NOT_IMPLEMENTED => c"NotImplementedError",
        TPJRT_INDEX_ERROR => c"IndexError",
        _ => c"RuntimeError",
    };
    name.as_ptr()
}

/// Looks up an op id by its ATen name (e.g. "add", "_to_copy").
///
/// # Safety
/// `name` must be a NUL-terminated string; `id` a writable int.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_op_id(name: *const c_char, id: *mut i32) -> i32 {
    guarded(|| {
        if name.is_null() || id.is_null() {
            return Err(invalid("tpjrt_op_id: null argument".into()));
        }
        let name = CStr::from_ptr(name).to_string_lossy();
        let op = OpId::from_name(&name).ok_or_else(|| {
            EngineError::not_implemented(format!(
                "the op '{name}' is not supported by the pjrt engine"
            ))
        })?;
        *id = op.id() as i32;
        Ok(())
    })
}

/// A new storage of `nbytes` bytes (unwritten: reads as zeros).
///
/// # Safety
/// `storage` must be a writable u64.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_storage_new(nbytes: u64, storage: *mut u64) -> i32 {
    guarded(|| {
        let engine = global::engine()?;
        if storage.is_null() {
            return Err(invalid("tpjrt_storage_new: null output".into()));
        }
        *storage = engine.new_storage(nbytes).0;
        Ok(())
    })
}

/// A new storage of `nbytes` bytes on device `device` (`pjrt:device`; unwritten: reads as
/// zeros).
///
/// # Safety
/// `storage` must be a writable u64.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_storage_new_on(nbytes: u64, device: i32, storage: *mut u64) -> i32 {
    guarded(|| {
        let engine = global::engine()?;
        if storage.is_null() {
            return Err(invalid("tpjrt_storage_new_on: null output".into()));
        }
        *storage = engine.new_storage_on(nbytes, device)?.0;
        Ok(())
    })
}

/// The PJRT device id of the buffer that holds a storage's value, once computed (-1: never
/// written). Launches what is pending first; for tests and debugging.
///
/// # Safety
/// `device` must be a writable int.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_storage_device(storage: u64, device: *mut i32) -> i32 {
    guarded(|| {
        if device.is_null() {
            return Err(invalid("tpjrt_storage_device: null output".into()));
        }
        *device = global::engine()?
            .storage_device(StorageId(storage))?
            .unwrap_or(-1);
        Ok(())
    })
}

/// Copies whole contiguous tensor `src` into `dst`, a tensor of the same dtype and sizes on
/// another device.
///
/// # Safety
/// `src` and `dst` must be valid.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_copy_to_device(
    src: *const TpjrtTensor,
    dst: *const TpjrtTensor,
) -> i32 {
    guarded(|| {
        let engine = global::engine()?;
        let src = tensor_ref(src.as_ref().ok_or_else(|| invalid("null tensor".into()))?)?;
        let dst = tensor_ref(dst.as_ref().ok_or_else(|| invalid("null tensor".into()))?)?;
        engine.copy_to_device(&src, &dst)
    })
}

/// Runs a collective over `num_inputs` whole contiguous tensors, one per device, as one
/// replicated program: `kind` 0 all_reduce, 1 all_gather, 2 reduce_scatter; `reduction` 0 sum,
/// 1 product, 2 max, 3 min; `dim` the gathered or scattered dimension. Writes each device's
/// result storage to `outputs` (room for `num_inputs`), in the order of the inputs.
///
/// # Safety
/// `inputs` must hold `num_inputs` valid tensors; `outputs` room for as many u64s.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_collective(
    kind: i32,
    reduction: i32,
    dim: i64,
    inputs: *const TpjrtTensor,
    num_inputs: u64,
    outputs: *mut u64,
) -> i32 {
    guarded(|| {
        let engine = global::engine()?;
        let collective = crate::engine::Collective::from_codes(kind, reduction, dim)?;
        let mut tensors = Vec::with_capacity(num_inputs as usize);
        for t in slice(inputs, num_inputs)? {
            tensors.push(tensor_ref(t)?);
        }
        if outputs.is_null() {
            return Err(invalid("tpjrt_collective: null outputs".into()));
        }
        let made = engine.collective(collective, &tensors)?;
        for (i, storage) in made.into_iter().enumerate() {
            *outputs.add(i) = storage.0;
        }
        Ok(())
    })
}

/// Releases a storage (PyTorch dropped its last reference).
#[no_mangle]
pub extern "C" fn tpjrt_storage_release(storage: u64) -> i32 {
    guarded(|| global::engine()?.release_storage(StorageId(storage)))
}

/// Changes a storage's byte size.
#[no_mangle]
pub extern "C" fn tpjrt_storage_resize(storage: u64, nbytes: u64) -> i32 {
    guarded(|| global::engine()?.resize_storage(StorageId(storage), nbytes))
}

/// Runs or defers one op; writes its results to `outputs` (room for `max_outputs`).
///
/// # Safety
/// `call` must be valid; `outputs` must have room for `max_outputs`; `num_outputs` writable.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_op(
    call: *const TpjrtOpCall,
    outputs: *mut TpjrtOutput,
    max_outputs: u64,
    num_outputs: *mut u64,
) -> i32 {
    guarded(|| {
        let engine = global::engine()?;
        let c = decode(call)?;
        let _default_float = ops::scoped_default_float(c.default_float);
        let _precision = ops::scoped_matmul_precision(c.matmul_precision);
        // Asked here, before any engine lock is taken: the hook takes Python's lock.
        let location = engine
            .records_op_lines()
            .then(user_location)
            .flatten()
            .map(Arc::<str>::from);
        let captured = engine.op_at(
            location, c.device, c.op, &c.inputs, &c.scalars, &c.params, &c.outs,
        )?;
        let results = captured.outputs;
        let written = write_outputs(&results, outputs, max_outputs, num_outputs);
        if written.is_err() && c.outs.is_empty() {
            // The caller cannot know the new storages: release them rather than leak them.
            for (storage, _) in &results {
                let _ = engine.release_storage(*storage);
            }
        }
        written
    })
}

/// The results an op would produce, without running it (storage ids are 0).
///
/// # Safety
/// As `tpjrt_op`.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_op_meta(
    call: *const TpjrtOpCall,
    outputs: *mut TpjrtOutput,
    max_outputs: u64,
    num_outputs: *mut u64,
) -> i32 {
    guarded(|| {
        let c = decode(call)?;
        let _default_float = ops::scoped_default_float(c.default_float);
        let _precision = ops::scoped_matmul_precision(c.matmul_precision);
        let meta = crate::engine::op_meta(c.op, &c.inputs, &c.scalars, &c.params)?;
        let results: Vec<(StorageId, ops::TensorType)> = meta
            .outputs
            .into_iter()
            .map(|t| (StorageId(0), t))
            .collect();
        write_outputs(&results, outputs, max_outputs, num_outputs)
    })
}

/// Copies host memory into a tensor (`nbytes` = numel × itemsize).
///
/// # Safety
/// `dst` must be valid; `data` must point to `nbytes` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_write_host(
    dst: *const TpjrtTensor,
    data: *const c_void,
    nbytes: u64,
) -> i32 {
    guarded(|| {
        let engine = global::engine()?;
        let t = tensor_ref(dst.as_ref().ok_or_else(|| invalid("null tensor".into()))?)?;
        let bytes = slice(data as *const u8, nbytes)?;
        engine.write_host(&t, bytes)
    })
}

/// `torch_pjrt.mark_dynamic(t, dim, max)` for an inner dimension: uploads like `t` are padded
/// along `dim` to at least `bound` elements (a bucket) from now on, and `t` itself too.
///
/// # Safety
/// `t` must be valid.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_mark_dynamic(t: *const TpjrtTensor, dim: i32, bound: i64) -> i32 {
    guarded(|| {
        let engine = global::engine()?;
        let t = tensor_ref(t.as_ref().ok_or_else(|| invalid("null tensor".into()))?)?;
        let dim = usize::try_from(dim)
            .map_err(|_| invalid(format!("mark_dynamic: dimension {dim} is negative")))?;
        engine.mark_dynamic(&t, dim, bound)
    })
}

/// A sequence grown by appends into a buffer with room (`torch.cat([ids, next_id], 1)`, RFC
/// 0028) is now `length` long: windows of it at that length (`ids[:, -context:]` read by an
/// embedding) and tensors made at it (`arange(length)`) are read and made padded to its bucket,
/// so a model that reads the whole sequence at every step compiles once per bucket.
#[no_mangle]
pub extern "C" fn tpjrt_note_sequence_length(length: i64) -> i32 {
    guarded(|| global::engine()?.note_sequence_length(length))
}

/// Copies a tensor into host memory (`nbytes` = numel × itemsize), materializing it first.
///
/// # Safety
/// `src` must be valid; `data` must point to `nbytes` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_read_host(
    src: *const TpjrtTensor,
    data: *mut c_void,
    nbytes: u64,
) -> i32 {
    guarded(|| {
        let engine = global::engine()?;
        let t = tensor_ref(src.as_ref().ok_or_else(|| invalid("null tensor".into()))?)?;
        if nbytes > 0 && data.is_null() {
            return Err(invalid("tpjrt_read_host: null destination".into()));
        }
        let bytes: &mut [u8] = if nbytes == 0 {
            &mut []
        } else {
            std::slice::from_raw_parts_mut(data as *mut u8, nbytes as usize)
        };
        engine.read_host(&t, bytes)
    })
}

/// Waits (at most ten seconds) for the device runtime's warm-up, if one is running; never
/// starts the engine. Called as the process exits.
#[no_mangle]
pub extern "C" fn tpjrt_wait_warm_up() -> i32 {
    guarded(|| {
        if let Some(engine) = global::running() {
            engine.wait_warm_up(std::time::Duration::from_secs(10));
        }
        Ok(())
    })
}

/// Waits, at most `limit_ms` milliseconds, until no quick program's background recompile with
/// full options (RFC 0041) is queued or running, and writes 1 to `settled` when none is, else 0.
/// For benchmarks and tests that time the programs a loop settles on; never starts the engine.
///
/// # Safety
/// `settled` must point to one writable `int32_t`.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_wait_compile_upgrades(limit_ms: i64, settled: *mut i32) -> i32 {
    guarded(|| {
        if settled.is_null() {
            return Err(invalid("tpjrt_wait_compile_upgrades: null output".into()));
        }
        let limit = std::time::Duration::from_millis(limit_ms.max(0) as u64);
        let done = global::running().is_none_or(|engine| engine.wait_for_upgrades(limit));
        *settled = i32::from(done);
        Ok(())
    })
}

/// Queues the background recompile with full options (RFC 0041) of every quick program not
/// upgraded yet, however often it has run, and writes how many to `queued`; a later
/// `tpjrt_wait_compile_upgrades` waits for them. For benchmarks that time the programs a loop
/// settles on after its warm-up; never starts the engine.
///
/// # Safety
/// `queued` must point to one writable `int64_t`.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_upgrade_quick_programs(queued: *mut i64) -> i32 {
    guarded(|| {
        if queued.is_null() {
            return Err(invalid("tpjrt_upgrade_quick_programs: null output".into()));
        }
        let count = global::running().map_or(0, |engine| engine.upgrade_all_now());
        *queued = count as i64;
        Ok(())
    })
}

/// Readies the process to exit: waits for the warm-up and the compiles running now, and refuses
/// later compiles. A client calls it before the process exits (the Python package does from
/// `atexit`; a C program before returning from `main`): the runtime's global state is torn
/// down at exit, some of it registered lazily by the first compile, and a compile still running
/// then crashes the process.
#[no_mangle]
pub extern "C" fn tpjrt_prepare_exit() -> i32 {
    guarded(|| {
        if let Some(engine) = global::running() {
            engine.prepare_exit(std::time::Duration::from_secs(30));
        }
        Ok(())
    })
}

/// The in-process cache's programs as a JSON list (key, region, source, compile_seconds, hits),
/// written like `tpjrt_metrics_json`.
///
/// # Safety
/// As `tpjrt_metrics_json`.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_cache_stats_json(
    buffer: *mut c_char,
    capacity: u64,
    length: *mut u64,
) -> i32 {
    guarded(|| {
        write_text(
            &global::engine()?.cache_stats_json(),
            buffer,
            capacity,
            length,
        );
        Ok(())
    })
}

/// Hands `text` to a caller's buffer: its length in `*length` (when not null) and as much of it
/// as fits in `capacity` bytes, NUL-terminated, in `buffer` (when not null); a caller whose
/// buffer was short asks again with `*length + 1`.
///
/// # Safety
/// `buffer` has room for `capacity` bytes or is null; `length` is writable or null.
unsafe fn write_text(text: &str, buffer: *mut c_char, capacity: u64, length: *mut u64) {
    if !length.is_null() {
        *length = text.len() as u64;
    }
    if !buffer.is_null() && capacity > 0 {
        let n = text.len().min(capacity as usize - 1);
        std::ptr::copy_nonoverlapping(text.as_ptr(), buffer as *mut u8, n);
        *buffer.add(n) = 0;
    }
}

/// Drops the in-process executables (`torch.pjrt.empty_cache()`); `*dropped` is how many.
///
/// # Safety
/// `dropped` is writable or null.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_empty_cache(dropped: *mut u64) -> i32 {
    guarded(|| {
        let count = global::engine()?.empty_cache();
        if !dropped.is_null() {
            *dropped = count;
        }
        Ok(())
    })
}

/// Restarts the peak of live device bytes from the live bytes now.
#[no_mangle]
pub extern "C" fn tpjrt_reset_peak_memory() -> i32 {
    guarded(|| {
        global::engine()?.reset_peak_memory();
        Ok(())
    })
}

/// Records a device event; `*event` is its id (see `Engine::record_event`).
///
/// # Safety
/// `event` is writable.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_event_record(event: *mut u64) -> i32 {
    guarded(|| {
        if event.is_null() {
            return Err(invalid("a null event pointer was passed".into()));
        }
        *event = global::engine()?.record_event()?;
        Ok(())
    })
}

/// `*done` is 1 when the event's work has finished on the device, else 0.
///
/// # Safety
/// `done` is writable.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_event_query(event: u64, done: *mut i32) -> i32 {
    guarded(|| {
        if done.is_null() {
            return Err(invalid("a null result pointer was passed".into()));
        }
        *done = i32::from(global::engine()?.query_event(event)?);
        Ok(())
    })
}

/// Waits until the event's work has finished on the device.
#[no_mangle]
pub extern "C" fn tpjrt_event_synchronize(event: u64) -> i32 {
    guarded(|| global::engine()?.synchronize_event(event))
}

/// `*ms` is the time from `start`'s completion to `end`'s, in milliseconds (waits for both).
///
/// # Safety
/// `ms` is writable.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_event_elapsed(start: u64, end: u64, ms: *mut f64) -> i32 {
    guarded(|| {
        if ms.is_null() {
            return Err(invalid("a null result pointer was passed".into()));
        }
        *ms = global::engine()?.event_elapsed_ms(start, end)?;
        Ok(())
    })
}

/// Forgets an event.
#[no_mangle]
pub extern "C" fn tpjrt_event_destroy(event: u64) -> i32 {
    guarded(|| {
        global::engine()?.destroy_event(event);
        Ok(())
    })
}

/// Opens a compiled-mode graph: launches what is pending, then defers every op into one region
/// (no size cap, no cuts) until `tpjrt_graph_end`. Graphs nest; the mode is DeferAndFuse inside.
#[no_mangle]
pub extern "C" fn tpjrt_graph_begin() -> i32 {
    guarded(|| global::engine()?.graph_begin())
}

/// Closes the innermost graph: launches its region without waiting for the device.
#[no_mangle]
pub extern "C" fn tpjrt_graph_end() -> i32 {
    guarded(|| global::engine()?.graph_end())
}

fn storage_ids(ptr: *const u64, len: u64) -> Result<SmallVec<[StorageId; 8]>, EngineError> {
    // SAFETY: the caller passes `len` readable ids at `ptr` (or len 0).
    let ids = unsafe { slice(ptr, len)? };
    Ok(ids.iter().map(|&id| StorageId(id)).collect())
}

/// Opens a compiled-mode graph like `tpjrt_graph_begin`, for `tpjrt_graph_end_record` to record
/// over the graph inputs' storages `inputs`: a few pending ops that read no device value and make
/// only inputs' values stay pending and join the graph's region, which its program computes.
///
/// # Safety
/// `inputs` points to `num_inputs` ids.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_graph_begin_record(inputs: *const u64, num_inputs: u64) -> i32 {
    guarded(|| {
        let inputs = storage_ids(inputs, num_inputs)?;
        global::engine()?.graph_begin_record(&inputs)
    })
}

/// Closes the innermost graph like `tpjrt_graph_end`, and records its region as a program over
/// the graph inputs' storages `inputs` and its fresh outputs' storages `fresh`. `*handle` is the
/// program (for `tpjrt_graph_replay`), or 0 when the region cannot be replayed.
///
/// # Safety
/// `inputs` and `fresh` point to `num_inputs` and `num_fresh` ids; `handle` is writable.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_graph_end_record(
    inputs: *const u64,
    num_inputs: u64,
    fresh: *const u64,
    num_fresh: u64,
    handle: *mut u64,
) -> i32 {
    guarded(|| {
        if handle.is_null() {
            return Err(invalid("a null handle pointer was passed".into()));
        }
        let inputs = storage_ids(inputs, num_inputs)?;
        let fresh = storage_ids(fresh, num_fresh)?;
        let recorded = global::engine()?.graph_end_record(&inputs, &fresh)?;
        *handle = recorded;
        Ok(())
    })
}

/// Runs recorded program `handle` on new storages, in the roles they had when it was recorded;
/// `*replayed` is 0 when it could not run this way (then run the graph's ops instead).
///
/// # Safety
/// As `tpjrt_graph_end_record`; `replayed` is writable.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_graph_replay(
    handle: u64,
    inputs: *const u64,
    num_inputs: u64,
    fresh: *const u64,
    num_fresh: u64,
    replayed: *mut i32,
) -> i32 {
    guarded(|| {
        if replayed.is_null() {
            return Err(invalid("a null result pointer was passed".into()));
        }
        let inputs = storage_ids(inputs, num_inputs)?;
        let fresh = storage_ids(fresh, num_fresh)?;
        let ran = global::engine()?.graph_replay(handle, &inputs, &fresh)?;
        *replayed = i32::from(ran);
        Ok(())
    })
}

/// Materializes everything pending and waits for the device.
#[no_mangle]
pub extern "C" fn tpjrt_sync() -> i32 {
    guarded(|| global::engine()?.sync())
}

/// Pushes an eager mode (0 strict, 1 debug, 2 defer_and_fuse) on the process-wide stack.
#[no_mangle]
pub extern "C" fn tpjrt_mode_push(mode: i32) -> i32 {
    guarded(|| {
        let mode = mode_of(mode)?;
        let engine = global::engine()?;
        engine.modes().push(mode);
        engine.adaptive().reset();
        Ok(())
    })
}

/// Pops the innermost eager mode.
#[no_mangle]
pub extern "C" fn tpjrt_mode_pop() -> i32 {
    guarded(|| {
        let engine = global::engine()?;
        engine.modes().pop().map_err(EngineError::runtime)?;
        engine.adaptive().reset();
        Ok(())
    })
}

/// Replaces the innermost eager mode.
#[no_mangle]
pub extern "C" fn tpjrt_mode_set(mode: i32) -> i32 {
    guarded(|| {
        let mode = mode_of(mode)?;
        global::engine()?.modes().set(mode);
        Ok(())
    })
}

/// The current eager mode.
///
/// # Safety
/// `mode` must be a writable int.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_mode_get(mode: *mut i32) -> i32 {
    guarded(|| {
        if mode.is_null() {
            return Err(invalid("tpjrt_mode_get: null output".into()));
        }
        *mode = global::engine()?.modes().current().code();
        Ok(())
    })
}

fn mode_of(code: i32) -> Result<Mode, EngineError> {
    Mode::from_code(code).ok_or_else(|| {
        EngineError::new(
            ErrorKind::Value,
            format!("eager mode code {code} is unknown: expected 0 (strict), 1 (debug) or 2 (defer_and_fuse)"),
        )
    })
}

/// The number of devices of the PJRT client.
///
/// # Safety
/// `count` must be a writable int.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_device_count(count: *mut i32) -> i32 {
    guarded(|| {
        if count.is_null() {
            return Err(invalid("tpjrt_device_count: null output".into()));
        }
        *count = global::engine()?.device_count() as i32;
        Ok(())
    })
}

/// Counts one CPU fallback of `op` (reported by the plugin's fallback kernel).
///
/// # Safety
/// `op` must be a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_note_fallback(op: *const c_char) -> i32 {
    guarded(|| {
        if op.is_null() {
            return Err(invalid("tpjrt_note_fallback: null op name".into()));
        }
        let name = CStr::from_ptr(op).to_string_lossy();
        global::engine()?.note_fallback(&name);
        Ok(())
    })
}

/// Writes the metrics as JSON into `buffer` (capacity `capacity`); `length` gets the full length
/// (call again with a larger buffer if it exceeds the capacity).
///
/// # Safety
/// `buffer` must have room for `capacity` bytes; `length` must be writable.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_metrics_json(
    buffer: *mut c_char,
    capacity: u64,
    length: *mut u64,
) -> i32 {
    guarded(|| {
        write_text(
            &global::engine()?.metrics().to_json(),
            buffer,
            capacity,
            length,
        );
        Ok(())
    })
}

/// Zeroes every metric.
#[no_mangle]
pub extern "C" fn tpjrt_reset_metrics() -> i32 {
    guarded(|| {
        global::engine()?.reset_metrics();
        Ok(())
    })
}

/// Trace rows of `TpjrtTraceEvent::track`: a caller's thread (`thread` names it), a compile
/// thread (likewise), the device's executions, the device's host transfers.
pub const TPJRT_TRACK_HOST: i32 = 0;
pub const TPJRT_TRACK_COMPILE: i32 = 1;
pub const TPJRT_TRACK_DEVICE: i32 = 2;
pub const TPJRT_TRACK_TRANSFER: i32 = 3;

// The header's numbers are the trace's own.
const _: () = {
    assert!(TPJRT_TRACK_HOST == compile::trace::Track::Host as i32);
    assert!(TPJRT_TRACK_COMPILE == compile::trace::Track::Compile as i32);
    assert!(TPJRT_TRACK_DEVICE == compile::trace::Track::Device as i32);
    assert!(TPJRT_TRACK_TRANSFER == compile::trace::Track::Transfer as i32);
};

/// One event of the engine's trace, valid only during the sink call that receives it. Times
/// are nanoseconds since the Unix epoch; `arg_values` are JSON literals.
#[repr(C)]
pub struct TpjrtTraceEvent {
    pub name: *const c_char,
    pub track: i32,
    pub thread: i64,
    pub start_ns: i64,
    pub end_ns: i64,
    pub arg_count: u64,
    pub arg_names: *const *const c_char,
    pub arg_values: *const *const c_char,
}

/// Starts recording the engine's trace (regions, compiles, device executions, transfers),
/// dropping what an earlier session left. Needs no running engine.
#[no_mangle]
pub extern "C" fn tpjrt_trace_start() -> i32 {
    guarded(|| {
        compile::trace::start();
        Ok(())
    })
}

/// Stops recording; executions launched while recording are still recorded as they complete,
/// and are waited for here (briefly) so that the session that reads the trace next sees them.
#[no_mangle]
pub extern "C" fn tpjrt_trace_stop() -> i32 {
    guarded(|| {
        compile::trace::stop();
        if let Some(engine) = global::running() {
            engine.settle_trace();
        }
        Ok(())
    })
}

/// Hands every recorded event to `sink` (called with `context`), oldest first, and forgets them.
///
/// # Safety
/// `sink` must be callable with `context` and must not keep the event's pointers.
#[no_mangle]
pub unsafe extern "C" fn tpjrt_trace_take(
    sink: Option<unsafe extern "C" fn(*mut c_void, *const TpjrtTraceEvent)>,
    context: *mut c_void,
) -> i32 {
    guarded(|| {
        let sink = sink.ok_or_else(|| invalid("tpjrt_trace_take: null sink".into()))?;
        let text = |s: &str| CString::new(s.replace('\0', " ")).unwrap_or_default();
        for event in compile::trace::take() {
            let name = text(&event.name);
            let names: Vec<CString> = event.args.iter().map(|(n, _)| text(n)).collect();
            let values: Vec<CString> = event.args.iter().map(|(_, v)| text(&v.to_json())).collect();
            let name_ptrs: Vec<*const c_char> = names.iter().map(|c| c.as_ptr()).collect();
            let value_ptrs: Vec<*const c_char> = values.iter().map(|c| c.as_ptr()).collect();
            let raw = TpjrtTraceEvent {
                name: name.as_ptr(),
                track: event.track as i32,
                thread: event.thread,
                start_ns: compile::trace::unix_nanos(event.start),
                end_ns: compile::trace::unix_nanos(event.end),
                arg_count: name_ptrs.len() as u64,
                arg_names: name_ptrs.as_ptr(),
                arg_values: value_ptrs.as_ptr(),
            };
            sink(context, &raw);
        }
        Ok(())
    })
}

/// The ABI version in `TpjrtApi::version`; bumped on any incompatible change.
pub const TPJRT_ABI_VERSION: u32 = 5;

/// Every ABI function in one table, so a plugin loaded separately (the C++ PrivateUse1 backend)
/// reaches the same engine instance through one pointer handed over at import time.
#[repr(C)]
pub struct TpjrtApi {
    pub version: u32,
    pub struct_size: u32,
    pub init: unsafe extern "C" fn(*const c_char) -> i32,
    pub last_error: extern "C" fn() -> *const c_char,
    pub op_id: unsafe extern "C" fn(*const c_char, *mut i32) -> i32,
    pub storage_new: unsafe extern "C" fn(u64, *mut u64) -> i32,
    pub storage_release: extern "C" fn(u64) -> i32,
    pub storage_resize: extern "C" fn(u64, u64) -> i32,
    pub op: unsafe extern "C" fn(*const TpjrtOpCall, *mut TpjrtOutput, u64, *mut u64) -> i32,
    pub op_meta: unsafe extern "C" fn(*const TpjrtOpCall, *mut TpjrtOutput, u64, *mut u64) -> i32,
    pub write_host: unsafe extern "C" fn(*const TpjrtTensor, *const c_void, u64) -> i32,
    pub read_host: unsafe extern "C" fn(*const TpjrtTensor, *mut c_void, u64) -> i32,
    pub sync: extern "C" fn() -> i32,
    pub mode_push: extern "C" fn(i32) -> i32,
    pub mode_pop: extern "C" fn() -> i32,
    pub mode_set: extern "C" fn(i32) -> i32,
    pub mode_get: unsafe extern "C" fn(*mut i32) -> i32,
    pub device_count: unsafe extern "C" fn(*mut i32) -> i32,
    pub note_fallback: unsafe extern "C" fn(*const c_char) -> i32,
    pub metrics_json: unsafe extern "C" fn(*mut c_char, u64, *mut u64) -> i32,
    pub reset_metrics: extern "C" fn() -> i32,
    pub mark_dynamic: unsafe extern "C" fn(*const TpjrtTensor, i32, i64) -> i32,
    pub graph_begin: extern "C" fn() -> i32,
    pub graph_end: extern "C" fn() -> i32,
    pub graph_end_record: unsafe extern "C" fn(*const u64, u64, *const u64, u64, *mut u64) -> i32,
    pub graph_replay: unsafe extern "C" fn(u64, *const u64, u64, *const u64, u64, *mut i32) -> i32,
    pub event_record: unsafe extern "C" fn(*mut u64) -> i32,
    pub event_query: unsafe extern "C" fn(u64, *mut i32) -> i32,
    pub event_synchronize: extern "C" fn(u64) -> i32,
    pub event_elapsed: unsafe extern "C" fn(u64, u64, *mut f64) -> i32,
    pub event_destroy: extern "C" fn(u64) -> i32,
    pub trace_start: extern "C" fn() -> i32,
    pub trace_stop: extern "C" fn() -> i32,
    pub trace_take: unsafe extern "C" fn(
        Option<unsafe extern "C" fn(*mut c_void, *const TpjrtTraceEvent)>,
        *mut c_void,
    ) -> i32,
    pub note_sequence_length: extern "C" fn(i64) -> i32,
    pub graph_begin_record: unsafe extern "C" fn(*const u64, u64) -> i32,
    pub storage_new_on: unsafe extern "C" fn(u64, i32, *mut u64) -> i32,
    pub storage_device: unsafe extern "C" fn(u64, *mut i32) -> i32,
    pub copy_to_device: unsafe extern "C" fn(*const TpjrtTensor, *const TpjrtTensor) -> i32,
    pub collective: unsafe extern "C" fn(i32, i32, i64, *const TpjrtTensor, u64, *mut u64) -> i32,
}

static API: TpjrtApi = TpjrtApi {
    version: TPJRT_ABI_VERSION,
    struct_size: std::mem::size_of::<TpjrtApi>() as u32,
    init: tpjrt_init,
    last_error: tpjrt_last_error,
    op_id: tpjrt_op_id,
    storage_new: tpjrt_storage_new,
    storage_release: tpjrt_storage_release,
    storage_resize: tpjrt_storage_resize,
    op: tpjrt_op,
    op_meta: tpjrt_op_meta,
    write_host: tpjrt_write_host,
    read_host: tpjrt_read_host,
    sync: tpjrt_sync,
    mode_push: tpjrt_mode_push,
    mode_pop: tpjrt_mode_pop,
    mode_set: tpjrt_mode_set,
    mode_get: tpjrt_mode_get,
    device_count: tpjrt_device_count,
    note_fallback: tpjrt_note_fallback,
    metrics_json: tpjrt_metrics_json,
    reset_metrics: tpjrt_reset_metrics,
    mark_dynamic: tpjrt_mark_dynamic,
    graph_begin: tpjrt_graph_begin,
    graph_end: tpjrt_graph_end,
    graph_end_record: tpjrt_graph_end_record,
    graph_replay: tpjrt_graph_replay,
    event_record: tpjrt_event_record,
    event_query: tpjrt_event_query,
    event_synchronize: tpjrt_event_synchronize,
    event_elapsed: tpjrt_event_elapsed,
    event_destroy: tpjrt_event_destroy,
    trace_start: tpjrt_trace_start,
    trace_stop: tpjrt_trace_stop,
    trace_take: tpjrt_trace_take,
    note_sequence_length: tpjrt_note_sequence_length,
    graph_begin_record: tpjrt_graph_begin_record,
    storage_new_on: tpjrt_storage_new_on,
    storage_device: tpjrt_storage_device,
    copy_to_device: tpjrt_copy_to_device,
    collective: tpjrt_collective,
};

/// The function table of this engine library.
#[no_mangle]
pub extern "C" fn tpjrt_api() -> *const TpjrtApi {
    &API
}
