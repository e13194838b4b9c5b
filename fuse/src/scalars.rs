//! Lifted value scalars: each region passes its scalars as one packed 1-D buffer per dtype, so a
//! changed learning rate or alpha is new data, not a new program.

use ops::{DType, ScalarArg, ScalarValue};
use smallvec::SmallVec;

/// A pack's bytes: inline up to two 64-bit scalars, so an op-by-op run allocates none.
pub type PackBytes = SmallVec<[u8; 16]>;
/// Slots of a region's scalars: inline for the few of one op.
pub type ScalarSlots = SmallVec<[ScalarSlot; 4]>;
/// One pack per dtype: inline for the usual single dtype.
pub type ScalarPacks = SmallVec<[ScalarPack; 1]>;

/// Where one lifted scalar lives: which packed buffer (by dtype) and which element of it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScalarSlot {
    pub dtype: DType,
    pub index: u32,
}

/// The packed host bytes of one dtype's scalars, in slot order.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalarPack {
    pub dtype: DType,
    pub count: u32,
    pub bytes: PackBytes,
}

fn encode(dtype: DType, value: ScalarValue, out: &mut PackBytes) {
    let f = value.as_f64();
    let i = value.as_i64();
    match dtype {
        DType::Bool => out.push(u8::from(!value.is_zero())),
        DType::U8 => out.push(i as u8),
        DType::I8 => out.push(i as i8 as u8),
        DType::I16 => out.extend_from_slice(&(i as i16).to_le_bytes()),
        DType::I32 => out.extend_from_slice(&(i as i32).to_le_bytes()),
        DType::I64 => out.extend_from_slice(&i.to_le_bytes()),
        // A uint64 past i64's range arrives as its two's complement bits.
        DType::U16 => out.extend_from_slice(&(i as u16).to_le_bytes()),
        DType::U32 => out.extend_from_slice(&(i as u32).to_le_bytes()),
        DType::U64 => out.extend_from_slice(&(i as u64).to_le_bytes()),
        DType::F16 => out.extend_from_slice(&f32_to_f16_bits(f as f32).to_le_bytes()),
        DType::BF16 => out.extend_from_slice(&f32_to_bf16_bits(f as f32).to_le_bytes()),
        DType::F32 => out.extend_from_slice(&(f as f32).to_le_bytes()),
        DType::F64 => out.extend_from_slice(&f.to_le_bytes()),
        // A real scalar in a complex computation: its imaginary part is 0. complex32 is
        // complex64 on the device.
        DType::C32 | DType::C64 => {
            out.extend_from_slice(&(f as f32).to_le_bytes());
            out.extend_from_slice(&0f32.to_le_bytes());
        }
        DType::C128 => {
            out.extend_from_slice(&f.to_le_bytes());
            out.extend_from_slice(&0f64.to_le_bytes());
        }
    }
}

/// Round-to-nearest-even f32 → bf16.
fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x40;
    }
    let rounding = 0x7fff + ((bits >> 16) & 1);
    ((bits + rounding) >> 16) as u16
}

/// Round-to-nearest-even f32 → IEEE half.
fn f32_to_f16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut out = (m >> shift) as u16;
        if rest > half || (rest == half && out & 1 == 1) {
            out += 1;
        }
        return sign | out;
    }
    let mut out = ((e as u32) << 10 | (mant >> 13)) as u16;
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && out & 1 == 1) {
        out += 1;
    }
    sign | out
}

/// Assigns every scalar a slot and packs their values, one buffer per dtype in first-use order.
/// `scalars` is `(value, lifted dtype)` in region order.
pub fn pack_scalars(scalars: &[(ScalarArg, DType)]) -> (ScalarSlots, ScalarPacks) {
    let mut packs = ScalarPacks::new();
    let mut slots = ScalarSlots::with_capacity(scalars.len());
    for (scalar, dtype) in scalars {
        let pack = match packs.iter_mut().position(|p| p.dtype == *dtype) {
            Some(i) => &mut packs[i],
            None => {
                packs.push(ScalarPack {
                    dtype: *dtype,
                    count: 0,
                    bytes: PackBytes::new(),
                });
                packs.last_mut().unwrap()
            }
        };
        slots.push(ScalarSlot {
            dtype: *dtype,
            index: pack.count,
        });
        encode(*dtype, scalar.value, &mut pack.bytes);
        pack.count += 1;
    }
    (slots, packs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pack_per_dtype_in_first_use_order() {
        let (slots, packs) = pack_scalars(&[
            (ScalarArg::float(0.5), DType::F32),
            (ScalarArg::int(3), DType::I64),
            (ScalarArg::float(2.0), DType::F32),
        ]);
        assert_eq!(packs.len(), 2);
        assert_eq!(packs[0].dtype, DType::F32);
        assert_eq!(packs[0].count, 2);
        assert_eq!(packs[0].bytes.len(), 8);
        assert_eq!(&packs[0].bytes[4..], &2.0f32.to_le_bytes());
        assert_eq!(packs[1].bytes.as_slice(), 3i64.to_le_bytes());
        assert_eq!(
            slots[2],
            ScalarSlot {
                dtype: DType::F32,
                index: 1
            }
        );
    }

    #[test]
    fn reduced_floats_round_to_nearest_even() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        assert_eq!(f32_to_bf16_bits(-2.5), 0xc020);
        assert_eq!(f32_to_f16_bits(1.0), 0x3c00);
        assert_eq!(f32_to_f16_bits(65504.0), 0x7bff);
        assert_eq!(f32_to_f16_bits(1e6), 0x7c00);
        assert_eq!(f32_to_f16_bits(5.960_464_5e-8), 0x0001);
        assert_eq!(f32_to_f16_bits(-0.0), 0x8000);
    }
}
