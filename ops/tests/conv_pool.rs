//! Convolution and pooling ops: meta against PyTorch's shapes, dtypes and errors, a snapshot of
//! one convolution's StableHLO, and values on the XLA CPU plugin against f64 loop references.

mod common;

use common::*;
use ops::{lower_single, meta, DType, ErrorKind, OpId, TensorType};

fn t(dtype: DType, shape: &[i64]) -> TensorType {
    TensorType::new(dtype, shape)
}

fn f32(shape: &[i64]) -> TensorType {
    t(DType::F32, shape)
}

/// A list as the params hold it: its length, then its values.
fn counted(v: &[i64]) -> Vec<i64> {
    let mut r = vec![v.len() as i64];
    r.extend_from_slice(v);
    r
}

struct ConvP<'a> {
    transposed: bool,
    groups: i64,
    stride: &'a [i64],
    padding: &'a [i64],
    dilation: &'a [i64],
    output_padding: &'a [i64],
}

impl ConvP<'_> {
    fn params(&self) -> Vec<i64> {
        let mut p = vec![self.transposed as i64, self.groups];
        for l in [
            self.stride,
            self.padding,
            self.dilation,
            self.output_padding,
        ] {
            p.extend(counted(l));
        }
        p
    }

    fn backward_params(&self, mask: i64) -> Vec<i64> {
        let mut p = vec![mask];
        p.extend(self.params());
        p
    }
}

fn conv2d(stride: i64, padding: i64) -> Vec<i64> {
    ConvP {
        transposed: false,
        groups: 1,
        stride: &[stride, stride],
        padding: &[padding, padding],
        dilation: &[1, 1],
        output_padding: &[0, 0],
    }
    .params()
}

/// max_pool2d params: `[ceil_mode, kernel, stride, padding, dilation]`.
fn max_p(
    kernel: &[i64],
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    ceil: bool,
) -> Vec<i64> {
    let mut p = vec![ceil as i64];
    for l in [kernel, stride, padding, dilation] {
        p.extend(counted(l));
    }
    p
}

/// avg_pool2d params: `[ceil_mode, count_include_pad, kernel, stride, padding, divisor?]`.
fn avg_p(
    kernel: &[i64],
    stride: &[i64],
    padding: &[i64],
    ceil: bool,
    include_pad: bool,
    divisor: Option<i64>,
) -> Vec<i64> {
    let mut p = vec![ceil as i64, include_pad as i64];
    for l in [kernel, stride, padding] {
        p.extend(counted(l));
    }
    p.extend(divisor);
    p
}

fn outputs(op: OpId, inputs: &[TensorType], params: &[i64]) -> Vec<String> {
    meta(op, inputs, &[], params)
        .unwrap_or_else(|e| panic!("{op}: {e}"))
        .outputs
        .iter()
        .map(|t| t.to_string())
        .collect()
}

fn error(op: OpId, inputs: &[TensorType], params: &[i64]) -> (ErrorKind, String) {
    let e = meta(op, inputs, &[], params).expect_err("an error");
    (e.kind, e.message)
}

fn runtime_error(op: OpId, inputs: &[TensorType], params: &[i64], message: &str) {
    assert_eq!(
        error(op, inputs, params),
        (ErrorKind::Runtime, message.to_string())
    );
}

