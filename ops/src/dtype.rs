//! Element types, tensor types and scalar arguments as PyTorch sees them.

use smallvec::SmallVec;
use std::fmt;

/// A tensor shape; most tensors have at most six dimensions.
pub type Shape = SmallVec<[i64; 6]>;

/// Element types, numbered with PyTorch's `ScalarType` codes.
#[repr(i8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    U8 = 0,
    I8 = 1,
    I16 = 2,
    I32 = 3,
    I64 = 4,
    F16 = 5,
    F32 = 6,
    F64 = 7,
    /// complex32 (`torch.chalf`): two f16 parts to PyTorch (4 bytes), kept on the device as
    /// complex64 whose parts each op rounds to f16 (see `crate::chalf`).
    C32 = 8,
    C64 = 9,
    C128 = 10,
    Bool = 11,
    BF16 = 15,
    /// The wide unsigned integers: PyTorch stores them and runs few ops on them (its CPU
    /// kernels' "barebones unsigned" set); see `crate::unsigned`.
    U16 = 27,
    U32 = 28,
    U64 = 29,
}

impl DType {
    pub const ALL: [DType; 16] = [
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::F32,
        DType::F64,
        DType::C32,
        DType::C64,
        DType::C128,
        DType::Bool,
        DType::BF16,
        DType::U16,
        DType::U32,
        DType::U64,
    ];

    /// The dtype PyTorch gives Python floats and integer results of float ops
    /// (`torch.get_default_dtype()`), for the meta running on this thread: float32 unless
    /// [`scoped_default_float`] says otherwise.
    pub fn default_float() -> DType {
        DEFAULT_FLOAT.with(|d| d.get())
    }

