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
    // A pooling dilation past int32: PyTorch's kernels take it as a C int.
    let e = error(
        OpId::MaxPool2dWithIndices,
        &[f32(&[1, 3, 4])],
        &[0, 1, 3, 1, 1, 1, 0, 1, 1 << 62],
    );
    assert_eq!(
        e,
        "value cannot be converted to type int without overflow: max_pool2d's dilation 4611686018427387904 at dimension 0; expected values from -2147483648 to 2147483647"
    );
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

/// Sizes and counts near int64's bounds in the loss, norm, spectral and pooling ops: PyTorch's
/// error or result, never a panic or an abort.
#[test]
fn extreme_sizes_in_losses_norms_ffts_and_pools() {
    const M: i64 = i64::MAX;
    let t = |dtype: DType, shape: &[i64]| TensorType::new(dtype, shape);
    let f32 = |shape: &[i64]| t(DType::F32, shape);
    let error = |op: OpId, inputs: &[TensorType], params: &[i64]| {
        meta(op, inputs, &[], params).unwrap_err()
    };
    // adaptive_max_pool2d to an output size of 3e12: meta gives PyTorch's (meta-device) shape;
    // lowering refuses before building window tables of that length.
    let x = f32(&[1, 1, 1]);
    for op in [OpId::AdaptiveMaxPool2d, OpId::AdaptiveAvgPool2d] {
        let m = meta(op, std::slice::from_ref(&x), &[], &[3_000_000_000_000, 1]).unwrap();
        assert_eq!(m.outputs[0], f32(&[1, 3_000_000_000_000, 1]));
        let e = ops::lower_single(op, std::slice::from_ref(&x), &[], &[3_000_000_000_000, 1])
            .unwrap_err()
            .message;
        assert!(
            e.contains(": output size 3000000000000 at dimension 1 needs tables of 3000000000000 window bounds")
                && e.contains("the result [1, 3000000000000, 1] alone takes 12000000000000 bytes")
                && e.ends_with("expected an output size of at most 134217728"),
            "{e}"
        );
    }
    let e = error(OpId::AdaptiveMaxPool2d, &[x], &[1 << 62, 1]).message;
    assert_eq!(
        e,
        "Storage size calculation overflowed with sizes=[1, 4611686018427387904, 1]; expected sizes whose 4611686018427387904 elements of 4 bytes (Float) take at most 9223372036854775807 bytes"
    );

    // nll_loss_backward: [grad, self, target, total_weight, weight?], params [reduction, ignore].
    let nll = |g: &[i64], x: TensorType, target: &[i64], total: &[i64], w: Option<TensorType>| {
        let mut i = vec![t(x.dtype, g), x, t(DType::I64, target), f32(total)];
        i.extend(w);
        i
    };
    let e = error(
        OpId::NllLossBackward,
        &nll(&[], f32(&[]), &[], &[], Some(f32(&[3]))),
        &[1, -100],
    );
    assert_eq!(e.message, "input tensor should be 1D or 2D");
    let e = error(
        OpId::NllLossBackward,
        &nll(&[], f32(&[2, 3]), &[2], &[2], None),
        &[1, -100],
    );
    assert_eq!(
        e.message,
        "expected total_weight to be a  single element tensor, got: [2] (2 elements)"
    );
    let e = error(
        OpId::NllLossBackward,
        &nll(&[2], f32(&[2, 3]), &[2], &[], None),
        &[1, -100],
    );
    assert_eq!(
        e.message,
        "Expected a single element grad_output tensor, but got: [2]"
    );
    let e = error(
        OpId::NllLossBackward,
        &nll(&[3], f32(&[2, 3]), &[2], &[], None),
        &[0, -100],
    );
    assert_eq!(
        e.message,
        "Expected a tensor of dimension 1 and tensor.size[0] == 2 but got: dimension 1 and tensor.size[0] = 3"
    );
    let e = error(
        OpId::NllLossBackward,
        &nll(&[], f32(&[1, 3]), &[], &[], None),
        &[1, -100],
    );
    assert_eq!(e.kind.python_name(), "IndexError");
    assert_eq!(
        e.message,
        "Dimension specified as 0 but tensor has no dimensions"
    );
    let mut i = nll(&[], f32(&[2, 3]), &[2], &[], None);
    i[0] = t(DType::F64, &[]);
    let e = error(OpId::NllLossBackward, &i, &[1, -100]);
    assert_eq!(e.message, "expected scalar type Float but found Double");
    let e = error(
        OpId::NllLossBackward,
        &nll(&[], t(DType::I64, &[2, 3]), &[2], &[], None),
        &[1, -100],
    );
    assert_eq!(
        e.message,
        "\"nll_loss_backward_out_frame\" not implemented for 'Long'"
    );
    // PyTorch takes a one-element grad and total weight of any rank, and a weight of any shape
    // with one element per class.
    let i = nll(&[1], f32(&[2, 3]), &[2], &[1, 1], Some(f32(&[3, 1])));
    let m = meta(OpId::NllLossBackward, &i, &[], &[1, -100]).unwrap();
    assert_eq!(m.outputs[0], f32(&[2, 3]));
    ops::lower_single(OpId::NllLossBackward, &i, &[], &[1, -100]).unwrap();
    // nll_loss2d_backward: the same checks with its own messages.
    let i = vec![
        f32(&[]),
        f32(&[2, 3, 4, 5]),
        t(DType::I64, &[2, 4, 5]),
        f32(&[2]),
    ];
    let e = error(OpId::NllLoss2dBackward, &i, &[1, -100]);
    assert_eq!(
        e.message,
        "expected total_weight to be a single element tensor, got: [2] (2 elements)"
    );
    let i = vec![
        f32(&[2, 4, 1]),
        f32(&[2, 3, 4, 5]),
        t(DType::I64, &[2, 4, 5]),
        f32(&[]),
    ];
    let e = error(OpId::NllLoss2dBackward, &i, &[0, -100]);
    assert_eq!(
        e.message,
        "size mismatch (got grad_output: [2, 4, 1] target: [2, 4, 5]"
    );

    // native_group_norm(_backward): N * C * HxW and N * group past int64.
    let e = error(
        OpId::NativeGroupNormBackward,
        &[f32(&[2, 4]), f32(&[2, 4]), f32(&[2]), f32(&[2])],
        &[0, 5, 3_000_000_000_000, 1 << 62, 5, 7],
    );
    assert!(
        e.message
            .starts_with("Expected X.numel() == N * C * HxW to be true, but got false."),
        "{}",
        e.message
    );
    let x = f32(&[2, 0, 4]);
    let e = error(
        OpId::NativeGroupNormBackward,
        &[x.clone(), x.clone(), f32(&[2]), f32(&[2])],
        &[0, 2, 0, 4, M, 7],
    );
    assert_eq!(
        e.message,
        "native_group_norm_backward: mean and rstd should contain N * group = 2 * 9223372036854775807 elements, more than int64 holds; expected a group count that divides the 0 channels"
    );

    // The FFT primitives on a 0-d tensor (PyTorch's torch.fft raises an IndexError).
    let z = f32(&[]);
    let c = t(DType::C64, &[]);
    for (op, x, params) in [
        (OpId::FftR2c, &z, vec![0, 1, 0]),
        (OpId::FftR2c, &z, vec![0, 0, -1]),
        (OpId::FftC2c, &c, vec![0, 1, 0]),
        (OpId::FftC2r, &c, vec![0, 1, 0]),
    ] {
        let e = error(op, std::slice::from_ref(x), &params);
        assert_eq!(e.kind.python_name(), "IndexError");
        assert_eq!(
            e.message,
            format!(
                "Dimension specified as {} but tensor has no dimensions; expected a tensor with at least one dimension to transform",
                params[2]
            )
        );
    }

    // convolution: padding past int64's half, a dilated kernel past int64, a transposed output
    // past int64.
    let (x, w) = (f32(&[1, 2, 5]), f32(&[1, 2, 2]));
    let conv = |transposed: i64, stride: i64, padding: i64, dilation: i64| {
        vec![transposed, 1, 1, stride, 1, padding, 1, dilation, 1, 0]
    };
    let e = error(
        OpId::Convolution,
        &[x.clone(), w.clone()],
        &conv(0, 1, 1 << 62, 1),
    );
    assert_eq!(
        e.message,
        "Given padding=4611686018427387904 at dimension 0 , expected padding to be at most 4611686018427387903"
    );
    let e = error(
        OpId::Convolution,
        &[x.clone(), w.clone()],
        &conv(0, 1, 1, M),
    );
    assert!(
        e.message.starts_with(
            "Calculated padded input size per channel: (7). Kernel size: (9223372036854775808)."
        ),
        "{}",
        e.message
    );
    let w = f32(&[2, 1, 2]);
    let e = error(OpId::Convolution, &[f32(&[1, 2, 5]), w], &conv(1, M, 0, M));
    assert!(
        e.message.starts_with("the convolution's output size ")
            && e.message
                .contains("at spatial dimension 0 does not fit in int64"),
        "{}",
        e.message
    );

    // Pooling windows past int32 (PyTorch's kernels take C ints); a 3-d window whose element
    // count passes int64 lowers, as PyTorch computes it.
    let e = error(
        OpId::AvgPool2d,
        &[f32(&[1, 1, 6, 6])],
        &[1, 1, 2, 1 << 31, 2, 0, 1, 0],
    );
    assert!(
        e.message.starts_with(
            "value cannot be converted to type int without overflow: avg_pool2d's kernel_size 2147483648 at dimension 0"
        ),
        "{}",
        e.message
    );
    let k = 1 << 30;
    let x = f32(&[1, 1, 4, 4, 4]);
    let p = [0, 3, k, k, k, 0, 3, k / 2, k / 2, k / 2, 1, 1];
    let m = meta(
        OpId::MaxPool3dWithIndices,
        std::slice::from_ref(&x),
        &[],
        &p,
    )
    .unwrap();
    assert_eq!(m.outputs[0], f32(&[1, 1, 1, 1, 1]));
    ops::lower_single(OpId::MaxPool3dWithIndices, &[x], &[], &p).unwrap();
}