#[test]
fn convolution_meta() {
    use OpId::Convolution as C;
    let x = f32(&[2, 3, 8, 8]);
    let w = f32(&[4, 3, 3, 3]);
    assert_eq!(
        outputs(C, &[x.clone(), w.clone()], &conv2d(1, 0)),
        ["float32[2, 4, 6, 6]"]
    );
    assert_eq!(
        outputs(C, &[x.clone(), w.clone(), f32(&[4])], &conv2d(2, 1)),
        ["float32[2, 4, 4, 4]"]
    );
    let transposed = |stride: &[i64], dilation: &[i64], output_padding: &[i64]| {
        ConvP {
            transposed: true,
            groups: 1,
            stride,
            padding: &[0, 0],
            dilation,
            output_padding,
        }
        .params()
    };
    let wt = f32(&[3, 4, 3, 3]);
    assert_eq!(
        outputs(
            C,
            &[x.clone(), wt.clone()],
            &transposed(&[2, 2], &[1, 1], &[1, 0])
        ),
        ["float32[2, 4, 18, 17]"]
    );
    assert_eq!(
        outputs(
            C,
            &[x.clone(), wt.clone()],
            &transposed(&[1, 1], &[3, 3], &[2, 0])
        ),
        ["float32[2, 4, 16, 14]"]
    );
    assert_eq!(
        outputs(
            C,
            &[t(DType::I64, &[1, 1, 8, 8]), t(DType::I64, &[1, 1, 3, 3])],
            &conv2d(1, 0)
        ),
        ["int64[1, 1, 6, 6]"]
    );
    assert_eq!(
        outputs(C, &[f32(&[0, 3, 8, 8]), w.clone()], &conv2d(1, 0)),
        ["float32[0, 4, 6, 6]"]
    );
    runtime_error(
        C,
        &[f32(&[3, 8, 8]), w.clone()],
        &conv2d(1, 0),
        "Expected 4-dimensional input for 4-dimensional weight [4, 3, 3, 3], but got 3-dimensional input of size [3, 8, 8] instead",
    );
    runtime_error(
        C,
        &[x.clone(), f32(&[4, 2, 3, 3])],
        &conv2d(1, 0),
        "Given groups=1, weight of size [4, 2, 3, 3], expected input[2, 3, 8, 8] to have 2 channels, but got 3 channels instead",
    );
    let grouped = ConvP {
        transposed: false,
        groups: 2,
        stride: &[1, 1],
        padding: &[0, 0],
        dilation: &[1, 1],
        output_padding: &[0, 0],
    }
    .params();
    runtime_error(
        C,
        &[f32(&[2, 4, 8, 8]), f32(&[3, 2, 3, 3])],
        &grouped,
        "Given groups=2, expected weight to be divisible by 2 at dimension 0, but got weight of size [[3, 2, 3, 3]] instead",
    );
    runtime_error(
        C,
        &[x.clone(), w.clone(), f32(&[3])],
        &conv2d(1, 0),
        "Given weight of size [4, 3, 3, 3], expected bias to be 1-dimensional with 4 elements, but got bias of size [3] instead",
    );
    runtime_error(
        C,
        &[x.clone(), f32(&[4, 3, 9, 9])],
        &conv2d(1, 0),
        "Calculated padded input size per channel: (8 x 8). Kernel size: (9 x 9). Kernel size can't be greater than actual input size",
    );
    runtime_error(
        C,
        &[x.clone(), w.clone()],
        &conv2d(0, 0),
        "non-positive stride is not supported",
    );
    runtime_error(
        C,
        &[x.clone(), w.clone()],
        &conv2d(1, -1),
        "negative padding is not supported",
    );
    runtime_error(
        C,
        &[x.clone(), wt.clone()],
        &transposed(&[1, 1], &[1, 1], &[1, 0]),
        "output padding must be smaller than either stride or dilation, but got output_padding_height: 1 output_padding_width: 0 stride_height: 1 stride_width: 1 dilation_height: 1 dilation_width: 1",
    );
    runtime_error(
        C,
        &[x.clone(), f32(&[4, 4, 3, 3])],
        &transposed(&[1, 1], &[1, 1], &[0, 0]),
        "Given transposed=1, weight of size [4, 4, 3, 3], expected input[2, 3, 8, 8] to have 4 channels, but got 3 channels instead",
    );
    let (kind, _) = error(
        C,
        &[t(DType::Bool, &[2, 3, 8, 8]), t(DType::Bool, &[4, 3, 3, 3])],
        &conv2d(1, 0),
    );
    assert_eq!(kind, ErrorKind::NotImplemented);
    assert_eq!(
        error(C, &[x.clone(), t(DType::F64, &[4, 3, 3, 3])], &conv2d(1, 0)).0,
        ErrorKind::Runtime
    );
}

#[test]
fn convolution_backward_meta() {
    use OpId::ConvolutionBackward as B;
    let p = ConvP {
        transposed: false,
        groups: 1,
        stride: &[1, 1],
        padding: &[0, 0],
        dilation: &[1, 1],
        output_padding: &[0, 0],
    };
    let (gy, x, w) = (f32(&[2, 4, 6, 6]), f32(&[2, 3, 8, 8]), f32(&[4, 3, 3, 3]));
    let inputs = [gy.clone(), x.clone(), w.clone()];
    assert_eq!(
        outputs(B, &inputs, &p.backward_params(7)),
        ["float32[2, 3, 8, 8]", "float32[4, 3, 3, 3]", "float32[4]"]
    );
    // Gradients the mask leaves out are empty placeholders.
    assert_eq!(
        outputs(B, &inputs, &p.backward_params(2)),
        ["float32[0]", "float32[4, 3, 3, 3]", "float32[0]"]
    );
    assert_eq!(
        error(
            B,
            &[f32(&[2, 4, 5, 6]), x.clone(), w.clone()],
            &p.backward_params(7)
        )
        .0,
        ErrorKind::Runtime
    );
    let longs = [
        t(DType::I64, &[2, 4, 6, 6]),
        t(DType::I64, &[2, 3, 8, 8]),
        t(DType::I64, &[4, 3, 3, 3]),
    ];
    assert_eq!(
        error(B, &longs, &p.backward_params(7)),
        (
            ErrorKind::NotImplemented,
            "\"slow_conv2d_cpu_grad_input\" not implemented for 'Long'".to_string()
        )
    );
}

