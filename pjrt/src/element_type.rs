//! Element types of PJRT buffers that PyTorch and PJRT share.

use pjrt_sys as sys;

/// The element types this layer supports (every dtype PyTorch and PJRT have in common).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ElementType {
    Pred,
    S8,
    S16,
    S32,
    S64,
    U8,
    U16,
    U32,
    U64,
    F16,
    BF16,
    F32,
    F64,
    C64,
    C128,
}

impl ElementType {
    pub const ALL: [ElementType; 15] = [
        ElementType::Pred,
        ElementType::S8,
        ElementType::S16,
        ElementType::S32,
        ElementType::S64,
        ElementType::U8,
        ElementType::U16,
        ElementType::U32,
        ElementType::U64,
        ElementType::F16,
        ElementType::BF16,
        ElementType::F32,
        ElementType::F64,
        ElementType::C64,
        ElementType::C128,
    ];

    /// Bytes per element in a dense host buffer.
    pub fn size_bytes(self) -> usize {
        match self {
            ElementType::Pred | ElementType::S8 | ElementType::U8 => 1,
            ElementType::S16 | ElementType::U16 | ElementType::F16 | ElementType::BF16 => 2,
            ElementType::S32 | ElementType::U32 | ElementType::F32 => 4,
            ElementType::S64 | ElementType::U64 | ElementType::F64 | ElementType::C64 => 8,
            ElementType::C128 => 16,
        }
    }

    /// The MLIR element type name (`f32`, `i1`, `ui8`, ...).
    pub fn mlir_name(self) -> &'static str {
        match self {
            ElementType::Pred => "i1",
            ElementType::S8 => "i8",
            ElementType::S16 => "i16",
            ElementType::S32 => "i32",
            ElementType::S64 => "i64",
            ElementType::U8 => "ui8",
            ElementType::U16 => "ui16",
            ElementType::U32 => "ui32",
            ElementType::U64 => "ui64",
            ElementType::F16 => "f16",
            ElementType::BF16 => "bf16",
            ElementType::F32 => "f32",
            ElementType::F64 => "f64",
            ElementType::C64 => "complex<f32>",
            ElementType::C128 => "complex<f64>",
        }
    }

    pub(crate) fn to_raw(self) -> sys::PJRT_Buffer_Type {
        match self {
            ElementType::Pred => sys::PJRT_Buffer_Type_PRED,
            ElementType::S8 => sys::PJRT_Buffer_Type_S8,
            ElementType::S16 => sys::PJRT_Buffer_Type_S16,
            ElementType::S32 => sys::PJRT_Buffer_Type_S32,
            ElementType::S64 => sys::PJRT_Buffer_Type_S64,
            ElementType::U8 => sys::PJRT_Buffer_Type_U8,
            ElementType::U16 => sys::PJRT_Buffer_Type_U16,
            ElementType::U32 => sys::PJRT_Buffer_Type_U32,
            ElementType::U64 => sys::PJRT_Buffer_Type_U64,
            ElementType::F16 => sys::PJRT_Buffer_Type_F16,
            ElementType::BF16 => sys::PJRT_Buffer_Type_BF16,
            ElementType::F32 => sys::PJRT_Buffer_Type_F32,
            ElementType::F64 => sys::PJRT_Buffer_Type_F64,
            ElementType::C64 => sys::PJRT_Buffer_Type_C64,
            ElementType::C128 => sys::PJRT_Buffer_Type_C128,
        }
    }

    pub(crate) fn from_raw(raw: sys::PJRT_Buffer_Type) -> Option<ElementType> {
        ElementType::ALL.into_iter().find(|t| t.to_raw() == raw)
    }
}
