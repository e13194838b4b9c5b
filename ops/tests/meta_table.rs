//! Checks `ops::meta` against PyTorch's own output types and errors (tests/data/meta_cases.tsv).

use ops::{meta, DType, OpId, ScalarArg, ScalarValue, TensorType};

fn parse_tensor(spec: &str) -> TensorType {
    let (name, dims) = spec.split_once('[').expect("dtype[dims]");
    let dtype = DType::from_name(name).unwrap_or_else(|| panic!("unknown dtype {name}"));
    let dims: Vec<i64> = dims
        .trim_end_matches(']')
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    TensorType::new(dtype, &dims)
}

fn parse_scalar(spec: &str) -> ScalarArg {
    let (value, dtype) = match spec.split_once('@') {
        Some((v, d)) => (v, Some(DType::from_name(d).unwrap())),
        None => (spec, None),
    };
    let (kind, v) = value.split_once(':').unwrap();
    let value = match kind {
        "bool" => ScalarValue::Bool(v == "True"),
        "int" => ScalarValue::Int(v.parse().unwrap()),
        _ => ScalarValue::Float(v.parse().unwrap()),
    };
    ScalarArg {
        value,
        tensor_dtype: dtype,
    }
}

fn describe(r: &Result<ops::Meta, ops::OpError>) -> String {
    match r {
        Ok(m) => m
            .outputs
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(" "),
        Err(e) => format!("!{}: {}", e.kind.python_name(), e.message),
    }
}

