//! How precisely float32 matrix products and convolutions compute: PyTorch's
//! `torch.set_float32_matmul_precision`, as StableHLO's `precision_config`.
//!
//! Like the default float dtype, it is state of the calling thread for the duration of one op
//! call (the C ABI sets it from the plugin's `at::globalContext().float32MatmulPrecision()`). A
//! product or convolution op captured under a precision other than `Highest` records it in
//! `Meta::matmul_precision`, its lowering runs under it and the region key hashes it, so the
//! default's programs and keys are what they were before the setting existed.

/// `torch.get_float32_matmul_precision()`'s three values.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Full float32 (PyTorch's default): `HIGHEST`.
    #[default]
    Highest,
    /// TF32 or three bfloat16 passes where the device has them: `HIGH`.
    High,
    /// One bfloat16 pass (TF32 on GPUs): `DEFAULT`.
    Medium,
}

impl Precision {
    /// The code the C ABI carries: 0 highest (also a zero-initialized call), 1 high, 2 medium.
    pub fn from_code(code: i32) -> Option<Precision> {
        match code {
            0 => Some(Precision::Highest),
            1 => Some(Precision::High),
            2 => Some(Precision::Medium),
            _ => None,
        }
    }

    pub fn code(self) -> u32 {
        match self {
            Precision::Highest => 0,
            Precision::High => 1,
            Precision::Medium => 2,
        }
    }

    /// StableHLO's name of the precision both operands of a product get.
    pub fn stablehlo_name(self) -> &'static str {
        match self {
            Precision::Highest => "HIGHEST",
            Precision::High => "HIGH",
            Precision::Medium => "DEFAULT",
        }
    }

    /// The precision of float32 products and convolutions lowered on this thread now.
    pub fn current() -> Precision {
        MATMUL_PRECISION.with(|p| p.get())
    }
}

thread_local! {
    static MATMUL_PRECISION: std::cell::Cell<Precision> = const { std::cell::Cell::new(Precision::Highest) };
}

/// Makes `precision` the float32 product precision for the metas and lowerings run on this
/// thread until the guard drops.
#[must_use]
pub fn scoped_matmul_precision(precision: Precision) -> PrecisionGuard {
    let previous = MATMUL_PRECISION.with(|p| p.replace(precision));
    PrecisionGuard { previous }
}

/// Restores the previous precision when dropped.
pub struct PrecisionGuard {
    previous: Precision,
}

impl Drop for PrecisionGuard {
    fn drop(&mut self) {
        MATMUL_PRECISION.with(|p| p.set(self.previous));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{meta, DType, OpId, TensorType};

    fn f32s(shape: &[i64]) -> TensorType {
        TensorType::new(DType::F32, shape)
    }

    #[test]
    fn only_float32_products_record_a_precision_other_than_full() {
        let mm = || meta(OpId::Mm, &[f32s(&[2, 3]), f32s(&[3, 4])], &[], &[]).unwrap();
        assert_eq!(mm().matmul_precision, None, "full precision keys as before");
        let _medium = scoped_matmul_precision(Precision::Medium);
        assert_eq!(mm().matmul_precision, Some(Precision::Medium));
        let bf16 = TensorType::new(DType::BF16, &[2, 3]);
        let bf16_mm = meta(
            OpId::Mm,
            &[bf16.clone(), TensorType::new(DType::BF16, &[3, 4])],
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(bf16_mm.matmul_precision, None, "the setting is float32's");
        let add = meta(OpId::Add, &[f32s(&[2, 3]), f32s(&[2, 3])], &[], &[]).unwrap();
        assert_eq!(add.matmul_precision, None, "not a product");
    }

    #[test]
    fn guards_nest_and_restore() {
        assert_eq!(Precision::current(), Precision::Highest);
        {
            let _high = scoped_matmul_precision(Precision::High);
            {
                let _medium = scoped_matmul_precision(Precision::Medium);
                assert_eq!(Precision::current(), Precision::Medium);
            }
            assert_eq!(Precision::current(), Precision::High);
        }
        assert_eq!(Precision::current(), Precision::Highest);
        assert_eq!(Precision::from_code(3), None);
        for p in [Precision::Highest, Precision::High, Precision::Medium] {
            assert_eq!(Precision::from_code(p.code() as i32), Some(p));
        }
    }
}
