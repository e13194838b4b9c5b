//! complex32 at the host boundary: PyTorch holds it as pairs of f16 parts, the device as
//! complex64 (StableHLO has no complex<f16>), so uploads widen each part to f32 and downloads
//! round each back to f16.

use ops::DType;

/// complex32's host bytes (f16 pairs) as complex64's (f32 pairs).
pub fn widen(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for half in bytes.chunks_exact(2) {
        let bits = u16::from_le_bytes([half[0], half[1]]);
        out.extend_from_slice(&f16_to_f32(bits).to_le_bytes());
    }
    out
}

/// Copies `buffer` (holding a value of `dtype`) into `dst`, laid out as PyTorch lays out `dtype`.
pub fn buffer_to_host(buffer: &pjrt::Buffer, dtype: DType, dst: &mut [u8]) -> pjrt::Result<()> {
    if dtype != DType::C32 {
        return buffer.to_host_into(dst);
    }
    let mut wide = vec![0u8; dst.len() * 2];
    buffer.to_host_into(&mut wide)?;
    for (half, single) in dst.chunks_exact_mut(2).zip(wide.chunks_exact(4)) {
        let x = f32::from_le_bytes([single[0], single[1], single[2], single[3]]);
        half.copy_from_slice(&f32_to_f16(x).to_le_bytes());
    }
    Ok(())
}

/// IEEE half bits to f32 (exact).
fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        // A subnormal half is man * 2^-24, exact in f32.
        (0, m) => return (m as f32) * f32::powi(2.0, -24) * sign_of(h),
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

fn sign_of(h: u16) -> f32 {
    if h & 0x8000 != 0 {
        -1.0
    } else {
        1.0
    }
}

/// f32 to IEEE half bits, rounding to nearest even (as `c10::Half`'s conversion).
fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let a = x.abs();
    if a.is_nan() {
        return sign | 0x7e00 | ((bits >> 13) & 0x3ff) as u16;
    }
    if a >= 65520.0 {
        return sign | 0x7c00; // past the largest half after rounding: infinity
    }
    if a < f32::powi(2.0, -14) {
        // Subnormal (or zero): a multiple of 2^-24, rounded to even by f32 arithmetic.
        let m = (a * f32::powi(2.0, 24)).round_ties_even() as u16;
        return sign | m;
    }
    let abits = a.to_bits();
    let exp = (abits >> 23) - 112;
    let man = abits & 0x7f_ffff;
    let mut h = (exp << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        h += 1; // a carry into the exponent is still the right value
    }
    sign | h as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_round_trip_through_f32() {
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            if x.is_nan() {
                assert!(f32_to_f16(x) & 0x7c00 == 0x7c00 && f32_to_f16(x) & 0x3ff != 0);
            } else {
                assert_eq!(f32_to_f16(x), h, "{h:#06x}");
            }
        }
    }

    #[test]
    fn f32_rounds_to_nearest_even_half() {
        assert_eq!(f32_to_f16(1.0 + f32::powi(2.0, -11)), 0x3c00); // a tie: to even
        assert_eq!(f32_to_f16(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
    }
}
