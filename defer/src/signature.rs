//! What a compiled region was built for, op by op, and how two builds of one op sequence
//! differ: the facts behind a recompile's explanation.
//!
//! A [`RegionSignature`] is taken only on a compile (a cache miss), from the region's source,
//! so it costs nothing on the warm path. Two regions with the same [`RegionSignature::skeleton`]
//! (the same ops in the same order) that both had to be compiled differ somewhere: in a
//! dimension, a dtype, a static parameter, a view or what the region materializes.
//! [`explain`] names each difference, op by op, earliest first.

use fuse::{InputView, RegionOp};
use ops::{ScalarArg, ScalarValue, TensorType};
use smallvec::SmallVec;
use std::fmt::Write as _;

/// One compiled region's facts, op by op.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionSignature {
    /// The op sequence alone: regions that share it are builds of one program structure.
    pub skeleton: u64,
    pub ops: Vec<OpSignature>,
    /// Positions (in the region's op list) and output indices of the values it materializes.
    pub outputs: Vec<(u32, u32)>,
    /// (argument, output) pairs whose buffers are donated.
    pub aliases: Vec<(u32, u32)>,
}

/// What one op of a region was built for.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSignature {
    pub op: RegionOp,
    pub params: SmallVec<[i64; 4]>,
    /// The kind of each lifted scalar (its value is a runtime argument, never a difference).
    pub scalar_kinds: SmallVec<[ScalarKind; 2]>,
    /// A lowering picked from a scalar's value (`pow`'s special exponents).
    pub variant: u8,
    /// Each input as the op reads it: its type, and the view it is read through.
    pub inputs: SmallVec<[InputSignature; 3]>,
    pub outputs: SmallVec<[TensorType; 1]>,
    /// The user's line that captured the op, when the engine records lines.
    pub location: Option<std::sync::Arc<str>>,
}

/// An input as an op reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct InputSignature {
    pub ty: TensorType,
    /// The type of the value it is read from, when it is read through a view or a reshape (a
    /// window of a longer value: the value's length is part of the program too).
    pub stored: Option<TensorType>,
    /// Where it comes from: a region argument's number or an earlier op's output.
    pub source: InputOrigin,
    /// The view chain it is read through, when it is a strided window of a storage.
    pub view: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputOrigin {
    Argument(u32),
    Op { position: u32, output: u32 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScalarKind {
    pub kind: &'static str,
    pub tensor_dtype: Option<ops::DType>,
}

impl ScalarKind {
    pub fn of(scalar: &ScalarArg) -> Self {
        ScalarKind {
            kind: match scalar.value {
                ScalarValue::Bool(_) => "bool",
                ScalarValue::Int(_) => "int",
                ScalarValue::Float(_) => "float",
            },
            tensor_dtype: scalar.tensor_dtype,
        }
    }
}

impl std::fmt::Display for ScalarKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.tensor_dtype {
            Some(d) => write!(f, "{} (a 0-d {} tensor)", self.kind, d.name()),
            None => f.write_str(self.kind),
        }
    }
}

/// The skeleton of an op sequence (see [`RegionSignature::skeleton`]). In-memory only.
pub fn skeleton<'a>(ops: impl IntoIterator<Item = &'a RegionOp>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |x: u64| {
        h = (h.rotate_left(5) ^ x).wrapping_mul(0x0000_0100_0000_01b3);
    };
    let mut count = 0u64;
    for op in ops {
        count += 1;
        mix(match op {
            RegionOp::Aten(op) => *op as u64,
            RegionOp::Padded(p) => p.op as u64,
            RegionOp::WriteView(_) => 0xffff,
            RegionOp::Append(_) => ops::OpId::Cat as u64,
        });
    }
    mix(count);
    h
}

/// The type a view chain leaves, from the value it starts on (`None`: a chain that does not
/// apply, which capture never builds).
pub fn view_result(view: &InputView) -> Option<TensorType> {
    let mut shape = view.chain.input.clone();
    for op in &view.chain.ops {
        shape = op.result_shape(&shape).ok()?;
    }
    Some(TensorType::new(view.view_dtype, &shape))
}

pub fn describe_view(view: &InputView) -> String {
    let mut out = format!("{:?}", view.chain.ops.as_slice());
    if let Some(window) = view.window {
        let _ = write!(out, " over a window of {window} elements");
    }
    out
}

