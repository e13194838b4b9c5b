//! Values the host knows (RFC 0012): the elements of small integer storages that came from host
//! memory (uploads) or from ops the host can follow on them (fills, `arange`, copies and casts of
//! known values, written whole or through a view). An index tensor's range is then checked when
//! its op is captured, so PyTorch's error comes at the op in every mode, with no device read.
//!
//! Known values carry the storage version they describe, and every write bumps a storage's
//! version: a write the host does not follow leaves them stale, whichever path made it.

use super::*;
use ops::param_layout as layout;
use ops::Params;

/// At most this many elements are followed per storage: index lists, labels and small token
/// batches, not datasets (a copy of each is kept on the host).
const KNOWN_ELEMENTS_LIMIT: i64 = 4096;

/// A storage's elements as the host knows them.
#[derive(Clone, Debug)]
pub(crate) struct KnownValues {
    /// The storage version they describe.
    version: u64,
    dtype: DType,
    /// Every element of the storage, widened to i64.
    values: Vec<i64>,
}

/// What an op about to be captured leaves in the storage it writes.
pub(super) struct KnownWrite {
    /// The `out=` storage; `None`: the op's new storage.
    target: Option<StorageId>,
    dtype: DType,
    /// The storage's elements after the write.
    values: Vec<i64>,
}

/// Whether the host follows values of `dtype`: the integer types an i64 holds exactly.
fn followed(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::U8 | DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::U16 | DType::U32
    )
}

/// `v` stored as a `dtype` element, wrapping as PyTorch's integer casts do.
fn wrap(v: i64, dtype: DType) -> i64 {
    match dtype {
        DType::U8 => v as u8 as i64,
        DType::I8 => v as i8 as i64,
        DType::I16 => v as i16 as i64,
        DType::I32 => v as i32 as i64,
        DType::U16 => v as u16 as i64,
        DType::U32 => v as u32 as i64,
        _ => v,
    }
}

/// The `dtype` elements in `bytes` (host byte order), widened to i64.
fn decode(bytes: &[u8], dtype: DType) -> Option<Vec<i64>> {
    let size = dtype.size_bytes();
    if !bytes.len().is_multiple_of(size) {
        return None;
    }
    let values = bytes.chunks_exact(size).map(|b| match dtype {
        DType::U8 => b[0] as i64,
        DType::I8 => b[0] as i8 as i64,
        DType::I16 => i16::from_ne_bytes([b[0], b[1]]) as i64,
        DType::U16 => u16::from_ne_bytes([b[0], b[1]]) as i64,
        DType::I32 => i32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as i64,
        DType::U32 => u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as i64,
        _ => i64::from_ne_bytes(b.try_into().expect("8 bytes")),
    });
    Some(values.collect())
}

/// A scalar's value when it is a whole number (`ones` fills with the float 1.0); a fraction is
/// left alone rather than rounded as the device would.
fn integer_value(scalar: &ScalarArg) -> Option<i64> {
    match scalar.value {
        ops::ScalarValue::Int(v) => Some(v),
        ops::ScalarValue::Bool(b) => Some(b as i64),
        ops::ScalarValue::Float(x) => whole(x).then_some(x as i64),
    }
}

/// Whether `x` is a whole number an i64 holds exactly.
fn whole(x: f64) -> bool {
    x.fract() == 0.0 && x.abs() < 9e15
}

/// The positions in its storage (in elements) of `t`'s elements, in row-major order; `None`
/// when one falls outside `0..len`.
fn positions(t: &TensorRef, len: usize) -> Option<Vec<usize>> {
    if t.sizes.len() != t.strides.len() {
        return None;
    }
    let n = usize::try_from(t.numel()).ok()?;
    let mut out = Vec::with_capacity(n);
    let rank = t.sizes.len();
    let mut index: SmallVec<[i64; 6]> = SmallVec::from_elem(0, rank);
    let mut at = t.offset;
    for _ in 0..n {
        out.push(usize::try_from(at).ok().filter(|&p| p < len)?);
        // The next index in row-major order: the last dim moves fastest.
        for d in (0..rank).rev() {
            index[d] += 1;
            at += t.strides[d];
            if index[d] < t.sizes[d] {
                break;
            }
            at -= t.strides[d] * t.sizes[d];
            index[d] = 0;
        }
    }
    Some(out)
}

/// Whether `t` is every element of a storage of `nbytes` bytes, in order.
fn covers(t: &TensorRef, nbytes: u64) -> bool {
    t.offset == 0
        && t.contiguous_numel()
            .is_some_and(|n| n as u64 * t.dtype.size_bytes() as u64 == nbytes)
}

impl<V: Clone> Graph<V> {
    /// Records that `t`, which covers its whole storage, was just written with `bytes` from
    /// host memory. Kept only for small integer tensors.
    pub fn note_uploaded(&mut self, t: &TensorRef, bytes: &[u8]) {
        if !followed(t.dtype) || t.numel() > KNOWN_ELEMENTS_LIMIT {
            return;
        }
        let Some(storage) = self.storages.get_mut(&t.storage) else {
            return;
        };
        if !covers(t, storage.nbytes) {
            return;
        }
        storage.known = decode(bytes, t.dtype).map(|values| {
            Box::new(KnownValues {
                version: storage.version,
                dtype: t.dtype,
                values,
            })
        });
    }