#[test]
fn max_pool_meta() {
    use OpId::MaxPool2dWithIndices as M;
    let x = f32(&[2, 3, 8, 8]);
    let k2 = max_p(&[2], &[], &[0], &[1], false);
    assert_eq!(
        outputs(M, &[t(DType::I64, &[1, 8, 8])], &k2),
        ["int64[1, 4, 4]", "int64[1, 4, 4]"]
    );
    assert_eq!(
        outputs(
            M,
            &[f32(&[1, 1, 5, 5])],
            &max_p(&[2, 2], &[2, 2], &[0, 0], &[1, 1], true)
        ),
        ["float32[1, 1, 3, 3]", "int64[1, 1, 3, 3]"]
    );
    assert_eq!(
        outputs(M, &[f32(&[0, 1, 4, 4])], &k2),
        ["float32[0, 1, 2, 2]", "int64[0, 1, 2, 2]"]
    );
    assert_eq!(
        error(M, &[t(DType::Bool, &[1, 8, 8])], &k2),
        (
            ErrorKind::NotImplemented,
            "\"max_pool2d\" not implemented for 'Bool'".to_string()
        )
    );
    runtime_error(
        M,
        &[f32(&[8, 8])],
        &k2,
        "non-empty 3D or 4D (batch mode) tensor expected for input",
    );
    runtime_error(
        M,
        std::slice::from_ref(&x),
        &max_p(&[2, 2, 2], &[], &[0], &[1], false),
        "max_pool2d: kernel_size must either be a single int, or a tuple of two ints",
    );
    runtime_error(
        M,
        std::slice::from_ref(&x),
        &max_p(&[2, 2], &[1, 1, 1], &[0], &[1], false),
        "max_pool2d: stride must either be omitted, a single int, or a tuple of two ints",
    );
    runtime_error(
        M,
        std::slice::from_ref(&x),
        &max_p(&[0, 2], &[], &[0], &[1], false),
        "stride should not be zero",
    );
    runtime_error(
        M,
        std::slice::from_ref(&x),
        &max_p(&[2, 2], &[1, 1], &[2, 0], &[1], false),
        "pad should be at most half of effective kernel size, but got pad=2, kernel_size=2 and dilation=1",
    );
    runtime_error(
        M,
        std::slice::from_ref(&x),
        &max_p(&[3, 3], &[1, 1], &[2, 2], &[2, 2], false),
        "pad should be smaller than or equal to half of kernel size, but got padW = 2, padH = 2, kW = 3, kH = 3",
    );
    runtime_error(
        M,
        std::slice::from_ref(&x),
        &max_p(&[2, 2], &[1, 1], &[-1, 0], &[1], false),
        "pad must be non-negative, but got pad: -1",
    );
    runtime_error(
        M,
        std::slice::from_ref(&x),
        &max_p(&[2, 2], &[1, 1], &[0, 0], &[0, 1], false),
        "dilation should be greater than zero, but got dilationH: 0 dilationW: 1",
    );
    runtime_error(
        M,
        &[f32(&[1, 1, 2, 2])],
        &max_p(&[3, 3], &[], &[0], &[1], false),
        "Given input size: (1x2x2). Calculated output size: (1x0x0). Output size is too small",
    );
    runtime_error(
        M,
        &[f32(&[1, 0, 4, 4])],
        &k2,
        "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:[1, 0, 4, 4]",
    );
}

#[test]
fn max_pool_backward_meta() {
    use OpId::MaxPool2dWithIndicesBackward as MB;
    let p = max_p(&[2, 2], &[2, 2], &[0, 0], &[1, 1], false);
    let (x, g, idx) = (
        f32(&[1, 1, 8, 8]),
        f32(&[1, 1, 4, 4]),
        t(DType::I64, &[1, 1, 4, 4]),
    );
    assert_eq!(
        outputs(MB, &[g.clone(), x.clone(), idx.clone()], &p),
        ["float32[1, 1, 8, 8]"]
    );
    runtime_error(
        MB,
        &[f32(&[1, 1, 3, 3]), x.clone(), idx.clone()],
        &p,
        "Expected a tensor of dimension 4 and tensor.size[2] == 4 but got: dimension 4 and tensor.size[2] = 3",
    );
    runtime_error(
        MB,
        &[g.clone(), x.clone(), t(DType::I32, &[1, 1, 4, 4])],
        &p,
        "expected scalar type Long but found Int",
    );
    runtime_error(
        MB,
        &[g.clone(), t(DType::F64, &[1, 1, 8, 8]), idx.clone()],
        &p,
        "expected dtype double for `gradOutput` but got dtype float",
    );
    assert_eq!(
        error(
            MB,
            &[
                t(DType::I64, &[1, 1, 4, 4]),
                t(DType::I64, &[1, 1, 8, 8]),
                idx
            ],
            &p
        ),
        (
            ErrorKind::NotImplemented,
            "\"max_pool2d_backward\" not implemented for 'Long'".to_string()
        )
    );
}

