//! Property tests of the engine: random programs of reads, ops and writes through views, run in
//! Strict, Debug and DeferAndFuse, compared bit for bit with `views::reference::StridedMemory`
//! (PyTorch's strided read/write semantics). Every case runs twice, on two sets of data; where
//! region keys are deterministic (DeferAndFuse materialized after each step) the second run must
//! compile nothing and hit the cache at every execution.
//!
//! Base shapes and view patterns come from a fixed pool, so the number of distinct compiled
//! regions stays small. Values are small integers in f32; the ops used (add of small values, neg,
//! multiplication by 2, fill, copy) are exact in f32, and the integer views of the f32 storage
//! only step exponents (add `k << 23` to an i32 view, `k << 7` to the high i16 half), so no
//! program reaches a denormal, an infinity or a NaN and every mode must agree bit for bit.

mod engine_support;

use defer::{Mode, TensorRef};
use engine_support::{download, engine_with, metric, output, upload, view_as};
use ops::{DType, OpId, ScalarArg};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use std::collections::HashSet;
use torch_glue::Engine;
use views::eval::HostArray;
use views::reference::StridedMemory;
use views::Layout;

/// Cases per property when `PROPTEST_CASES` is not set; each case runs in every mode of its
/// property, twice (on two sets of data).
const DEFAULT_CASES: u32 = 150;

/// One view of a base storage, written as the PyTorch expression that makes it.
struct Pattern {
    name: &'static str,
    dtype: DType,
    sizes: &'static [i64],
    strides: &'static [i64],
    offset: i64,
}

const fn p(
    name: &'static str,
    dtype: DType,
    sizes: &'static [i64],
    strides: &'static [i64],
    offset: i64,
) -> Pattern {
    Pattern {
        name,
        dtype,
        sizes,
        strides,
        offset,
    }
}

struct Base {
    name: &'static str,
    sizes: &'static [i64],
    patterns: &'static [Pattern],
}

use DType::{F32, I16, I32};

const BASES: &[Base] = &[
    Base {
        name: "x = f32[6, 8]",
        sizes: &[6, 8],
        patterns: &[
            p("x", F32, &[6, 8], &[8, 1], 0),
            p("x.t()", F32, &[8, 6], &[1, 8], 0),
            p("x[:, 1::2]", F32, &[6, 4], &[8, 2], 1),
            p("x[1:5, 2:6]", F32, &[4, 4], &[8, 1], 10),
            p("x[::2, ::3]", F32, &[3, 3], &[16, 3], 0),
            p("x.diagonal()", F32, &[6], &[9], 0),
            p("x.diagonal(1)", F32, &[6], &[9], 1),
            p("x[2]", F32, &[8], &[1], 16),
            p("x[:, 3]", F32, &[6], &[8], 3),
            p("x.narrow(0, 1, 3)", F32, &[3, 8], &[8, 1], 8),
            p("x.split(2, 1)[3]", F32, &[6, 2], &[8, 1], 6),
            p(
                "x.view(2, 3, 8).permute(2, 0, 1)",
                F32,
                &[8, 2, 3],
                &[1, 24, 8],
                0,
            ),
            p("x[1::2].t()[::2]", F32, &[4, 3], &[2, 16], 8),
            p("x.view(6, 2, 4)[..., 1]", F32, &[6, 2], &[8, 4], 1),
            p("x[4:, None, 1:7:2]", F32, &[2, 1, 3], &[8, 5, 2], 33),
            p("x.as_strided((4, 3), (5, 3), 2)", F32, &[4, 3], &[5, 3], 2),
            p("x.as_strided((3, 3), (7, 2), 1)", F32, &[3, 3], &[7, 2], 1),
            p("x.as_strided((5, 4), (2, 1))", F32, &[5, 4], &[2, 1], 0),
            p("x[3].expand(4, 8)", F32, &[4, 8], &[0, 1], 24),
            p("x[:, 2:3].expand(6, 5)", F32, &[6, 5], &[8, 0], 2),
            p("x.view(torch.int32)", I32, &[6, 8], &[8, 1], 0),
            p("x.view(torch.int32)[1::2, ::2]", I32, &[3, 4], &[16, 2], 8),
            p("x.view(torch.int32).t()[2:5]", I32, &[3, 6], &[1, 8], 2),
            p("x.view(torch.int16)[:, 1::2]", I16, &[6, 8], &[16, 2], 1),
            p("x.view(torch.int16)[2:4, 1::4]", I16, &[2, 4], &[16, 4], 33),
            p("x[:, 8:]", F32, &[6, 0], &[8, 1], 8),
        ],
    },
    Base {
        name: "y = f32[3, 4, 5]",
        sizes: &[3, 4, 5],
        patterns: &[
            p("y", F32, &[3, 4, 5], &[20, 5, 1], 0),
            p("y.permute(2, 0, 1)", F32, &[5, 3, 4], &[1, 20, 5], 0),
            p("y[:, 1:3, ::2]", F32, &[3, 2, 3], &[20, 5, 2], 5),
            p("y[1]", F32, &[4, 5], &[5, 1], 20),
            p("y[:, :, 4]", F32, &[3, 4], &[20, 5], 4),
            p("y.diagonal(0, 1, 2)", F32, &[3, 4], &[20, 6], 0),
            p("y.transpose(0, 2)[1:4]", F32, &[3, 4, 3], &[1, 5, 20], 1),
            p("y[2, 1:3, 1:4].t()", F32, &[3, 2], &[1, 5], 46),
            p("y.view(-1)[7:19:3]", F32, &[4], &[3], 7),
            p(
                "y.as_strided((2, 2, 2), (13, 4, 1), 3)",
                F32,
                &[2, 2, 2],
                &[13, 4, 1],
                3,
            ),
            p("y.unfold(2, 2, 1)", F32, &[3, 4, 4, 2], &[20, 5, 1, 1], 0),
            p("y[0, 0].expand(3, 5)", F32, &[3, 5], &[0, 1], 0),
            p("y.view(torch.int32)[2, 1::2]", I32, &[2, 5], &[10, 1], 45),
            p(
                "y.view(torch.int16)[..., 1::2]",
                I16,
                &[3, 4, 5],
                &[40, 10, 2],
                1,
            ),
        ],
    },
];