    pub fn from_code(code: i32) -> Option<Self> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }

    pub fn code(self) -> i32 {
        self as i8 as i32
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DType::U8 | DType::I8 | DType::Bool => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 | DType::C32 => 4,
            DType::I64 | DType::U64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// complex32, complex64 and complex128 (neither floating point nor integral, as in PyTorch).
    pub fn is_complex(self) -> bool {
        matches!(self, DType::C32 | DType::C64 | DType::C128)
    }

    /// The dtype of a complex dtype's real and imaginary parts; any other dtype itself.
    pub fn real_part(self) -> DType {
        match self {
            DType::C32 => DType::F16,
            DType::C64 => DType::F32,
            DType::C128 => DType::F64,
            d => d,
        }
    }

    /// The complex dtype whose parts have this float dtype (`c10::toComplexType`): float64 gives
    /// complex128, the narrower floats complex64; a complex dtype is itself. (PyTorch's float16
    /// gives complex32, but only its type promotion uses that, in `crate::promote`.)
    pub fn to_complex(self) -> DType {
        match self {
            DType::F64 | DType::C128 => DType::C128,
            DType::C32 => DType::C32,
            _ => DType::C64,
        }
    }

    pub fn is_integral(self, include_bool: bool) -> bool {
        match self {
            DType::U8 | DType::I8 | DType::I16 | DType::I32 | DType::I64 => true,
            DType::U16 | DType::U32 | DType::U64 => true,
            DType::Bool => include_bool,
            _ => false,
        }
    }

    /// uint16, uint32 and uint64, whose ops PyTorch limits (see `crate::unsigned`).
    pub fn is_wide_unsigned(self) -> bool {
        matches!(self, DType::U16 | DType::U32 | DType::U64)
    }

    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }

    /// bf16 and f16: PyTorch computes on them in f32 and rounds once at the end.
    pub fn is_reduced_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// The dtype arithmetic on this dtype is carried out in (PyTorch's `opmath_type`).
    pub fn compute_dtype(self) -> DType {
        if self.is_reduced_float() {
            DType::F32
        } else if self == DType::C32 {
            // As PyTorch's CUDA kernels: complex<float> arithmetic, each part rounded to f16.
            DType::C64
        } else {
            self
        }
    }

    /// The element type in MLIR's spelling.
    pub fn mlir_name(self) -> &'static str {
        match self {
            DType::U8 => "ui8",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            // complex32's device values are complex64 (StableHLO has no complex<f16>).
            DType::C32 | DType::C64 => "complex<f32>",
            DType::C128 => "complex<f64>",
            DType::Bool => "i1",
            DType::BF16 => "bf16",
            DType::U16 => "ui16",
            DType::U32 => "ui32",
            DType::U64 => "ui64",
        }
    }

    /// The dtype as Python prints it after `torch.` (`float32`, `bfloat16`, `bool`).
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::C32 => "complex32",
            DType::C64 => "complex64",
            DType::C128 => "complex128",
            DType::Bool => "bool",
            DType::BF16 => "bfloat16",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The `ScalarType` name used in PyTorch's C++ error messages (`Float`, `Long`).
    pub fn scalar_type_name(self) -> &'static str {
        match self {
            DType::U8 => "Byte",
            DType::I8 => "Char",
            DType::I16 => "Short",
            DType::I32 => "Int",
            DType::I64 => "Long",
            DType::F16 => "Half",
            DType::F32 => "Float",
            DType::F64 => "Double",
            DType::C32 => "ComplexHalf",
            DType::C64 => "ComplexFloat",
            DType::C128 => "ComplexDouble",
            DType::Bool => "Bool",
            DType::BF16 => "BFloat16",
            DType::U16 => "UInt16",
            DType::U32 => "UInt32",
            DType::U64 => "UInt64",
        }
    }

    /// The C++ type name PyTorch uses in overflow messages (`uint8_t`).
    pub fn cpp_type_name(self) -> &'static str {
        match self {
            DType::U8 => "uint8_t",
            DType::I8 => "int8_t",
            DType::I16 => "int16_t",
            DType::I32 => "int",
            DType::I64 => "int64_t",
            DType::F16 => "c10::Half",
            DType::F32 => "float",
            DType::F64 => "double",
            DType::C32 => "c10::complex<c10::Half>",
            DType::C64 => "c10::complex<float>",
            DType::C128 => "c10::complex<double>",
            DType::Bool => "bool",
            DType::BF16 => "c10::BFloat16",
            DType::U16 => "uint16_t",
            DType::U32 => "uint32_t",
            DType::U64 => "uint64_t",
        }
    }

    /// The name `caffe2::TypeMeta` prints (`float`, `long int`), used in some PyTorch messages.
    pub fn typemeta_name(self) -> &'static str {
        match self {
            DType::U8 => "unsigned char",
            DType::I8 => "signed char",
            DType::I16 => "short int",
            DType::I32 => "int",
            DType::I64 => "long int",
            DType::F16 => "c10::Half",
            DType::F32 => "float",
            DType::F64 => "double",
            DType::C32 => "c10::complex<c10::Half>",
            DType::C64 => "c10::complex<float>",
            DType::C128 => "c10::complex<double>",
            DType::Bool => "bool",
            DType::BF16 => "c10::BFloat16",
            DType::U16 => "unsigned short",
            DType::U32 => "unsigned int",
            DType::U64 => "unsigned long",
        }
    }

    /// Largest finite value, as f64.
    pub fn max_value(self) -> f64 {
        match self {
            DType::U8 => 255.0,
            DType::I8 => 127.0,
            DType::I16 => 32767.0,
            DType::I32 => 2147483647.0,
            DType::I64 => i64::MAX as f64,
            DType::F16 => 65504.0,
            DType::F32 => f32::MAX as f64,
            DType::F64 | DType::C128 => f64::MAX,
            DType::C64 => f32::MAX as f64,
            DType::C32 => 65504.0,
            DType::Bool => 1.0,
            DType::BF16 => 3.3895313892515355e38,
            DType::U16 => 65535.0,
            DType::U32 => 4294967295.0,
            DType::U64 => u64::MAX as f64,
        }
    }

    /// Smallest (most negative) finite value, as f64.
    pub fn min_value(self) -> f64 {
        match self {
            DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::Bool => 0.0,
            DType::I8 => -128.0,
            DType::I16 => -32768.0,
            DType::I32 => -2147483648.0,
            DType::I64 => i64::MIN as f64,
            f => -f.max_value(),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "torch.{}", self.name())
    }
}

/// A contiguous tensor's type: dtype and sizes (strides are handled elsewhere).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl Clone for TensorType {
    /// Copies the sizes in one go; the derived clone extends element by element, and types are
    /// cloned several times per captured op.
    fn clone(&self) -> Self {
        TensorType::new(self.dtype, &self.shape)
    }
}

impl TensorType {
    pub fn new(dtype: DType, shape: &[i64]) -> Self {
        TensorType {
            dtype,
            shape: Shape::from_slice(shape),
        }
    }

    /// A 0-d tensor type.
    pub fn scalar(dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: Shape::new(),
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
    }

    /// Bytes of a contiguous tensor of this type.
    pub fn nbytes(&self) -> u64 {
        self.numel() as u64 * self.dtype.size_bytes() as u64
    }