#[test]
fn avg_pool_meta() {
    use OpId::{AvgPool2d as A, AvgPool2dBackward as AB};
    let k3 = avg_p(&[3, 3], &[], &[0], false, true, None);
    assert_eq!(
        outputs(A, &[t(DType::I64, &[1, 8, 8])], &k3),
        ["int64[1, 2, 2]"]
    );
    assert_eq!(
        outputs(
            A,
            &[f32(&[0, 1, 4, 4])],
            &avg_p(&[2], &[], &[0], false, true, None)
        ),
        ["float32[0, 1, 2, 2]"]
    );
    assert_eq!(
        outputs(
            A,
            &[f32(&[1, 3, 9, 9])],
            &avg_p(&[6, 6], &[3, 3], &[2, 3], true, true, Some(2))
        ),
        ["float32[1, 3, 4, 4]"]
    );
    runtime_error(
        A,
        &[f32(&[2, 3, 8, 8])],
        &avg_p(&[2, 2], &[1, 1], &[0, 0], false, true, Some(0)),
        "divisor must be not zero",
    );
    runtime_error(
        A,
        &[f32(&[2, 3, 8, 8])],
        &avg_p(&[2, 2, 2], &[], &[0], false, true, None),
        "avg_pool2d: kernel_size must either be a single int, or a tuple of two ints",
    );
    runtime_error(
        A,
        &[f32(&[1, 1, 1, 4, 4])],
        &avg_p(&[2, 2], &[], &[0], false, true, None),
        "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:[1, 1, 1, 4, 4]",
    );
    assert_eq!(
        error(A, &[t(DType::Bool, &[1, 8, 8])], &k3).0,
        ErrorKind::NotImplemented
    );
    assert_eq!(
        outputs(
            AB,
            &[t(DType::I64, &[1, 1, 2, 2]), t(DType::I64, &[1, 1, 8, 8])],
            &k3
        ),
        ["int64[1, 1, 8, 8]"]
    );
    runtime_error(
        AB,
        &[f32(&[1, 1, 3, 2]), f32(&[1, 1, 8, 8])],
        &k3,
        "Expected a tensor of dimension 4 and tensor.size[2] == 2 but got: dimension 4 and tensor.size[2] = 3",
    );
}

#[test]
fn adaptive_avg_pool_meta() {
    use OpId::{AdaptiveAvgPool2d as P, AdaptiveAvgPool2dBackward as PB};
    assert_eq!(
        outputs(P, &[f32(&[1, 1, 4, 4])], &[6, 7]),
        ["float32[1, 1, 6, 7]"]
    );
    assert_eq!(
        outputs(P, &[t(DType::F16, &[1, 8, 8])], &[3, 3]),
        ["float16[1, 3, 3]"]
    );
    assert_eq!(
        outputs(P, &[f32(&[1, 1, 4, 4])], &[0, 2]),
        ["float32[1, 1, 0, 2]"]
    );
    runtime_error(
        P,
        &[f32(&[8, 8])],
        &[2, 2],
        "adaptive_avg_pool2d(): Expected 3D or 4D tensor, but got [8, 8]",
    );
    runtime_error(
        P,
        &[f32(&[2, 3, 8, 8])],
        &[2, 2, 2],
        "adaptive_avg_pool2d: output_size must be 2",
    );
    runtime_error(
        P,
        &[f32(&[1, 1, 0, 4])],
        &[2, 2],
        "adaptive_avg_pool2d(): Expected input to have non-zero size for non-batch dimensions, but input has sizes [1, 1, 0, 4] with dimension 2 being empty",
    );
    assert_eq!(
        error(P, &[t(DType::I64, &[1, 8, 8])], &[3, 3]),
        (
            ErrorKind::NotImplemented,
            "\"adaptive_avg_pool2d\" not implemented for 'Long'".to_string()
        )
    );
    let x = t(DType::F64, &[1, 1, 8, 8]);
    assert_eq!(
        outputs(PB, &[t(DType::F64, &[1, 1, 3, 3]), x.clone()], &[]),
        ["float64[1, 1, 8, 8]"]
    );
    runtime_error(
        PB,
        &[t(DType::F64, &[2, 4, 4]), x.clone()],
        &[],
        "adaptive_avg_pool2d_backward_out_cpu_template: Expected dimensions 4 for `grad_output` but got dimensions 3",
    );
    runtime_error(
        PB,
        &[f32(&[1, 1, 4, 4]), x],
        &[],
        "adaptive_avg_pool2d_backward_out_cpu_template: Expected dtype double for `grad_output` but got dtype float",
    );
    assert_eq!(
        error(
            PB,
            &[t(DType::I64, &[1, 1, 4, 4]), t(DType::I64, &[1, 1, 8, 8])],
            &[]
        ),
        (
            ErrorKind::NotImplemented,
            "\"adaptive_avg_pool2d_backward\" not implemented for 'Long'".to_string()
        )
    );
}

#[test]
fn grouped_strided_convolution_hlo() {
    let p = ConvP {
        transposed: false,
        groups: 2,
        stride: &[2, 1],
        padding: &[1, 0],
        dilation: &[1, 2],
        output_padding: &[0, 0],
    };
    let (text, _) = lower_single(
        OpId::Convolution,
        &[f32(&[2, 4, 7, 6]), f32(&[6, 2, 3, 2]), f32(&[6])],
        &[],
        &p.params(),
    )
    .unwrap();
    insta::assert_snapshot!(text);
}