/// An elementwise op exact on the values these programs make.
#[derive(Clone, Copy, Debug)]
enum Unary {
    Neg,
    Double,
    Shift(u8),
}

/// One program step; view indices are taken modulo the number of candidates.
#[derive(Clone, Debug)]
enum Step {
    /// `dst.op_()`
    InPlace { dst: usize, op: Unary },
    /// `dst.fill_(v)`: a masked-fill-like write.
    Fill { dst: usize, value: u8 },
    /// `dst.copy_(op(src))`: an index-like write of a computed value.
    CopyFrom { src: usize, op: Unary, dst: usize },
    /// `dst.add_(src)`, `src` broadcast to `dst`.
    AddInto { dst: usize, src: usize },
    /// A host read through a view.
    Read { src: usize },
}

#[derive(Clone, Debug)]
struct Case {
    base: usize,
    steps: Vec<Step>,
    seed: u64,
}

fn unary() -> impl Strategy<Value = Unary> {
    prop_oneof![
        Just(Unary::Neg),
        Just(Unary::Double),
        (0u8..3).prop_map(Unary::Shift)
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let index = || 0usize..64;
    prop_oneof![
        3 => (index(), unary()).prop_map(|(dst, op)| Step::InPlace { dst, op }),
        2 => (index(), 0u8..3).prop_map(|(dst, value)| Step::Fill { dst, value }),
        3 => (index(), unary(), index()).prop_map(|(src, op, dst)| Step::CopyFrom { src, op, dst }),
        2 => (index(), index()).prop_map(|(dst, src)| Step::AddInto { dst, src }),
        1 => index().prop_map(|src| Step::Read { src }),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..BASES.len(),
        prop::collection::vec(step(), 1..=5),
        any::<u64>(),
    )
        .prop_map(|(base, steps, seed)| Case { base, steps, seed })
}

// ----- the host model -----

fn layout(pattern: &Pattern) -> Layout {
    Layout::new(
        pattern.dtype.size_bytes(),
        pattern.sizes,
        pattern.strides,
        pattern.offset,
    )
}

fn numel(sizes: &[i64]) -> i64 {
    sizes.iter().product()
}

/// Row-major strides.
fn contiguous(sizes: &[i64]) -> Vec<i64> {
    let mut strides = vec![1; sizes.len()];
    for i in (0..sizes.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * sizes[i + 1].max(1);
    }
    strides
}

/// Byte ranges touched by each element of a view.
fn footprint(l: &Layout) -> HashSet<i64> {
    let mut out = HashSet::new();
    let n = numel(&l.sizes);
    for flat in 0..n {
        let mut rest = flat;
        let mut element = l.offset;
        for d in (0..l.sizes.len()).rev() {
            element += (rest % l.sizes[d]) * l.strides[d];
            rest /= l.sizes[d];
        }
        let start = element * l.elem_size as i64;
        out.extend(start..start + l.elem_size as i64);
    }
    out
}

fn dense(l: &Layout) -> bool {
    views::is_non_overlapping_and_dense(&l.sizes, &l.strides)
}

/// PyTorch's `has_internal_overlap` answers `Yes`: a stride-0 dim of size > 1.
fn expanded(l: &Layout) -> bool {
    l.sizes
        .iter()
        .zip(&l.strides)
        .any(|(&n, &s)| n > 1 && s == 0)
}

/// Elements share memory with each other (whether or not PyTorch can tell).
fn self_overlapping(l: &Layout) -> bool {
    footprint(l).len() as i64 != numel(&l.sizes) * l.elem_size as i64
}

/// PyTorch's `get_overlap_status(a, b)` for two tensors of one storage.
#[derive(Debug, PartialEq)]
enum Overlap {
    Full,
    Partial,
    No,
    TooHard,
}

fn overlap(a: &Layout, b: &Layout) -> Overlap {
    if numel(&a.sizes) == 0 || numel(&b.sizes) == 0 {
        return Overlap::No;
    }
    if !dense(a) || !dense(b) {
        return Overlap::TooHard;
    }
    let range = |l: &Layout| {
        let begin = l.offset * l.elem_size as i64;
        (begin, begin + numel(&l.sizes) * l.elem_size as i64)
    };
    let (a0, a1) = range(a);
    let (b0, b1) = range(b);
    if a0 == b0 && a1 == b1 {
        if a.strides == b.strides {
            Overlap::Full
        } else {
            Overlap::Partial
        }
    } else if a0 < b1 && b0 < a1 {
        Overlap::Partial
    } else {
        Overlap::No
    }
}

/// `src` broadcasts to `dst` (right-aligned, each dim 1 or equal).
fn broadcasts(src: &[i64], dst: &[i64]) -> bool {
    src.len() <= dst.len()
        && src
            .iter()
            .rev()
            .zip(dst.iter().rev())
            .all(|(&s, &d)| s == 1 || s == d)
}

/// The engine op and scalars of `op` on a view of `dtype`.
fn engine_unary(op: Unary, dtype: DType) -> (OpId, Vec<ScalarArg>) {
    match (op, dtype) {
        (Unary::Neg, _) => (OpId::Neg, vec![]),
        (Unary::Double, F32) => (OpId::Mul, vec![ScalarArg::float(2.0)]),
        (Unary::Shift(k), F32) => (OpId::Add, vec![ScalarArg::float(f32_shift(k) as f64)]),
        (_, I32) => (OpId::Add, vec![ScalarArg::int(i32_shift(op) as i64)]),
        (_, I16) => (OpId::Add, vec![ScalarArg::int(128)]),
        (_, other) => panic!("no {op:?} for {other:?}"),
    }
}

fn f32_shift(k: u8) -> f32 {
    [1.0, -3.0, 0.5][k as usize % 3]
}

/// Adds one or two to the exponent of the f32 whose bits the i32 holds.
fn i32_shift(op: Unary) -> i32 {
    match op {
        Unary::Shift(k) if k % 2 == 1 => 2 << 23,
        _ => 1 << 23,
    }
}

fn host_unary(op: Unary, dtype: DType, value: &HostArray) -> HostArray {
    let bytes: Vec<u8> = match dtype {
        F32 => value
            .bytes
            .chunks_exact(4)
            .flat_map(|c| {
                let x = f32::from_le_bytes(c.try_into().unwrap());
                let y = match op {
                    Unary::Neg => -x,
                    Unary::Double => x * 2.0,
                    Unary::Shift(k) => x + f32_shift(k),
                };
                y.to_le_bytes()
            })
            .collect(),
        I32 => value
            .bytes
            .chunks_exact(4)
            .flat_map(|c| {
                let x = i32::from_le_bytes(c.try_into().unwrap());
                let y = match op {
                    Unary::Neg => x.wrapping_neg(),
                    _ => x.wrapping_add(i32_shift(op)),
                };
                y.to_le_bytes()
            })
            .collect(),
        I16 => value
            .bytes
            .chunks_exact(2)
            .flat_map(|c| {
                let x = i16::from_le_bytes(c.try_into().unwrap());
                let y = match op {
                    Unary::Neg => x.wrapping_neg(),
                    _ => x.wrapping_add(128),
                };
                y.to_le_bytes()
            })
            .collect(),
        other => panic!("no host op for {other:?}"),
    };
    HostArray::new(value.elem_size, &value.shape, bytes)
}

/// Fill values: small f32s, or (through integer views) the bits of normal f32s.
fn fill_value(dtype: DType, v: u8) -> (ScalarArg, Vec<u8>) {
    let f = [-2.0f32, 3.0, 0.5][v as usize % 3];
    match dtype {
        F32 => (ScalarArg::float(f as f64), f.to_le_bytes().to_vec()),
        I32 => {
            let bits = f.to_bits() as i32;
            (ScalarArg::int(bits as i64), bits.to_le_bytes().to_vec())
        }
        I16 => {
            let high = (f.to_bits() >> 16) as u16 as i16;
            (ScalarArg::int(high as i64), high.to_le_bytes().to_vec())
        }
        other => panic!("no fill for {other:?}"),
    }
}

/// Distinct nonzero small integers in f32, from a seed.
fn base_values(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = (state >> 40) % 16;
            let v = if v == 7 { 8.0f32 } else { v as f32 - 7.0 };
            v.to_le_bytes()
        })
        .collect()
}