/// One difference between two builds of a program structure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The op's position in the region (`None`: the region as a whole, e.g. its outputs).
    pub op_index: Option<usize>,
    /// `aten::arange`, `write through a view`, or `region`.
    pub op: String,
    /// What differs: `input 0 (self) dim 2`, `param 2 (end)`, `output 0 dtype`, ...
    pub what: String,
    pub old: String,
    pub new: String,
    /// The user's line that captured the op, when the engine records lines.
    pub location: Option<std::sync::Arc<str>>,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.op_index {
            Some(i) => write!(f, "op {i} ({})", self.op)?,
            None => f.write_str(&self.op)?,
        }
        write!(f, ": {} changed {} -> {}", self.what, self.old, self.new)
    }
}

/// How a padded op pads (its inputs' padded dimensions, or an append's bucket); `None` for
/// an exact op.
fn padding_summary(op: &RegionOp) -> Option<String> {
    match op {
        RegionOp::Padded(p) => Some(format!(
            "bucket {}, inputs padded along {:?}",
            p.plan.bucket,
            p.plan.inputs.iter().map(|d| d.to_vec()).collect::<Vec<_>>()
        )),
        RegionOp::Append(a) => Some(format!("appended into a bucket of {}", a.out_bucket)),
        _ => None,
    }
}

/// The full name of a region op, as a PyTorch user knows it.
pub fn op_display_name(op: &RegionOp) -> String {
    match op {
        RegionOp::Aten(op) => format!("aten::{}", op.name()),
        RegionOp::WriteView(_) => "write through a view".to_string(),
        RegionOp::Padded(p) => format!("aten::{} (padded)", p.op.name()),
        RegionOp::Append(_) => "aten::cat (append to a padded value)".to_string(),
    }
}

/// Every difference between `old` and `new` (two builds of one skeleton), earliest op first:
/// the first is where the two programs start to differ, usually the cause of the rest.
pub fn explain(old: &RegionSignature, new: &RegionSignature) -> Vec<Change> {
    let mut changes = Vec::new();
    if old.ops.len() != new.ops.len() {
        changes.push(Change {
            op_index: None,
            op: "region".to_string(),
            what: "op count".to_string(),
            old: old.ops.len().to_string(),
            new: new.ops.len().to_string(),
            location: None,
        });
        return changes;
    }
    for (index, (a, b)) in old.ops.iter().zip(&new.ops).enumerate() {
        explain_op(index, a, b, &mut changes);
    }
    if old.outputs != new.outputs {
        changes.push(Change {
            op_index: None,
            op: "region".to_string(),
            what: "materialized values (op position, output)".to_string(),
            old: format!("{} values {:?}", old.outputs.len(), old.outputs),
            new: format!("{} values {:?}", new.outputs.len(), new.outputs),
            location: None,
        });
    }
    if old.aliases != new.aliases {
        changes.push(Change {
            op_index: None,
            op: "region".to_string(),
            what: "donated buffers (argument, output)".to_string(),
            old: format!("{:?}", old.aliases),
            new: format!("{:?}", new.aliases),
            location: None,
        });
    }
    changes
}