    /// `t`'s elements in row-major order, widened to i64, when the host knows its storage's
    /// current value.
    pub fn known_elements(&self, t: &TensorRef) -> Option<Vec<i64>> {
        let storage = self.storages.get(&t.storage)?;
        let known = storage
            .known
            .as_deref()
            .filter(|k| k.version == storage.version && k.dtype == t.dtype)?;
        let at = positions(t, known.values.len())?;
        Some(at.into_iter().map(|p| known.values[p]).collect())
    }

    /// What `op` leaves in the storage it writes, when the host can follow it: a fill or an
    /// `arange` of a small integer tensor, or a copy or integer cast of known values. Called
    /// before the op is captured, since a write through a view keeps the rest of the old value.
    /// Inlined: every op asks, on Strict's direct path too, and nearly every answer is no.
    #[inline]
    pub(super) fn known_write(
        &self,
        op: OpId,
        inputs: &[TensorRef],
        scalars: &[ScalarArg],
        params: &[i64],
        outs: &[TensorRef],
    ) -> Option<KnownWrite> {
        if !matches!(
            op,
            OpId::Full | OpId::Zeros | OpId::Ones | OpId::Arange | OpId::Clone | OpId::Convert
        ) || outs.len() > 1
        {
            return None;
        }
        self.followed_write(op, inputs, scalars, params, outs)
    }

    fn followed_write(
        &self,
        op: OpId,
        inputs: &[TensorRef],
        scalars: &[ScalarArg],
        params: &[i64],
        outs: &[TensorRef],
    ) -> Option<KnownWrite> {
        let p = Params::new(op, params);
        let (dtype, result): (DType, Vec<i64>) = match op {
            OpId::Full | OpId::Zeros | OpId::Ones => {
                let layout::Creation { dtype, sizes } = layout::Creation::decode(&p).ok()?;
                let n: i64 = sizes.iter().product();
                if !followed(dtype) || !(0..=KNOWN_ELEMENTS_LIMIT).contains(&n) {
                    return None;
                }
                let value = match op {
                    OpId::Zeros => 0,
                    OpId::Ones => 1,
                    _ => integer_value(scalars.first()?)?,
                };
                (dtype, vec![wrap(value, dtype); n as usize])
            }
            OpId::Arange => {
                let range = layout::ArangeRange::decode(&p).ok()?;
                if !followed(range.dtype) || !whole(range.start) || !whole(range.step) {
                    return None;
                }
                // The length as the op's meta computes it (its errors are the capture's).
                let meta = ops::meta(op, &[], scalars, params).ok()?;
                let n = meta.outputs.first()?.numel();
                if n > KNOWN_ELEMENTS_LIMIT {
                    return None;
                }
                let (start, step) = (range.start as i64, range.step as i64);
                let values = (0..n).map(|i| wrap(start + i * step, range.dtype));
                (range.dtype, values.collect())
            }
            _ => {
                let src = inputs.first()?;
                let dtype = if op == OpId::Clone {
                    src.dtype
                } else {
                    layout::ConvertTo::decode(&p).ok()?.dtype
                };
                if !followed(dtype) || src.numel() > KNOWN_ELEMENTS_LIMIT {
                    return None;
                }
                let values = self.known_elements(src)?;
                (dtype, values.into_iter().map(|v| wrap(v, dtype)).collect())
            }
        };
        let Some(out) = outs.first() else {
            return Some(KnownWrite {
                target: None,
                dtype,
                values: result,
            });
        };
        if out.dtype != dtype || out.numel() != result.len() as i64 {
            return None;
        }
        let storage = self.storages.get(&out.storage)?;
        if covers(out, storage.nbytes) {
            return Some(KnownWrite {
                target: Some(out.storage),
                dtype,
                values: result,
            });
        }
        // A write through a view: the rest of the storage must be known too.
        let known = storage
            .known
            .as_deref()
            .filter(|k| k.version == storage.version && k.dtype == dtype)?;
        let mut values = known.values.clone();
        for (at, v) in positions(out, values.len())?.into_iter().zip(result) {
            values[at] = v;
        }
        Some(KnownWrite {
            target: Some(out.storage),
            dtype,
            values,
        })
    }

    /// Keeps what [`Graph::known_write`] computed, now that the op was captured (or run), at
    /// the version its write gave the storage.
    pub(super) fn remember_known(&mut self, write: KnownWrite, captured: &Captured) {
        let Some(id) = write
            .target
            .or_else(|| captured.outputs.first().map(|&(storage, _)| storage))
        else {
            return;
        };
        let Some(storage) = self.storages.get_mut(&id) else {
            return;
        };
        let elements = storage.nbytes / write.dtype.size_bytes() as u64;
        if elements != write.values.len() as u64 {
            return;
        }
        storage.known = Some(Box::new(KnownValues {
            version: storage.version,
            dtype: write.dtype,
            values: write.values,
        }));
    }
}