// ----- values against f64 loop references --------------------------------------------------------

/// Row-major index of `idx` in `shape`.
fn flat(shape: &[usize], idx: &[usize]) -> usize {
    shape.iter().zip(idx).fold(0, |acc, (s, i)| acc * s + i)
}

fn dims(ty: &TensorType) -> Vec<usize> {
    ty.shape.iter().map(|&d| d as usize).collect()
}

/// A 2-d convolution's geometry: input `[N, C, H, W]`, weight `[O, C/g, KH, KW]`, output
/// `[N, O, OH, OW]`.
struct Geometry {
    x: Vec<usize>,
    w: Vec<usize>,
    y: Vec<usize>,
    stride: [usize; 2],
    padding: [i64; 2],
    dilation: [usize; 2],
    groups: usize,
}

impl Geometry {
    /// Calls `f(y index, x index, w index)` for every product term of the convolution.
    fn terms(&self, mut f: impl FnMut(usize, usize, usize)) {
        let (cg, og) = (self.w[1], self.y[1] / self.groups);
        for n in 0..self.y[0] {
            for o in 0..self.y[1] {
                for oh in 0..self.y[2] {
                    for ow in 0..self.y[3] {
                        for cl in 0..cg {
                            for kh in 0..self.w[2] {
                                for kw in 0..self.w[3] {
                                    let ih = (oh * self.stride[0] + kh * self.dilation[0]) as i64
                                        - self.padding[0];
                                    let iw = (ow * self.stride[1] + kw * self.dilation[1]) as i64
                                        - self.padding[1];
                                    if ih < 0
                                        || iw < 0
                                        || ih >= self.x[2] as i64
                                        || iw >= self.x[3] as i64
                                    {
                                        continue;
                                    }
                                    let c = (o / og) * cg + cl;
                                    f(
                                        flat(&self.y, &[n, o, oh, ow]),
                                        flat(&self.x, &[n, c, ih as usize, iw as usize]),
                                        flat(&self.w, &[o, cl, kh, kw]),
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// PyTorch's max_pool2d loop over `[P, H, W]`: values and flat per-plane indices.
fn max_pool_ref(
    x: &Host,
    out: &[usize],
    k: [usize; 2],
    s: [usize; 2],
    p: [i64; 2],
    d: [usize; 2],
) -> (Vec<f64>, Vec<f64>) {
    let xs = dims(&x.ty);
    let r = xs.len();
    let (h, w) = (xs[r - 2] as i64, xs[r - 1] as i64);
    let planes: usize = xs[..r - 2].iter().product();
    let (oh_n, ow_n) = (out[r - 2], out[r - 1]);
    let (mut vals, mut idxs) = (Vec::new(), Vec::new());
    for plane in 0..planes {
        for oh in 0..oh_n {
            for ow in 0..ow_n {
                let mut hs = (oh * s[0]) as i64 - p[0];
                let mut ws = (ow * s[1]) as i64 - p[1];
                let he = (hs + ((k[0] - 1) * d[0]) as i64 + 1).min(h);
                let we = (ws + ((k[1] - 1) * d[1]) as i64 + 1).min(w);
                while hs < 0 {
                    hs += d[0] as i64;
                }
                while ws < 0 {
                    ws += d[1] as i64;
                }
                let (mut best, mut at) = (f64::NEG_INFINITY, hs * w + ws);
                let mut ih = hs;
                while ih < he {
                    let mut iw = ws;
                    while iw < we {
                        let v = x.data[plane * (h * w) as usize + (ih * w + iw) as usize];
                        if v > best || v.is_nan() {
                            best = v;
                            at = ih * w + iw;
                        }
                        iw += d[1] as i64;
                    }
                    ih += d[0] as i64;
                }
                vals.push(best);
                idxs.push(at as f64);
            }
        }
    }
    (vals, idxs)
}

/// For each output position of an avg_pool2d over `[P, H, W]`: its divisor and the input
/// positions of its window (PyTorch's loop).
fn avg_windows(
    xs: &[usize],
    out: &[usize],
    k: [usize; 2],
    s: [usize; 2],
    p: [i64; 2],
    include_pad: bool,
    divisor: Option<i64>,
) -> Vec<(f64, Vec<usize>)> {
    let r = xs.len();
    let (h, w) = (xs[r - 2] as i64, xs[r - 1] as i64);
    let planes: usize = xs[..r - 2].iter().product();
    let mut result = Vec::new();
    for plane in 0..planes {
        for oh in 0..out[r - 2] {
            for ow in 0..out[r - 1] {
                let hs = (oh * s[0]) as i64 - p[0];
                let ws = (ow * s[1]) as i64 - p[1];
                let he = (hs + k[0] as i64).min(h + p[0]);
                let we = (ws + k[1] as i64).min(w + p[1]);
                let pool = (he - hs) * (we - ws);
                let (hs, ws, he, we) = (hs.max(0), ws.max(0), he.min(h), we.min(w));
                let cells: Vec<usize> = (hs..he)
                    .flat_map(|ih| (ws..we).map(move |iw| (ih, iw)))
                    .map(|(ih, iw)| plane * (h * w) as usize + (ih * w + iw) as usize)
                    .collect();
                let div = match divisor {
                    Some(d) => d,
                    None if include_pad => pool,
                    None => (he - hs) * (we - ws),
                };
                result.push((div as f64, cells));
            }
        }
    }
    result
}

/// The windows `[start, end)` of adaptive pooling of `size` into `out`.
fn adaptive_ranges(size: usize, out: usize) -> Vec<(usize, usize)> {
    (0..out)
        .map(|o| (o * size / out, ((o + 1) * size).div_ceil(out)))
        .collect()
}

/// Checks one case's outputs.
type Check = Box<dyn Fn(&[Host]) -> Result<(), String>>;

#[test]
fn values_match_loop_references() {
    use OpId::*;
    let mut cases = Vec::new();
    let mut checks: Vec<Check> = Vec::new();

    // Grouped, strided, dilated 2-d convolution with bias; then all three gradients.
    let geo = Geometry {
        x: vec![2, 4, 7, 6],
        w: vec![6, 2, 3, 2],
        y: vec![2, 6, 4, 4],
        stride: [2, 1],
        padding: [1, 0],
        dilation: [1, 2],
        groups: 2,
    };
    let x = Host::random(DType::F32, &[2, 4, 7, 6], -1.0, 1.0, 1);
    let w = Host::random(DType::F32, &[6, 2, 3, 2], -1.0, 1.0, 2);
    let b = Host::random(DType::F32, &[6], -1.0, 1.0, 3);
    let gy = Host::random(DType::F32, &[2, 6, 4, 4], -1.0, 1.0, 4);
    let cp = ConvP {
        transposed: false,
        groups: 2,
        stride: &[2, 1],
        padding: &[1, 0],
        dilation: &[1, 2],
        output_padding: &[0, 0],
    };
    cases.push(Case::new(
        Convolution,
        vec![x.clone(), w.clone(), b.clone()],
        vec![],
        cp.params(),
    ));
    cases.push(Case::new(
        ConvolutionBackward,
        vec![gy.clone(), x.clone(), w.clone()],
        vec![],
        cp.backward_params(7),
    ));
    {
        let (mut y, mut gx, mut gw) = (vec![0.0; 192], vec![0.0; x.data.len()], vec![0.0; 72]);
        geo.terms(|yi, xi, wi| {
            y[yi] += x.data[xi] * w.data[wi];
            gx[xi] += gy.data[yi] * w.data[wi];
            gw[wi] += gy.data[yi] * x.data[xi];
        });
        for (i, v) in y.iter_mut().enumerate() {
            *v += b.data[(i / 16) % 6];
        }
        let mut gb = vec![0.0; 6];
        for (i, v) in gy.data.iter().enumerate() {
            gb[(i / 16) % 6] += v;
        }
        checks.push(Box::new(move |o| {
            compare("conv2d", &o[0], &f32(&[2, 6, 4, 4]), &y, 4.0)
        }));
        checks.push(Box::new(move |o| {
            compare("conv2d grad_input", &o[0], &f32(&[2, 4, 7, 6]), &gx, 4.0)?;
            compare("conv2d grad_weight", &o[1], &f32(&[6, 2, 3, 2]), &gw, 8.0)?;
            compare("conv2d grad_bias", &o[2], &f32(&[6]), &gb, 8.0)
        }));
    }

    // Transposed, grouped, with output padding: the adjoint of the convolution whose input is
    // the transposed one's output. The mask leaves grad_bias out.
    let tgeo = Geometry {
        x: vec![2, 6, 8, 16],
        w: vec![4, 3, 3, 2],
        y: vec![2, 4, 4, 5],
        stride: [2, 3],
        padding: [1, 0],
        dilation: [1, 1],
        groups: 2,
    };
    let tx = Host::random(DType::F32, &[2, 4, 4, 5], -1.0, 1.0, 5);
    let tw = Host::random(DType::F32, &[4, 3, 3, 2], -1.0, 1.0, 6);
    let tgy = Host::random(DType::F32, &[2, 6, 8, 16], -1.0, 1.0, 7);
    let tp = ConvP {
        transposed: true,
        groups: 2,
        stride: &[2, 3],
        padding: &[1, 0],
        dilation: &[1, 1],
        output_padding: &[1, 2],
    };
    cases.push(Case::new(
        Convolution,
        vec![tx.clone(), tw.clone()],
        vec![],
        tp.params(),
    ));
    cases.push(Case::new(
        ConvolutionBackward,
        vec![tgy.clone(), tx.clone(), tw.clone()],
        vec![],
        tp.backward_params(3),
    ));
    {
        let mut y = vec![0.0; tgy.data.len()];
        let (mut gx, mut gw) = (vec![0.0; tx.data.len()], vec![0.0; tw.data.len()]);
        // The regular convolution's output is the transposed one's input, and vice versa.
        tgeo.terms(|ti, oi, wi| {
            y[oi] += tx.data[ti] * tw.data[wi];
            gx[ti] += tgy.data[oi] * tw.data[wi];
            gw[wi] += tgy.data[oi] * tx.data[ti];
        });
        checks.push(Box::new(move |o| {
            compare("conv_transpose2d", &o[0], &f32(&[2, 6, 8, 16]), &y, 4.0)
        }));
        checks.push(Box::new(move |o| {
            compare(
                "conv_transpose2d grad_input",
                &o[0],
                &f32(&[2, 4, 4, 5]),
                &gx,
                8.0,
            )?;
            compare(
                "conv_transpose2d grad_weight",
                &o[1],
                &f32(&[4, 3, 3, 2]),
                &gw,
                16.0,
            )?;
            compare("conv_transpose2d grad_bias", &o[2], &f32(&[0]), &[], 1.0)
        }));
    }

    // 1-d, padding past the dilated kernel (the input gradient crops the output gradient).
    let geo1 = Geometry {
        x: vec![2, 3, 1, 9],
        w: vec![4, 3, 1, 2],
        y: vec![2, 4, 1, 7],
        stride: [1, 2],
        padding: [0, 3],
        dilation: [1, 1],
        groups: 1,
    };
    let x1 = Host::random(DType::F32, &[2, 3, 9], -1.0, 1.0, 8);
    let w1 = Host::random(DType::F32, &[4, 3, 2], -1.0, 1.0, 9);
    let gy1 = Host::random(DType::F32, &[2, 4, 7], -1.0, 1.0, 10);
    let p1 = ConvP {
        transposed: false,
        groups: 1,
        stride: &[2],
        padding: &[3],
        dilation: &[1],
        output_padding: &[0],
    };
    cases.push(Case::new(
        ConvolutionBackward,
        vec![gy1.clone(), x1.clone(), w1.clone()],
        vec![],
        p1.backward_params(3),
    ));
    {
        let (mut gx, mut gw) = (vec![0.0; x1.data.len()], vec![0.0; w1.data.len()]);
        geo1.terms(|yi, xi, wi| {
            gx[xi] += gy1.data[yi] * w1.data[wi];
            gw[wi] += gy1.data[yi] * x1.data[xi];
        });
        checks.push(Box::new(move |o| {
            compare("conv1d grad_input", &o[0], &f32(&[2, 3, 9]), &gx, 4.0)?;
            compare("conv1d grad_weight", &o[1], &f32(&[4, 3, 2]), &gw, 8.0)
        }));
    }

    // Max pooling with padding, dilation and ceil mode, on random data, on data full of ties,
    // NaNs and -inf, with overlapping windows, and with a window too large to unroll; its
    // gradient through the indices.
    let px = Host::random(DType::F32, &[2, 3, 7, 6], -1.0, 1.0, 11);
    let specials: Vec<f64> = (0..2 * 3 * 7 * 6)
        .map(|i: usize| match (i * 7 + i / 5) % 6 {
            0 => f64::NAN,
            1 | 2 => f64::NEG_INFINITY,
            3 => 1.0,
            _ => -0.5,
        })
        .collect();
    let sx = Host::new(DType::F32, &[2, 3, 7, 6], &specials);
    type Geometry2 = (
        [usize; 2],
        [usize; 2],
        [i64; 2],
        [usize; 2],
        bool,
        [usize; 4],
    );
    let geometries: [(&str, &Host, Geometry2); 5] = [
        (
            "max_pool2d",
            &px,
            ([3, 2], [2, 1], [1, 1], [1, 2], true, [2, 3, 4, 6]),
        ),
        (
            "max_pool2d specials",
            &sx,
            ([3, 2], [2, 1], [1, 1], [1, 2], true, [2, 3, 4, 6]),
        ),
        (
            "max_pool2d overlapping",
            &px,
            ([3, 3], [1, 1], [1, 1], [1, 1], false, [2, 3, 7, 6]),
        ),
        (
            "max_pool2d overlapping specials",
            &sx,
            ([3, 3], [1, 1], [1, 1], [1, 1], false, [2, 3, 7, 6]),
        ),
        (
            "max_pool2d large window",
            &px,
            ([5, 4], [2, 2], [2, 1], [1, 1], false, [2, 3, 4, 3]),
        ),
    ];
    for (seed, (label, x, (k, st, pad, dil, ceil, out))) in geometries.into_iter().enumerate() {
        let to_i64 = |v: &[usize]| v.iter().map(|&d| d as i64).collect::<Vec<i64>>();
        let mp = max_p(&to_i64(&k), &to_i64(&st), &pad, &to_i64(&dil), ceil);
        let (vals, idxs) = max_pool_ref(x, &out, k, st, pad, dil);
        let out_i64 = to_i64(&out);
        let pg = Host::random(DType::F32, &out_i64, -1.0, 1.0, 12 + seed as u64);
        let indices = Host::new(DType::I64, &out_i64, &idxs);
        cases.push(Case::new(
            MaxPool2dWithIndices,
            vec![x.clone()],
            vec![],
            mp.clone(),
        ));
        cases.push(Case::new(
            MaxPool2dWithIndicesBackward,
            vec![pg.clone(), x.clone(), indices],
            vec![],
            mp,
        ));
        // PyTorch's backward: each gradient added at its index, in output order.
        let per_plane = out[2] * out[3];
        let mut gx = vec![0.0; x.data.len()];
        for (i, &at) in idxs.iter().enumerate() {
            gx[(i / per_plane) * 42 + at as usize] += pg.data[i];
        }
        let out_ty = f32(&out_i64);
        let idx_ty = t(DType::I64, &out_i64);
        checks.push(Box::new(move |o| {
            compare(label, &o[0], &out_ty, &vals, 1.0)?;
            compare(&format!("{label} indices"), &o[1], &idx_ty, &idxs, 1.0)
        }));
        checks.push(Box::new(move |o| {
            compare(
                &format!("{label} grad"),
                &o[0],
                &f32(&[2, 3, 7, 6]),
                &gx,
                2.0,
            )
        }));
    }

    // Average pooling: padding excluded in ceil mode, and a divisor override; both gradients.
    for (label, params, include_pad, divisor, out) in [
        (
            "avg_pool2d",
            avg_p(&[3], &[2], &[1], true, false, None),
            false,
            None,
            [2usize, 3, 4, 4],
        ),
        (
            "avg_pool2d divisor",
            avg_p(&[3, 2], &[1, 2], &[1, 0], false, true, Some(4)),
            true,
            Some(4),
            [2, 3, 7, 3],
        ),
    ] {
        let (k, s, p) = if divisor.is_some() {
            ([3, 2], [1, 2], [1, 0])
        } else {
            ([3, 3], [2, 2], [1, 1])
        };
        let windows = avg_windows(&[2, 3, 7, 6], &out, k, s, p, include_pad, divisor);
        let out_i64: Vec<i64> = out.iter().map(|&d| d as i64).collect();
        let g = Host::random(DType::F32, &out_i64, -1.0, 1.0, 13);
        let mut y = Vec::new();
        let mut gx = vec![0.0; px.data.len()];
        for (o, (div, cells)) in windows.iter().enumerate() {
            y.push(cells.iter().map(|&c| px.data[c]).sum::<f64>() / div);
            for &c in cells {
                gx[c] += g.data[o] / div;
            }
        }
        cases.push(Case::new(
            AvgPool2d,
            vec![px.clone()],
            vec![],
            params.clone(),
        ));
        cases.push(Case::new(
            AvgPool2dBackward,
            vec![g, px.clone()],
            vec![],
            params,
        ));
        let out_ty = f32(&out_i64);
        checks.push(Box::new(move |o| compare(label, &o[0], &out_ty, &y, 2.0)));
        checks.push(Box::new(move |o| {
            compare(label, &o[0], &f32(&[2, 3, 7, 6]), &gx, 2.0)
        }));
    }

    // Adaptive average pooling to a size that divides nothing evenly, and its gradient.
    {
        let (hr, wr) = (adaptive_ranges(7, 3), adaptive_ranges(6, 4));
        let g = Host::random(DType::F32, &[2, 3, 3, 4], -1.0, 1.0, 14);
        let mut y = Vec::new();
        let mut gx = vec![0.0; px.data.len()];
        for plane in 0..6 {
            for (oh, &(h0, h1)) in hr.iter().enumerate() {
                for (ow, &(w0, w1)) in wr.iter().enumerate() {
                    let count = ((h1 - h0) * (w1 - w0)) as f64;
                    let mut sum = 0.0;
                    for ih in h0..h1 {
                        for iw in w0..w1 {
                            sum += px.data[plane * 42 + ih * 6 + iw];
                            gx[plane * 42 + ih * 6 + iw] +=
                                g.data[plane * 12 + oh * 4 + ow] / count;
                        }
                    }
                    y.push(sum / count);
                }
            }
        }
        cases.push(Case::new(
            AdaptiveAvgPool2d,
            vec![px.clone()],
            vec![],
            vec![3, 4],
        ));
        cases.push(Case::new(
            AdaptiveAvgPool2dBackward,
            vec![g, px.clone()],
            vec![],
            vec![],
        ));
        checks.push(Box::new(move |o| {
            compare("adaptive_avg_pool2d", &o[0], &f32(&[2, 3, 3, 4]), &y, 2.0)
        }));
        checks.push(Box::new(move |o| {
            compare(
                "adaptive_avg_pool2d grad",
                &o[0],
                &f32(&[2, 3, 7, 6]),
                &gx,
                2.0,
            )
        }));
    }

    let results = run_batch(&cases);
    let failures: Vec<String> = checks
        .iter()
        .zip(&results)
        .filter_map(|(check, outs)| check(outs).err())
        .collect();
    report(failures);
}