fn explain_op(index: usize, a: &OpSignature, b: &OpSignature, out: &mut Vec<Change>) {
    let name = op_display_name(&b.op);
    let mut push = |what: String, old: String, new: String| {
        out.push(Change {
            op_index: Some(index),
            op: name.clone(),
            what,
            old,
            new,
            location: b.location.clone(),
        })
    };
    if a.op != b.op {
        // Same op id (the skeleton): another write program, or another way of padding.
        match (padding_summary(&a.op), padding_summary(&b.op)) {
            (None, None) => push(
                "the write through the view".to_string(),
                truncate(format!("{:?}", a.op)),
                truncate(format!("{:?}", b.op)),
            ),
            (old, new) => push(
                "padding (bounded shapes)".to_string(),
                old.unwrap_or_else(|| "exact".to_string()),
                new.unwrap_or_else(|| "exact".to_string()),
            ),
        }
    }
    if a.variant != b.variant {
        push(
            "lowering variant (picked by a scalar's value)".to_string(),
            a.variant.to_string(),
            b.variant.to_string(),
        );
    }
    let param_layout = match &b.op {
        RegionOp::Aten(op) => op.param_layout(),
        RegionOp::Padded(p) => p.op.param_layout(),
        RegionOp::WriteView(_) | RegionOp::Append(_) => ops::ParamLayout::None,
    };
    if a.params.len() != b.params.len() {
        push(
            "static params".to_string(),
            format!("{:?}", a.params.as_slice()),
            format!("{:?}", b.params.as_slice()),
        );
    } else {
        for (k, (&pa, &pb)) in a.params.iter().zip(&b.params).enumerate() {
            if pa == pb {
                continue;
            }
            let (label, as_float) = match param_layout.field_at(&b.params, k) {
                Some(field) => (
                    format!("param {k} ({})", field.name),
                    field.kind == ops::FieldKind::F64,
                ),
                None => (format!("param {k}"), false),
            };
            let show = |v: i64| {
                if as_float {
                    format!("{}", f64::from_bits(v as u64))
                } else {
                    v.to_string()
                }
            };
            push(label, show(pa), show(pb));
        }
    }
    if a.scalar_kinds != b.scalar_kinds {
        push(
            "lifted scalar kinds".to_string(),
            list(&a.scalar_kinds),
            list(&b.scalar_kinds),
        );
    }
    let input_names = match &b.op {
        RegionOp::Aten(op) => op
            .inputs_layout()
            .split(',')
            .map(|s| s.trim().trim_end_matches('?').to_string())
            .collect(),
        RegionOp::Padded(p) => {
            p.op.inputs_layout()
                .split(',')
                .map(|s| s.trim().trim_end_matches('?').to_string())
                .collect()
        }
        RegionOp::WriteView(_) | RegionOp::Append(_) => Vec::new(),
    };
    if a.inputs.len() != b.inputs.len() {
        push(
            "input count".to_string(),
            a.inputs.len().to_string(),
            b.inputs.len().to_string(),
        );
    } else {
        for (k, (ia, ib)) in a.inputs.iter().zip(&b.inputs).enumerate() {
            let label = match input_names.get(k) {
                Some(n) if !n.is_empty() && b.inputs.len() <= input_names.len() => {
                    format!("input {k} ({n})")
                }
                _ => format!("input {k}"),
            };
            type_changes(&label, &ia.ty, &ib.ty, &mut push);
            if let (Some(sa), Some(sb)) = (&ia.stored, &ib.stored) {
                type_changes(&format!("{label} read from a value:"), sa, sb, &mut push);
            } else if ia.stored != ib.stored {
                push(
                    format!("{label} read"),
                    if ia.stored.is_some() {
                        "through a view"
                    } else {
                        "whole"
                    }
                    .to_string(),
                    if ib.stored.is_some() {
                        "through a view"
                    } else {
                        "whole"
                    }
                    .to_string(),
                );
            }
            if ia.view != ib.view {
                push(
                    format!("{label} view"),
                    truncate(ia.view.clone().unwrap_or_else(|| "none".into())),
                    truncate(ib.view.clone().unwrap_or_else(|| "none".into())),
                );
            }
            if ia.source != ib.source {
                push(
                    format!("{label} source"),
                    origin(ia.source),
                    origin(ib.source),
                );
            }
        }
    }
    if a.outputs.len() == b.outputs.len() {
        for (k, (oa, ob)) in a.outputs.iter().zip(&b.outputs).enumerate() {
            type_changes(&format!("output {k}"), oa, ob, &mut push);
        }
    }
}

/// Dtype first, then each changed dimension (or the whole shape when the rank changed).
fn type_changes(
    label: &str,
    a: &TensorType,
    b: &TensorType,
    push: &mut impl FnMut(String, String, String),
) {
    if a.dtype != b.dtype {
        push(
            format!("{label} dtype"),
            a.dtype.name().to_string(),
            b.dtype.name().to_string(),
        );
    }
    if a.shape.len() != b.shape.len() {
        push(
            format!("{label} shape"),
            format!("{:?}", a.shape.as_slice()),
            format!("{:?}", b.shape.as_slice()),
        );
        return;
    }
    for (d, (&sa, &sb)) in a.shape.iter().zip(&b.shape).enumerate() {
        if sa != sb {
            push(format!("{label} dim {d}"), sa.to_string(), sb.to_string());
        }
    }
}

/// Names of the static params from an op's layout text (`[dtype, start: f64 bits, end: ...]`),
/// with whether each holds an f64's bits. The last name covers a trailing list (`sizes...`).
fn origin(o: InputOrigin) -> String {
    match o {
        InputOrigin::Argument(n) => format!("region argument {n}"),
        InputOrigin::Op { position, output } => format!("output {output} of op {position}"),
    }
}