// ----- driving the engine and the model together -----

const INTERNAL: &str = "more than one element of the written-to tensor";
const PARTIAL: &str = "some elements of the input tensor and the written-to tensor";

struct Run<'a> {
    e: &'a Engine,
    mode: Mode,
    base: &'static Base,
    patterns: &'a [&'static Pattern],
    x: TensorRef,
    memory: StridedMemory,
    log: Vec<String>,
}

impl Run<'_> {
    fn tensor(&self, pattern: &Pattern) -> TensorRef {
        view_as(
            &self.x,
            pattern.dtype,
            pattern.sizes,
            pattern.strides,
            pattern.offset,
        )
    }

    fn context(&self) -> String {
        format!(
            "{:?} on {}: {}",
            self.mode,
            self.base.name,
            self.log.join("; ")
        )
    }

    /// An engine op that must fail with `message`, leaving the base as it was.
    fn expect_error(
        &self,
        result: Result<defer::Captured, defer::EngineError>,
        message: &str,
    ) -> Result<(), TestCaseError> {
        match result {
            Ok(_) => Err(TestCaseError::fail(format!(
                "expected an error containing {message:?}, the engine accepted it; {}",
                self.context()
            ))),
            Err(err) if err.message.contains(message) => Ok(()),
            Err(err) => Err(TestCaseError::fail(format!(
                "expected an error containing {message:?}, got {:?}; {}",
                err.message,
                self.context()
            ))),
        }
    }

    fn op(
        &self,
        op: OpId,
        inputs: &[TensorRef],
        scalars: &[ScalarArg],
        outs: &[TensorRef],
    ) -> Result<defer::Captured, TestCaseError> {
        self.e
            .op(op, inputs, scalars, &[], outs)
            .map_err(|err| TestCaseError::fail(format!("{}: {}", err.message, self.context())))
    }

    fn step(&mut self, step: &Step) -> Result<(), TestCaseError> {
        let patterns = self.patterns;
        let pick = |i: usize, filter: &dyn Fn(&Pattern) -> bool| -> Option<&'static Pattern> {
            let candidates: Vec<&'static Pattern> =
                patterns.iter().copied().filter(|p| filter(p)).collect();
            (!candidates.is_empty()).then(|| candidates[i % candidates.len()])
        };
        match *step {
            Step::InPlace { dst, op } => {
                let d = patterns[dst % patterns.len()];
                let l = layout(d);
                let t = self.tensor(d);
                let (op_id, scalars) = engine_unary(op, d.dtype);
                if expanded(&l) {
                    self.log.push(format!("{}.{op:?}_() -> error", d.name));
                    let t = std::slice::from_ref(&t);
                    let result = self.e.op(op_id, t, &scalars, &[], t);
                    return self.expect_error(result, INTERNAL);
                }
                if self_overlapping(&l) {
                    // PyTorch's result then depends on its iteration order.
                    return Ok(());
                }
                self.log.push(format!("{}.{op:?}_()", d.name));
                self.op(
                    op_id,
                    std::slice::from_ref(&t),
                    &scalars,
                    std::slice::from_ref(&t),
                )?;
                let value = host_unary(op, d.dtype, &self.memory.read(&l));
                self.memory.write(&l, &value);
            }
            Step::Fill { dst, value } => {
                let d = patterns[dst % patterns.len()];
                let l = layout(d);
                if expanded(&l) {
                    // PyTorch fills expanded tensors; the engine refuses (see views_engine_parity.rs).
                    return Ok(());
                }
                let t = self.tensor(d);
                let (scalar, element) = fill_value(d.dtype, value);
                self.log.push(format!("{}.fill_({scalar:?})", d.name));
                self.op(
                    OpId::Fill,
                    std::slice::from_ref(&t),
                    &[scalar],
                    std::slice::from_ref(&t),
                )?;
                let n = numel(d.sizes) as usize;
                let bytes = element.repeat(n);
                self.memory
                    .write(&l, &HostArray::new(l.elem_size, d.sizes, bytes));
            }
            Step::CopyFrom { src, op, dst } => {
                let s = patterns[src % patterns.len()];
                let dtype = s.dtype;
                let d = pick(dst, &|p| p.dtype == dtype).expect("src itself qualifies");
                let (sl, dl) = (layout(s), layout(d));
                let (op_id, scalars) = engine_unary(op, dtype);
                let (sn, dn) = (numel(s.sizes), numel(d.sizes));
                if sn == 0 && dn > 0 {
                    return Ok(());
                }
                self.log
                    .push(format!("{}.copy_({}.{op:?}())", d.name, s.name));
                let computed = self.op(op_id, &[self.tensor(s)], &scalars, &[])?;
                let temp = output(&computed);
                let temp_value = host_unary(op, dtype, &self.memory.read(&sl));
                // The source as dst's shape: a reshaped prefix, or the last element broadcast.
                let (strides, offset) = if sn >= dn {
                    (contiguous(d.sizes), 0)
                } else {
                    (vec![0; d.sizes.len()], sn - 1)
                };
                let source = view_as(&temp, dtype, d.sizes, &strides, offset);
                let source_value = StridedMemory::new(temp_value.bytes).read(&Layout::new(
                    dtype.size_bytes(),
                    d.sizes,
                    &strides,
                    offset,
                ));
                let t = self.tensor(d);
                let result = self.e.op(OpId::Copy, &[t.clone(), source], &[], &[], &[t]);
                if expanded(&dl) {
                    self.log.push("-> error".into());
                    self.expect_error(result, INTERNAL)?;
                } else {
                    result.map_err(|err| {
                        TestCaseError::fail(format!("{}: {}", err.message, self.context()))
                    })?;
                    self.memory.write(&dl, &source_value);
                }
                self.e.release_storage(temp.storage).expect("release");
            }
            Step::AddInto { dst, src } => {
                let Some(d) = pick(dst, &|p| p.dtype == F32) else {
                    return Ok(());
                };
                let s = pick(src, &|p| p.dtype == F32 && broadcasts(p.sizes, d.sizes))
                    .expect("dst itself qualifies");
                let (dl, sl) = (layout(d), layout(s));
                let (dt, st) = (self.tensor(d), self.tensor(s));
                let same = std::ptr::eq(d, s);
                if expanded(&dl) {
                    self.log
                        .push(format!("{}.add_({}) -> error", d.name, s.name));
                    let result = self.e.op(OpId::Add, &[dt.clone(), st], &[], &[], &[dt]);
                    return self.expect_error(result, INTERNAL);
                }
                if self_overlapping(&dl) {
                    return Ok(());
                }
                let status = if same {
                    Overlap::Full
                } else {
                    overlap(&dl, &sl)
                };
                if status == Overlap::Partial {
                    if whole(self.base, d) {
                        // PyTorch raises; the engine checks overlap only for outputs that are
                        // not their storage's whole value (see views_engine_parity.rs).
                        return Ok(());
                    }
                    self.log
                        .push(format!("{}.add_({}) -> error", d.name, s.name));
                    let result = self.e.op(OpId::Add, &[dt.clone(), st], &[], &[], &[dt]);
                    return self.expect_error(result, PARTIAL);
                }
                if status != Overlap::Full && !footprint(&dl).is_disjoint(&footprint(&sl)) {
                    // Shared memory PyTorch cannot see: the result depends on its iteration order.
                    return Ok(());
                }
                self.log.push(format!("{}.add_({})", d.name, s.name));
                self.op(OpId::Add, &[dt.clone(), st], &[], &[dt])?;
                let a = self.memory.read(&dl);
                // src broadcast to dst's shape: stride 0 on the new and size-1 dims.
                let extra = d.sizes.len() - s.sizes.len();
                let mut strides = vec![0; extra];
                for (&n, &st) in s.sizes.iter().zip(s.strides) {
                    strides.push(if n == 1 { 0 } else { st });
                }
                let b = self
                    .memory
                    .read(&Layout::new(4, d.sizes, &strides, s.offset));
                let sum: Vec<u8> = a
                    .bytes
                    .chunks_exact(4)
                    .zip(b.bytes.chunks_exact(4))
                    .flat_map(|(x, y)| {
                        let x = f32::from_le_bytes(x.try_into().unwrap());
                        let y = f32::from_le_bytes(y.try_into().unwrap());
                        (x + y).to_le_bytes()
                    })
                    .collect();
                self.memory.write(&dl, &HostArray::new(4, d.sizes, sum));
            }
            Step::Read { src } => {
                let s = patterns[src % patterns.len()];
                if numel(s.sizes) == 0 {
                    // Reading an empty strided view overflows the stack (views_engine_parity.rs).
                    return Ok(());
                }
                self.log.push(format!("read {}", s.name));
                let got = download(self.e, &self.tensor(s));
                let want = self.memory.read(&layout(s)).bytes;
                prop_assert!(
                    got == want,
                    "reading {}: got {:?}, want {:?}; {}",
                    s.name,
                    words(&got),
                    words(&want),
                    self.context()
                );
            }
        }
        Ok(())
    }
}