#[test]
fn meta_matches_pytorch() {
    let table = include_str!("data/meta_cases.tsv");
    let mut failures = Vec::new();
    let mut count = 0;
    for line in table.lines().filter(|l| !l.starts_with('#')) {
        let fields: Vec<&str> = line.split('\t').collect();
        let op = OpId::from_name(fields[0]).unwrap_or_else(|| panic!("unknown op {}", fields[0]));
        let inputs: Vec<TensorType> = fields[1].split_whitespace().map(parse_tensor).collect();
        let scalars: Vec<ScalarArg> = fields[2].split_whitespace().map(parse_scalar).collect();
        let params: Vec<i64> = fields[3]
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        let expected = fields[4];
        count += 1;
        let got = meta(op, &inputs, &scalars, &params);
        let ok = match (&got, expected.strip_prefix('!')) {
            (Err(e), Some(err)) => {
                let (class, message) = err.split_once(": ").unwrap_or((err, ""));
                e.kind.python_name() == class && e.message.starts_with(message.trim())
            }
            (Ok(m), None) => {
                let want: Vec<TensorType> = expected.split_whitespace().map(parse_tensor).collect();
                m.outputs[..] == want[..]
            }
            _ => false,
        };
        if !ok {
            failures.push(format!("{line}\n    got: {}", describe(&got)));
        }
    }
    assert!(count > 0);
    if let Ok(path) = std::env::var("META_FAILURES_FILE") {
        std::fs::write(path, failures.join("\n")).unwrap();
    }
    if !failures.is_empty() {
        let shown: Vec<&String> = failures.iter().take(40).collect();
        panic!(
            "{} of {count} meta cases differ from PyTorch:\n{}",
            failures.len(),
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Sizes from user input near int64's bounds give PyTorch's result where it has one, else an
/// error that names the overflow; never a panic.
#[test]
fn sizes_near_int64_bounds() {
    const M: i64 = i64::MAX;
    let f32 = |shape: &[i64]| TensorType::new(DType::F32, shape);
    let shape_of = |op: OpId, inputs: &[TensorType], params: &[i64]| {
        meta(op, inputs, &[], params).unwrap().outputs[0]
            .shape
            .to_vec()
    };
    let error = |op: OpId, inputs: &[TensorType], params: &[i64]| {
        meta(op, inputs, &[], params).unwrap_err().message
    };
    // x[0:2**63-1:2], x[0:2:2**63-1] and x[-2**63:2**63-1:2**63-1] clamp as Python's slices do.
    assert_eq!(shape_of(OpId::Slice, &[f32(&[5])], &[0, 0, M, 2]), [3]);
    assert_eq!(shape_of(OpId::Slice, &[f32(&[5])], &[0, 0, 2, M]), [1]);
    assert_eq!(
        shape_of(OpId::Slice, &[f32(&[5])], &[0, i64::MIN, M, M]),
        [1]
    );
    // repeat: a size that overflows, an element count that overflows, a negative count.
    let e = error(OpId::Repeat, &[f32(&[3, 4])], &[2, M, -1]);
    assert!(
        e.starts_with(
            "repeat: size 3 repeated 9223372036854775807 times overflows int64 at dimension 1"
        ),
        "{e}"
    );
    let e = error(OpId::Repeat, &[f32(&[2, 3])], &[1 << 31, 1 << 31]);
    assert!(
        e.contains("[4294967296, 6442450944]")
            && e.contains("numel: integer multiplication overflow"),
        "{e}"
    );
    let e = error(OpId::Repeat, &[f32(&[2])], &[-1]);
    assert_eq!(
        e,
        "Trying to create tensor with negative dimension -2: [-2]"
    );
    assert_eq!(shape_of(OpId::Repeat, &[f32(&[0])], &[-1]), [0]);
    // expand: -1 in a new dim, a negative size, an element count that overflows.
    let e = error(OpId::Expand, &[f32(&[2])], &[-1, 2]);
    assert_eq!(
        e,
        "The expanded size of the tensor (-1) isn't allowed in a leading, non-existing dimension 0"
    );
    let e = error(OpId::Expand, &[f32(&[3])], &[-1, -1, 3]);
    assert_eq!(
        e,
        "The expanded size of the tensor (-1) isn't allowed in a leading, non-existing dimension 1"
    );
    let e = error(OpId::Expand, &[f32(&[2])], &[-1, 0]);
    assert!(
        e.starts_with("The expanded size of the tensor (0) must match"),
        "{e}"
    );
    let e = error(OpId::Expand, &[f32(&[1])], &[-2]);
    assert_eq!(
        e,
        "Trying to create tensor with negative dimension -2: [-2]"
    );
    let e = error(OpId::Expand, &[f32(&[1])], &[1 << 62, 4]);
    assert!(e.contains("numel: integer multiplication overflow"), "{e}");
    // Sums and products of sizes: cat, reshape, constant_pad_nd.
    let wide = f32(&[0, 1 << 62]);
    let e = error(OpId::Cat, &[wide.clone(), wide], &[1]);
    assert!(
        e.starts_with("cat(): the sizes of the tensors in dimension 1 add up to more than"),
        "{e}"
    );
    let e = error(OpId::Reshape, &[f32(&[0])], &[1 << 62, 4]);
    assert!(e.contains("numel: integer multiplication overflow"), "{e}");
    let e = error(OpId::ConstantPadNd, &[f32(&[2])], &[M, 0]);
    assert!(e.contains("overflows int64. Check dimension 0"), "{e}");
    // A dilated pooling window past int64 (PyTorch: "value cannot be converted to type int
    // without overflow").
    let e = error(
        OpId::MaxPool2dWithIndices,
        &[f32(&[1, 3, 4])],
        &[0, 1, 3, 1, 1, 1, 0, 1, 1 << 62],
    );
    assert!(e.ends_with("Output size is too small"), "{e}");
    // An indexed dim past the rank.
    let index = TensorType::new(DType::I64, &[2]);
    let e = error(OpId::Index, &[f32(&[2, 3]), index], &[M]);
    assert_eq!(
        e,
        "too many indices for tensor of dimension 2 (got 9223372036854775808)"
    );
}

/// Argument lists meta refuses by their length, with the op's layout, never a panic.
#[test]
fn missing_inputs_are_errors() {
    let e = meta(OpId::Isin, &[], &[ScalarArg::int(2)], &[0]).unwrap_err();
    assert!(
        e.message
            .starts_with("isin: expected tensor inputs (elements, test_elements)"),
        "{}",
        e.message
    );
    assert!(meta(OpId::Isin, &[], &[], &[0]).is_err());
}

/// gather of a 1-d input with a 0-d index (counted as 1-d): a 0-d result, as in PyTorch.
#[test]
fn gather_with_a_0d_index() {
    let x = TensorType::new(DType::F32, &[5]);
    let index = TensorType::new(DType::I64, &[]);
    for dim in [0, -1] {
        let m = meta(OpId::Gather, &[x.clone(), index.clone()], &[], &[dim]).unwrap();
        assert_eq!(m.outputs[0], TensorType::new(DType::F32, &[]));
        ops::lower_single(OpId::Gather, &[x.clone(), index.clone()], &[], &[dim]).unwrap();
    }
}