    pub fn with_dtype(&self, dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: self.shape.clone(),
        }
    }

    pub fn with_shape(&self, shape: &[i64]) -> Self {
        TensorType::new(self.dtype, shape)
    }

    /// The MLIR type, e.g. `tensor<2x3xf32>` or `tensor<i64>`.
    pub fn mlir(&self) -> String {
        let mut s = String::from("tensor<");
        for d in &self.shape {
            s.push_str(&d.to_string());
            s.push('x');
        }
        s.push_str(self.dtype.mlir_name());
        s.push('>');
        s
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?}", self.dtype.name(), self.shape.as_slice())
    }
}

/// The value of a Python number or a CPU 0-d tensor passed as a scalar.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScalarValue {
    Bool(bool),
    Int(i64),
    Float(f64),
}

impl ScalarValue {
    pub fn as_f64(self) -> f64 {
        match self {
            ScalarValue::Bool(b) => b as i64 as f64,
            ScalarValue::Int(i) => i as f64,
            ScalarValue::Float(f) => f,
        }
    }

    /// Integer value, truncating floats toward zero as C++ does.
    pub fn as_i64(self) -> i64 {
        match self {
            ScalarValue::Bool(b) => b as i64,
            ScalarValue::Int(i) => i,
            ScalarValue::Float(f) => f as i64,
        }
    }

    pub fn is_zero(self) -> bool {
        self.as_f64() == 0.0
    }

    pub fn is_float(self) -> bool {
        matches!(self, ScalarValue::Float(_))
    }

    pub fn is_bool(self) -> bool {
        matches!(self, ScalarValue::Bool(_))
    }

    /// The dtype PyTorch wraps this Python number in (`bool`, `int64`, `float64`).
    pub fn natural_dtype(self) -> DType {
        match self {
            ScalarValue::Bool(_) => DType::Bool,
            ScalarValue::Int(_) => DType::I64,
            ScalarValue::Float(_) => DType::F64,
        }
    }
}

impl fmt::Display for ScalarValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScalarValue::Bool(b) => write!(f, "{}", if *b { "True" } else { "False" }),
            ScalarValue::Int(i) => write!(f, "{i}"),
            ScalarValue::Float(x) => write!(f, "{x}"),
        }
    }
}

/// A value scalar operand: a Python number (`tensor_dtype: None`, a "wrapped number") or a CPU
/// 0-d tensor of `tensor_dtype` passed as a scalar. Both are "dimensionless" operands in type
/// promotion.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScalarArg {
    pub value: ScalarValue,
    pub tensor_dtype: Option<DType>,
}

impl ScalarArg {
    /// A Python number.
    pub fn number(value: ScalarValue) -> Self {
        ScalarArg {
            value,
            tensor_dtype: None,
        }
    }

    pub fn float(x: f64) -> Self {
        ScalarArg::number(ScalarValue::Float(x))
    }

    pub fn int(i: i64) -> Self {
        ScalarArg::number(ScalarValue::Int(i))
    }

    pub fn bool(b: bool) -> Self {
        ScalarArg::number(ScalarValue::Bool(b))
    }

    /// A CPU 0-d tensor of `dtype` holding `value`.
    pub fn tensor(value: ScalarValue, dtype: DType) -> Self {
        ScalarArg {
            value,
            tensor_dtype: Some(dtype),
        }
    }

    /// The dtype this scalar has on its own: the 0-d tensor's dtype, or for a Python number
    /// bool / int64 / the default float dtype.
    pub fn own_dtype(&self) -> DType {
        match (self.tensor_dtype, self.value) {
            (Some(d), _) => d,
            (None, ScalarValue::Bool(_)) => DType::Bool,
            (None, ScalarValue::Int(_)) => DType::I64,
            (None, ScalarValue::Float(_)) => DType::default_float(),
        }
    }
}

thread_local! {
    static DEFAULT_FLOAT: std::cell::Cell<DType> = const { std::cell::Cell::new(DType::F32) };
}

/// Makes `dtype` PyTorch's default float dtype for the metas and lowerings run on this thread
/// until the guard drops (the plugin passes `torch.get_default_dtype()` with each op call).
/// Metas record a default other than float32 (`Meta::float_default`), which keys them apart.
#[must_use]
pub fn scoped_default_float(dtype: DType) -> DefaultFloatGuard {
    let previous = DEFAULT_FLOAT.with(|d| d.replace(dtype));
    DefaultFloatGuard { previous }
}

/// Restores the previous default float dtype when dropped.
pub struct DefaultFloatGuard {
    previous: DType,
}

impl Drop for DefaultFloatGuard {
    fn drop(&mut self) {
        DEFAULT_FLOAT.with(|d| d.set(self.previous));
    }
}