/// The pattern is the base itself (contiguous, offset 0, f32, every element).
fn whole(base: &Base, pattern: &Pattern) -> bool {
    pattern.dtype == F32
        && pattern.offset == 0
        && pattern.sizes == base.sizes
        && pattern.strides == contiguous(base.sizes).as_slice()
}

/// Bytes as 32-bit words (f32 bits), for readable failures.
fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Whether reading or writing through the pattern needs index lists (a gather, or the scatter
/// fallback of a write) rather than slices, transposes and reshapes.
fn needs_index_lists(base: &Base, pattern: &Pattern) -> bool {
    let l = layout(pattern);
    let base_len = numel(base.sizes);
    let gathers = views::decompose(base_len, 4, &l)
        .map(|chain| chain.has_gather())
        .unwrap_or(false);
    let scatters = views::invert(base_len, 4, &l)
        .map(|program| matches!(program.step, views::WriteStep::Scatter { .. }))
        .unwrap_or(false);
    gathers || scatters
}

/// Runs the case on `e` with base data from `seed`; compares every read and the final base.
fn run_case(
    e: &Engine,
    mode: Mode,
    case: &Case,
    seed: u64,
    setup: &Setup,
) -> Result<(), TestCaseError> {
    let include = setup.include;
    let base = &BASES[case.base];
    let patterns: Vec<&'static Pattern> =
        base.patterns.iter().filter(|p| include(base, p)).collect();
    let len = numel(base.sizes) as usize;
    let data = base_values(len, seed);
    let x = upload(e, DType::F32, base.sizes, &data);
    let mut run = Run {
        e,
        mode,
        base,
        patterns: &patterns,
        x: x.clone(),
        memory: StridedMemory::new(data),
        log: Vec::new(),
    };
    let result = (|| {
        for step in &case.steps {
            run.step(step)?;
            if setup.region_per_step {
                e.sync().map_err(|err| TestCaseError::fail(err.message))?;
            }
        }
        let got = download(e, &x);
        prop_assert_eq!(
            words(&got),
            words(&run.memory.bytes),
            "final base; {}",
            run.context()
        );
        Ok(())
    })();
    e.sync().expect("sync");
    e.release_storage(x.storage).expect("release");
    result
}

/// Which programs a property runs, and how.
struct Setup {
    modes: &'static [Mode],
    /// The patterns programs may use.
    include: fn(&Base, &Pattern) -> bool,
    /// Materialize everything after each step (DeferAndFuse then fuses one step at a time).
    region_per_step: bool,
    /// Check that the second run (other data) compiles nothing and hits the cache every time.
    check_cache: bool,
}

/// Runs random programs in each of `setup.modes`, each twice: on two sets of data.
fn check_view_programs(setup: Setup) {
    let include = setup.include;
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = DEFAULT_CASES;
    }
    for base in BASES {
        let excluded: Vec<&str> = base
            .patterns
            .iter()
            .filter(|p| !include(base, p))
            .map(|p| p.name)
            .collect();
        println!("{}: excluded {excluded:?}", base.name);
    }
    let modes = setup.modes;
    // Strict and Debug run the same regions: a shared tier-2 directory lets the second engine
    // load what the first compiled.
    let shared = tempfile::tempdir().expect("temporary directory");
    let engines: Vec<Engine> = modes
        .iter()
        .map(|&m| engine_with(m, Some(shared.path().to_path_buf()), None))
        .collect();
    let mut runner = TestRunner::new(config);
    let started = std::time::Instant::now();
    let engine_cases = std::cell::Cell::new(0u64);
    let result = runner.run(&case(), |case| {
        for (e, &mode) in engines.iter().zip(modes) {
            run_case(e, mode, &case, case.seed, &setup)?;
            // The same program on other data: every region comes from the cache.
            let compilations = metric(e, "compilations");
            let hits = metric(e, "cache_hits");
            let executions = metric(e, "executions");
            run_case(e, mode, &case, case.seed ^ 0x5DEE_CE66, &setup)?;
            if setup.check_cache {
                let new_compilations = metric(e, "compilations") - compilations;
                let new_hits = metric(e, "cache_hits") - hits;
                let new_executions = metric(e, "executions") - executions;
                prop_assert_eq!(
                    new_compilations,
                    0.0,
                    "{:?} recompiled a repeated program {:?}",
                    mode,
                    case
                );
                prop_assert_eq!(
                    new_hits,
                    new_executions,
                    "{:?}: every execution of a repeated program is a cache hit; {:?}",
                    mode,
                    case
                );
            }
            engine_cases.set(engine_cases.get() + 2);
        }
        Ok(())
    });
    for (e, mode) in engines.iter().zip(modes) {
        println!(
            "{mode:?}: {} compilations, {} executions, {} cache hits ({} from tier 2)",
            metric(e, "compilations"),
            metric(e, "executions"),
            metric(e, "cache_hits"),
            metric(e, "cache_hits_tier2")
        );
    }
    println!(
        "{} engine cases in {:.1} s",
        engine_cases.get(),
        started.elapsed().as_secs_f64()
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

fn without_index_lists(base: &Base, pattern: &Pattern) -> bool {
    !needs_index_lists(base, pattern)
}

/// Strict and Debug: every op is its own region.
#[test]
fn strict_and_debug_view_programs_match_strided_memory() {
    check_view_programs(Setup {
        modes: &[Mode::Strict, Mode::Debug],
        include: without_index_lists,
        region_per_step: false,
        check_cache: false,
    });
}

/// DeferAndFuse, materializing after each step: a region holds one step's read, op and write
/// (up to three ops and two views), and the steps' regions repeat across cases, so the second
/// run of a case is served from the cache.
#[test]
fn defer_and_fuse_view_programs_match_strided_memory_and_hit_the_cache() {
    check_view_programs(Setup {
        modes: &[Mode::DeferAndFuse],
        include: without_index_lists,
        region_per_step: true,
        check_cache: true,
    });
}

/// DeferAndFuse with whole programs fused into one region (several writes into one base).
#[test]
fn defer_and_fuse_whole_view_programs_match_strided_memory() {
    check_view_programs(Setup {
        modes: &[Mode::DeferAndFuse],
        include: without_index_lists,
        region_per_step: false,
        check_cache: true,
    });
}

/// Strict and Debug, second run on other data served from the cache.
#[test]
fn strict_and_debug_repeated_view_programs_hit_the_cache() {
    check_view_programs(Setup {
        modes: &[Mode::Strict, Mode::Debug],
        include: without_index_lists,
        region_per_step: false,
        check_cache: true,
    });
}

/// Every pattern, including the `as_strided` layouts that need a gather to read or the
/// scatter fallback to write.
#[test]
fn view_programs_with_gathers_and_scatters_match_strided_memory() {
    check_view_programs(Setup {
        modes: &[Mode::Strict, Mode::Debug, Mode::DeferAndFuse],
        include: |_, _| true,
        region_per_step: false,
        check_cache: false,
    });
}