fn list<T: std::fmt::Display>(items: &[T]) -> String {
    let parts: Vec<String> = items.iter().map(|i| i.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

fn truncate(mut s: String) -> String {
    const MAX: usize = 160;
    if s.len() > MAX {
        let mut cut = MAX;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use ops::param_layout as layout;
    use ops::{typed, DType, EncodedOp, OpId};

    fn op(call: EncodedOp, inputs: &[&[i64]], output: &[i64]) -> OpSignature {
        OpSignature {
            op: RegionOp::Aten(call.op),
            params: call.params.as_slice().into(),
            scalar_kinds: SmallVec::new(),
            variant: 0,
            inputs: inputs
                .iter()
                .enumerate()
                .map(|(i, s)| InputSignature {
                    ty: TensorType::new(DType::F32, s),
                    stored: None,
                    source: InputOrigin::Argument(i as u32),
                    view: None,
                })
                .collect(),
            outputs: smallvec::smallvec![TensorType::new(DType::F32, output)],
            location: None,
        }
    }

    fn region(ops: Vec<OpSignature>) -> RegionSignature {
        RegionSignature {
            skeleton: skeleton(ops.iter().map(|o| &o.op)),
            ops,
            outputs: vec![(0, 0)],
            aliases: vec![],
        }
    }

    #[test]
    fn a_new_dimension_is_named_by_op_input_and_dim() {
        let old = region(vec![op(
            typed::Add.encode(()),
            &[&[2, 8], &[2, 8]],
            &[2, 8],
        )]);
        let new = region(vec![op(
            typed::Add.encode(()),
            &[&[2, 9], &[2, 9]],
            &[2, 9],
        )]);
        assert_eq!(old.skeleton, new.skeleton);
        let changes = explain(&old, &new);
        let text: Vec<String> = changes.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            text,
            [
                "op 0 (aten::add): input 0 (self) dim 1 changed 8 -> 9",
                "op 0 (aten::add): input 1 (other) dim 1 changed 8 -> 9",
                "op 0 (aten::add): output 0 dim 1 changed 8 -> 9",
            ]
        );
    }

    #[test]
    fn float_params_are_shown_as_numbers_and_named_from_the_layout() {
        let arange = |start: f64, end: f64| {
            typed::Arange.encode(layout::ArangeRange {
                dtype: DType::I64,
                start,
                end,
                step: 1.0,
            })
        };
        let old = region(vec![op(arange(7.0, 8.0), &[], &[1])]);
        let new = region(vec![op(arange(8.0, 9.0), &[], &[1])]);
        let changes = explain(&old, &new);
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert_eq!(changes[0].what, "param 1 (start)");
        assert_eq!(
            (changes[0].old.as_str(), changes[0].new.as_str()),
            ("7", "8")
        );
        assert_eq!(changes[1].what, "param 2 (end)");
    }

    #[test]
    fn trailing_size_lists_and_dtypes() {
        let zeros = |sizes: &[i64]| {
            typed::Zeros.encode(layout::Creation {
                dtype: DType::I64,
                sizes,
            })
        };
        let old = region(vec![op(zeros(&[2, 3]), &[], &[2, 3])]);
        let mut new = region(vec![op(zeros(&[2, 5]), &[], &[2, 5])]);
        new.ops[0].outputs[0].dtype = DType::F16;
        let changes = explain(&old, &new);
        assert_eq!(changes[0].what, "param 2 (sizes)");
        assert_eq!(changes[1].what, "output 0 dtype");
        assert_eq!(changes[1].new, "float16");
        assert_eq!(changes[2].what, "output 0 dim 1");
    }

    #[test]
    fn region_level_changes_come_after_the_ops() {
        let old = region(vec![op(typed::Neg.encode(()), &[&[4]], &[4])]);
        let mut new = old.clone();
        new.outputs.push((0, 1));
        let changes = explain(&old, &new);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].op_index, None);
        assert!(changes[0].what.starts_with("materialized values"));
    }

    #[test]
    fn skeletons_tell_op_sequences_apart() {
        let a = [RegionOp::Aten(OpId::Add), RegionOp::Aten(OpId::Mul)];
        let b = [RegionOp::Aten(OpId::Mul), RegionOp::Aten(OpId::Add)];
        assert_ne!(skeleton(&a), skeleton(&b));
        assert_ne!(skeleton(&a[..1]), skeleton(&a));
        assert_eq!(skeleton(&a), skeleton(&a.clone()));
    }
}
