//! Convolution and pooling: N-d (transposed) convolutions and their gradients as
//! `stablehlo.convolution`; 2-d and 3-d max and average pooling, 2-d adaptive average and max
//! pooling, with their gradients.

use crate::dtype::{DType, ScalarValue, Shape, TensorType};
use crate::elementwise::not_implemented_for;
use crate::emitter::{bracket_list, i64_array, Cmp, Emitter, Value};
use crate::error::{ensure, OpError};
use crate::param_layout as layout;
use crate::params::Params;
use crate::{single, LowerArgs, Meta, MetaArgs, MetaOutputs, OpId, OpRule, ScalarDTypes};

fn fmt_shape(s: &[i64]) -> String {
    bracket_list(s)
}

/// The dtype a convolution or pooling op accumulates in: f32 for bf16/f16, as PyTorch's CPU
/// kernels; integers stay as they are.
fn acc_dtype(d: DType) -> DType {
    d.compute_dtype()
}

fn zeros(e: &mut Emitter, ty: &TensorType) -> Value {
    e.constant(ty.clone(), ScalarValue::Int(0))
}

// ===== convolution ================================================================================

struct Conv {
    transposed: bool,
    groups: i64,
    stride: Vec<i64>,
    padding: Vec<i64>,
    dilation: Vec<i64>,
    output_padding: Vec<i64>,
}

impl Conv {
    /// The convolution of `convolution_overrideable` or of its backward op; the backward op's
    /// output mask too (all on for the forward op).
    fn parse(p: &Params) -> Result<(Conv, [bool; 3]), OpError> {
        let (mask, transposed, groups, lists) = if p.op() == OpId::ConvolutionBackward {
            let l = layout::ConvolutionBackward::decode(p)?;
            let lists = [l.stride, l.padding, l.dilation, l.output_padding];
            (l.output_mask, l.transposed, l.groups, lists)
        } else {
            let l = layout::Convolution::decode(p)?;
            let lists = [l.stride, l.padding, l.dilation, l.output_padding];
            ([true; 3], l.transposed, l.groups, lists)
        };
        let n = lists[0].len();
        if lists.iter().any(|l| l.len() != n) {
            return Err(p.invalid(
                "stride, padding, dilation and output_padding need one value per spatial dim",
            ));
        }
        let conv = Conv {
            transposed,
            groups,
            stride: lists[0].to_vec(),
            padding: lists[1].to_vec(),
            dilation: lists[2].to_vec(),
            output_padding: lists[3].to_vec(),
        };
        Ok((conv, mask))
    }

    /// The output shape of the convolution of `x` by `w`, with PyTorch's checks.
    fn output_shape(
        &self,
        x: &TensorType,
        w: &TensorType,
        bias: Option<&TensorType>,
    ) -> Result<Shape, OpError> {
        let n = self.stride.len();
        ensure!(
            self.padding.iter().all(|&v| v >= 0),
            "negative padding is not supported"
        );
        if let Some((d, p)) = self
            .padding
            .iter()
            .enumerate()
            .find(|&(_, &p)| p > i64::MAX / 2)
        {
            return Err(OpError::runtime(format!(
                "Given padding={p} at dimension {d} , expected padding to be at most {}",
                i64::MAX / 2
            )));
        }
        ensure!(
            self.output_padding.iter().all(|&v| v >= 0),
            "negative output_padding is not supported"
        );
        ensure!(
            self.stride.iter().all(|&v| v > 0),
            "non-positive stride is not supported"
        );
        ensure!(
            self.dilation.iter().all(|&v| v > 0),
            "non-positive dilation is not supported"
        );
        ensure!(self.groups > 0, "non-positive groups is not supported");
        let k = w.rank();
        ensure!(
            x.rank() == k,
            "Expected {k}-dimensional input for {k}-dimensional weight {}, but got {}-dimensional input of size {} instead",
            fmt_shape(&w.shape),
            x.rank(),
            fmt_shape(&x.shape)
        );
        ensure!(
            k >= 3 && n == k - 2,
            "expected stride to be a single integer value or a list of {} values to match the convolution dimensions, but got stride={}",
            k.saturating_sub(2),
            fmt_shape(&self.stride)
        );
        ensure!(
            x.dtype == w.dtype,
            "Input type ({}) and weight type ({}) should be the same",
            x.dtype.scalar_type_name(),
            w.dtype.scalar_type_name()
        );
        if let Some(b) = bias {
            ensure!(
                x.dtype == b.dtype,
                "Input type ({}) and bias type ({}) should be the same",
                x.dtype.scalar_type_name(),
                b.dtype.scalar_type_name()
            );
        }
        if x.dtype == DType::Bool {
            let kernel = if n == 3 {
                "slow_conv3d_cpu"
            } else {
                "slow_conv2d_cpu"
            };
            return Err(not_implemented_for(kernel, x.dtype));
        }
        let g = self.groups;
        ensure!(
            w.shape[0] % g == 0,
            "Given groups={g}, expected weight to be divisible by {g} at dimension 0, but got weight of size [{}] instead",
            fmt_shape(&w.shape)
        );
        let spatial = &x.shape[2..];
        let kernel = &w.shape[2..];
        let out_channels;
        let mut out: Shape = Shape::from_slice(&[x.shape[0]]);
        if !self.transposed {
            out_channels = w.shape[0];
            ensure!(
                x.shape[1] == w.shape[1] * g,
                "Given groups={g}, weight of size {}, expected input{} to have {} channels, but got {} channels instead",
                fmt_shape(&w.shape),
                fmt_shape(&x.shape),
                w.shape[1] * g,
                x.shape[1]
            );
            if let Some(b) = bias {
                ensure!(
                    b.rank() == 1 && b.shape[0] == out_channels,
                    "Given weight of size {}, expected bias to be 1-dimensional with {out_channels} elements, but got bias of size {} instead",
                    fmt_shape(&w.shape),
                    fmt_shape(&b.shape)
                );
            }
            // In i128: padding and dilation come from user input and may be near i64's bounds.
            let padded: Vec<i128> = (0..n)
                .map(|i| i128::from(spatial[i]) + 2 * i128::from(self.padding[i]))
                .collect();
            let dilated: Vec<i128> = (0..n)
                .map(|i| i128::from(self.dilation[i]) * (i128::from(kernel[i]) - 1) + 1)
                .collect();
            if (0..n).any(|i| padded[i] < dilated[i]) {
                let join = |v: &[i128]| {
                    v.iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(" x ")
                };
                return Err(OpError::runtime(format!(
                    "Calculated padded input size per channel: ({}). Kernel size: ({}). Kernel size can't be greater than actual input size",
                    join(&padded),
                    join(&dilated)
                )));
            }
            out.push(out_channels);
            for i in 0..n {
                // At most the padded size, which fits in i64 with padding at most i64::MAX / 2.
                let o = (padded[i] - dilated[i]) / i128::from(self.stride[i]) + 1;
                out.push(output_size(o, i)?);
            }
        } else {
            out_channels = w.shape[1] * g;
            ensure!(
                x.shape[1] == w.shape[0],
                "Given transposed=1, weight of size {}, expected input{} to have {} channels, but got {} channels instead",
                fmt_shape(&w.shape),
                fmt_shape(&x.shape),
                w.shape[0],
                x.shape[1]
            );
            if let Some(b) = bias {
                ensure!(
                    b.rank() == 1 && b.shape[0] == out_channels,
                    "Given transposed=1, weight of size {}, expected bias to be 1-dimensional with {out_channels} elements, but got bias of size {} instead",
                    fmt_shape(&w.shape),
                    fmt_shape(&b.shape)
                );
            }
            let op = &self.output_padding;
            if (0..n).any(|i| op[i] >= self.stride[i] && op[i] >= self.dilation[i]) {
                let names: &[&str] = match n {
                    1 => &["width"],
                    2 => &["height", "width"],
                    _ => &["depth", "height", "width"],
                };
                let part = |what: &str, v: &[i64]| {
                    names
                        .iter()
                        .zip(v)
                        .map(|(d, x)| format!("{what}_{d}: {x}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                return Err(OpError::runtime(format!(
                    "output padding must be smaller than either stride or dilation, but got {} {} {}",
                    part("output_padding", op),
                    part("stride", &self.stride),
                    part("dilation", &self.dilation)
                )));
            }
            out.push(out_channels);
            for i in 0..n {
                let o = (i128::from(spatial[i]) - 1) * i128::from(self.stride[i])
                    - 2 * i128::from(self.padding[i])
                    + i128::from(self.dilation[i]) * (i128::from(kernel[i]) - 1)
                    + i128::from(op[i])
                    + 1;
                out.push(output_size(o, i)?);
            }
            if out[2..].iter().any(|&o| o <= 0) {
                return Err(OpError::runtime(format!(
                    "Given input size per channel: ({}). Calculated output size per channel: ({}). Output size is too small",
                    fmt_list(spatial),
                    fmt_list(&out[2..])
                )));
            }
        }
        Ok(out)
    }
}

/// A convolution's output size at spatial dim `d`, computed in i128, as an int64.
fn output_size(o: i128, d: usize) -> Result<i64, OpError> {
    i64::try_from(o).map_err(|_| {
        OpError::runtime(format!(
            "the convolution's output size {o} at spatial dimension {d} does not fit in int64; expected a stride, padding, dilation and output_padding that give a smaller output"
        ))
    })
}

fn fmt_list(v: &[i64]) -> String {
    v.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(" x ")
}

/// The window of one `stablehlo.convolution`, per spatial dim.
struct Window {
    strides: Vec<i64>,
    lo: Vec<i64>,
    hi: Vec<i64>,
    lhs_dilation: Vec<i64>,
    rhs_dilation: Vec<i64>,
}

/// `stablehlo.convolution` of `lhs` by `rhs`. Unswapped, the operands are `[batch, feature,
/// spatial...]` and `[out feature, in feature, spatial...]` and so is the result; swapped (the
/// weight gradient), their first two dims trade roles, and the result is `[feature, batch, ...]`.
fn convolution(
    e: &mut Emitter,
    lhs: Value,
    rhs: Value,
    swapped: bool,
    mut win: Window,
    feature_groups: i64,
    batch_groups: i64,
) -> Value {
    let n = win.strides.len();
    let mut lhs = lhs;
    if win.lo.iter().chain(&win.hi).any(|&p| p < 0) {
        // A negative padding crops; stablehlo.pad does that (and the lhs dilation) explicitly.
        let zero = e.scalar_constant(e.dtype(lhs), ScalarValue::Int(0));
        let mut low = vec![0; n + 2];
        let mut high = vec![0; n + 2];
        let mut interior = vec![0; n + 2];
        for i in 0..n {
            low[2 + i] = win.lo[i];
            high[2 + i] = win.hi[i];
            interior[2 + i] = win.lhs_dilation[i] - 1;
        }
        lhs = e.pad(lhs, zero, &low, &high, &interior);
        win.lo = vec![0; n];
        win.hi = vec![0; n];
        win.lhs_dilation = vec![1; n];
    }
    let ls = e.shape(lhs).to_vec();
    let rs = e.shape(rhs).to_vec();
    let (batch_dim, out_feature_dim) = if swapped { (1, 1) } else { (0, 0) };
    let batch = ls[batch_dim] / batch_groups;
    let features = rs[out_feature_dim];
    let mut shape: Shape = if swapped {
        Shape::from_slice(&[features, batch])
    } else {
        Shape::from_slice(&[batch, features])
    };
    for i in 0..n {
        let dilated = (ls[2 + i] - 1) * win.lhs_dilation[i] + 1 + win.lo[i] + win.hi[i];
        let window = (rs[2 + i] - 1) * win.rhs_dilation[i] + 1;
        shape.push((dilated - window) / win.strides[i] + 1);
    }
    let dims: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let spec = |a: &str, b: &str| format!("[{a}, {b}, {}]", dims.join(", "));
    let (lhs_spec, rhs_spec, out_spec) = if swapped {
        (spec("f", "b"), spec("i", "o"), spec("f", "b"))
    } else {
        (spec("b", "f"), spec("o", "i"), spec("b", "f"))
    };
    let padding: Vec<String> = (0..n)
        .map(|i| format!("[{}, {}]", win.lo[i], win.hi[i]))
        .collect();
    let attrs = format!(
        "batch_group_count = {batch_groups} : i64, dimension_numbers = #stablehlo.conv<{lhs_spec}x{rhs_spec}->{out_spec}>, feature_group_count = {feature_groups} : i64, lhs_dilation = {}, padding = dense<[{}]> : tensor<{n}x2xi64>, rhs_dilation = {}, window_strides = {}{}",
        i64_array(&win.lhs_dilation),
        padding.join(", "),
        i64_array(&win.rhs_dilation),
        i64_array(&win.strides),
        e.precision_config(lhs)
    );
    let ty = e.ty(lhs).with_shape(&shape);
    e.op("stablehlo.convolution", &[lhs, rhs], &attrs, ty)
}

/// `x` `[N, C, S...]` correlated with `w` `[O, C/g, K...]`, padded by `lo`/`hi`.
fn conv_forward(e: &mut Emitter, x: Value, w: Value, c: &Conv, lo: &[i64], hi: &[i64]) -> Value {
    let n = c.stride.len();
    let win = Window {
        strides: c.stride.clone(),
        lo: lo.to_vec(),
        hi: hi.to_vec(),
        lhs_dilation: vec![1; n],
        rhs_dilation: c.dilation.clone(),
    };
    convolution(e, x, w, false, win, c.groups, 1)
}

/// The gradient, of spatial size `size`, of `conv_forward(x, w)` (padding `c.padding` both
/// sides) with respect to `x`, given `gy` `[N, O, Y...]`: the output gradient dilated by the
/// stride and correlated with the spatially reversed weight, its feature dims swapped per group.
fn conv_input_grad(e: &mut Emitter, gy: Value, w: Value, c: &Conv, size: &[i64]) -> Value {
    let n = c.stride.len();
    let ws = e.shape(w).to_vec();
    let g = c.groups;
    let (o, cg) = (ws[0], ws[1]);
    let mut grouped = vec![g, o / g, cg];
    grouped.extend_from_slice(&ws[2..]);
    let wg = e.reshape(w, &grouped);
    let mut perm = vec![0, 2, 1];
    perm.extend(3..n + 3);
    let wt = e.transpose(wg, &perm);
    let mut swapped_shape = vec![g * cg, o / g];
    swapped_shape.extend_from_slice(&ws[2..]);
    let wt = e.reshape(wt, &swapped_shape);
    let spatial: Vec<usize> = (2..n + 2).collect();
    let wr = e.reverse(wt, &spatial);
    let ys = e.shape(gy).to_vec();
    let mut lo = Vec::with_capacity(n);
    let mut hi = Vec::with_capacity(n);
    for i in 0..n {
        let span = c.dilation[i] * (ws[2 + i] - 1);
        lo.push(span - c.padding[i]);
        hi.push(size[i] + c.padding[i] - (ys[2 + i] - 1) * c.stride[i] - 1);
    }
    let win = Window {
        strides: vec![1; n],
        lo,
        hi,
        lhs_dilation: c.stride.clone(),
        rhs_dilation: c.dilation.clone(),
    };
    convolution(e, gy, wr, false, win, g, 1)
}

/// The gradient of `conv_forward(x, w)` with respect to `w` (spatial size `kernel`), given `gy`:
/// `x` correlated with `gy` over the batch, the groups split along x's channels.
fn conv_weight_grad(e: &mut Emitter, x: Value, gy: Value, c: &Conv, kernel: &[i64]) -> Value {
    let n = c.stride.len();
    let xs = e.shape(x).to_vec();
    let ys = e.shape(gy).to_vec();
    let mut hi = Vec::with_capacity(n);
    for i in 0..n {
        hi.push(
            (ys[2 + i] - 1) * c.stride[i] + c.dilation[i] * (kernel[i] - 1) + 1
                - xs[2 + i]
                - c.padding[i],
        );
    }
    let win = Window {
        strides: c.dilation.clone(),
        lo: c.padding.clone(),
        hi,
        lhs_dilation: vec![1; n],
        rhs_dilation: c.stride.clone(),
    };
    convolution(e, x, gy, true, win, 1, c.groups)
}

// ---- rules: each op's meta beside its lowering --------------------------------------------

/// `convolution_overrideable`: an N-d convolution, or a transposed one, with an optional bias.
pub(crate) struct Convolution;

impl OpRule for Convolution {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(2..=3, 0..=0)?;
        let (c, _) = Conv::parse(&a.params)?;
        let shape = c.output_shape(&i[0], &i[1], i.get(2))?;
        Ok(Meta::single(
            TensorType {
                dtype: i[0].dtype,
                shape,
            },
            vec![],
        ))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let (c, _) = Conv::parse(&a.params)?;
        let out = a.out(0).clone();
        if out.numel() == 0 {
            return Ok(vec![zeros(e, &out)]);
        }
        let cd = acc_dtype(out.dtype);
        let x = e.convert(a.inputs[0], cd);
        let w = e.convert(a.inputs[1], cd);
        let y = if c.transposed {
            conv_input_grad(e, x, w, &c, &out.shape[2..])
        } else {
            conv_forward(e, x, w, &c, &c.padding, &c.padding)
        };
        let y = match a.inputs.get(2) {
            Some(&b) => {
                let b = e.convert(b, cd);
                let b = e.broadcast_in_dim(b, &out.shape, &[1]);
                e.add(y, b)
            }
            None => y,
        };
        Ok(vec![e.convert(y, out.dtype)])
    }
}

/// `convolution_backward_overrideable`: the gradients of a convolution's input, weight and
/// bias that the output mask asks for (the others empty placeholders).
pub(crate) struct ConvolutionBackward;

impl OpRule for ConvolutionBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(3..=3, 0..=0)?;
        let (c, mask) = Conv::parse(&a.params)?;
        let (gy, x, w) = (&i[0], &i[1], &i[2]);
        let expected = c.output_shape(x, w, None)?;
        ensure!(
            gy.shape == expected,
            "convolution_backward: expected grad_output of shape {}, but got {}",
            fmt_shape(&expected),
            fmt_shape(&gy.shape)
        );
        ensure!(
            gy.dtype == x.dtype,
            "expected scalar type {} but found {}",
            x.dtype.scalar_type_name(),
            gy.dtype.scalar_type_name()
        );
        if !x.dtype.is_float() {
            return Err(not_implemented_for("slow_conv2d_cpu_grad_input", x.dtype));
        }
        // A gradient the mask leaves out is an empty placeholder, dropped by the kernel.
        let pick = |bit: usize, ty: TensorType| {
            if mask[bit] {
                ty
            } else {
                TensorType::new(ty.dtype, &[0])
            }
        };
        let mut outputs = MetaOutputs::new();
        outputs.push(pick(0, x.clone()));
        outputs.push(pick(1, w.clone()));
        outputs.push(pick(2, TensorType::new(gy.dtype, &gy.shape[1..2])));
        Ok(Meta::of_outputs(outputs))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let (c, mask) = Conv::parse(&a.params)?;
        let (gy, x, w) = (a.inputs[0], a.inputs[1], a.inputs[2]);
        let (xt, wt, gt) = (e.ty(x).clone(), e.ty(w).clone(), e.ty(gy).clone());
        let cd = acc_dtype(xt.dtype);
        let empty = gt.numel() == 0 || xt.numel() == 0 || wt.numel() == 0;
        let gyc = e.convert(gy, cd);
        let xc = e.convert(x, cd);
        let wc = e.convert(w, cd);
        let mut outs = Vec::new();
        if !mask[0] {
            outs.push(zeros(e, a.out(0)));
        } else {
            let gx = if empty {
                zeros(e, &xt.with_dtype(cd))
            } else if c.transposed {
                let n = c.stride.len();
                let (xs, ys, ks) = (&xt.shape[2..], &gt.shape[2..], &wt.shape[2..]);
                let hi: Vec<i64> = (0..n)
                    .map(|i| {
                        (xs[i] - 1) * c.stride[i] + c.dilation[i] * (ks[i] - 1) + 1
                            - ys[i]
                            - c.padding[i]
                    })
                    .collect();
                conv_forward(e, gyc, wc, &c, &c.padding, &hi)
            } else {
                conv_input_grad(e, gyc, wc, &c, &xt.shape[2..])
            };
            outs.push(e.convert(gx, xt.dtype));
        }
        if !mask[1] {
            outs.push(zeros(e, a.out(1)));
        } else {
            let gw = if empty {
                zeros(e, &wt.with_dtype(cd))
            } else if c.transposed {
                conv_weight_grad(e, gyc, xc, &c, &wt.shape[2..])
            } else {
                conv_weight_grad(e, xc, gyc, &c, &wt.shape[2..])
            };
            outs.push(e.convert(gw, wt.dtype));
        }
        if !mask[2] {
            outs.push(zeros(e, a.out(2)));
        } else {
            let dims: Vec<usize> = (0..gt.rank()).filter(|&d| d != 1).collect();
            let gb = e.reduce_sum(gyc, &dims);
            outs.push(e.convert(gb, gt.dtype));
        }
        Ok(outs)
    }
}

// ===== pooling =====================================================================================

/// The ops pooling over three spatial dims (depth, height, width); the others pool over two.
fn spatial_dims(op: OpId) -> usize {
    match op {
        OpId::MaxPool3dWithIndices
        | OpId::MaxPool3dWithIndicesBackward
        | OpId::AvgPool3d
        | OpId::AvgPool3dBackward => 3,
        _ => 2,
    }
}

fn is_max_pool(op: OpId) -> bool {
    matches!(
        op,
        OpId::MaxPool2dWithIndices
            | OpId::MaxPool2dWithIndicesBackward
            | OpId::MaxPool3dWithIndices
            | OpId::MaxPool3dWithIndicesBackward
    )
}

/// The pooling window of max_pool2d/3d and avg_pool2d/3d, one value per spatial dim.
struct Pool {
    kernel: Vec<i64>,
    stride: Vec<i64>,
    padding: Vec<i64>,
    dilation: Vec<i64>,
    ceil_mode: bool,
    count_include_pad: bool,
    divisor: Option<i64>,
}

/// A list of one or `n` ints as one value per spatial dim (None when empty and that is
/// allowed).
fn per_dim(
    l: &[i64],
    n: usize,
    message: impl FnOnce() -> String,
    allow_empty: bool,
) -> Result<Option<Vec<i64>>, OpError> {
    match l.len() {
        0 if allow_empty => Ok(None),
        1 => Ok(Some(vec![l[0]; n])),
        k if k == n => Ok(Some(l.to_vec())),
        _ => Err(OpError::runtime(message())),
    }
}

impl Pool {
    fn parse(op: OpId, p: &Params) -> Result<Pool, OpError> {
        let max = is_max_pool(op);
        let n = spatial_dims(op);
        let name = match (max, n) {
            (true, 2) => "max_pool2d",
            (true, _) => "max_pool3d",
            (false, 2) => "avg_pool2d",
            (false, _) => "avg_pool3d",
        };
        let tuple = if n == 2 { "two" } else { "three" };
        // avg_pool3d words its argument errors a little differently.
        let either = if !max && n == 3 { "" } else { "either " };
        let (ceil_mode, count_include_pad, lists, divisor) = if max {
            let l = layout::MaxPool::decode(p)?;
            let lists = [l.kernel_size, l.stride, l.padding, l.dilation];
            (l.ceil_mode, false, lists, None)
        } else {
            let l = layout::AvgPool::decode(p)?;
            let lists = [l.kernel_size, l.stride, l.padding, &[][..]];
            (l.ceil_mode, l.count_include_pad, lists, l.divisor_override)
        };
        let kernel = per_dim(
            lists[0],
            n,
            || {
                format!(
                    "{name}: kernel_size must {either}be a single int, or a tuple of {tuple} ints"
                )
            },
            false,
        )?
        .expect("non-empty");
        let stride = per_dim(
            lists[1],
            n,
            || {
                format!(
                    "{name}: stride must {either}be omitted, a single int, or a tuple of {tuple} ints"
                )
            },
            true,
        )?
        .unwrap_or_else(|| kernel.clone());
        let padding = per_dim(
            lists[2],
            n,
            || format!("{name}: padding must {either}be a single int, or a tuple of {tuple} ints"),
            false,
        )?
        .expect("non-empty");
        let dilation = if max {
            per_dim(
                lists[3],
                n,
                || {
                    format!(
                        "{name}: dilation must be either a single int, or a tuple of {tuple} ints"
                    )
                },
                false,
            )?
            .expect("non-empty")
        } else {
            vec![1; n]
        };
        // PyTorch's kernels take these as C ints (`safe_downcast<int, int64_t>`).
        for (what, values) in [
            ("kernel_size", &kernel),
            ("stride", &stride),
            ("padding", &padding),
            ("dilation", &dilation),
        ] {
            if let Some((d, v)) = values
                .iter()
                .enumerate()
                .find(|&(_, &v)| i32::try_from(v).is_err())
            {
                return Err(OpError::runtime(format!(
                    "value cannot be converted to type int without overflow: {name}'s {what} {v} at dimension {d}; expected values from {} to {}",
                    i32::MIN,
                    i32::MAX
                )));
            }
        }
        if let Some(d) = divisor {
            ensure!(d != 0, "divisor must be not zero");
        }
        Ok(Pool {
            kernel,
            stride,
            padding,
            dilation,
            ceil_mode,
            count_include_pad,
            divisor,
        })
    }

    fn n(&self) -> usize {
        self.kernel.len()
    }

    /// PyTorch's pooling output size along one spatial dim, with its checks.
    fn out_size(&self, size: i64, d: usize) -> Result<i64, OpError> {
        let (k, s, p, dil) = (
            self.kernel[d],
            self.stride[d],
            self.padding[d],
            self.dilation[d],
        );
        ensure!(s != 0, "stride should not be zero");
        ensure!(p >= 0, "pad must be non-negative, but got pad: {p}");
        // In i128: the window's sizes come from user input and may be near i64's bounds.
        let (size, k, s, p, dil) = (
            i128::from(size),
            i128::from(k),
            i128::from(s),
            i128::from(p),
            i128::from(dil),
        );
        ensure!(
            p <= ((k - 1) * dil + 1) / 2,
            "pad should be at most half of effective kernel size, but got pad={p}, kernel_size={k} and dilation={dil}"
        );
        let extra = if self.ceil_mode { s - 1 } else { 0 };
        let mut out = (size + 2 * p - dil * (k - 1) - 1 + extra).div_euclid(s) + 1;
        if self.ceil_mode && (out - 1) * s >= size + p {
            out -= 1;
        }
        i64::try_from(out).map_err(|_| {
            OpError::runtime(format!(
                "the pooling output size {out} at spatial dimension {d} does not fit in int64; expected a kernel_size, stride, padding and dilation that give a smaller output"
            ))
        })
    }

    /// The output shape for input `x`, with PyTorch's checks.
    fn output_shape(&self, op: OpId, x: &TensorType) -> Result<Shape, OpError> {
        if self.n() == 3 {
            return self.output_shape_3d(op, x);
        }
        let r = x.rank();
        let max = is_max_pool(op);
        if max {
            ensure!(
                r == 3 || r == 4,
                "non-empty 3D or 4D (batch mode) tensor expected for input"
            );
        } else if r < 3 {
            return Err(OpError::index(format!(
                "Dimension out of range (expected to be in range of [-{r}, {}], but got -3)",
                r as i64 - 1
            )));
        }
        let oh = self.out_size(x.shape[r - 2], 0)?;
        let ow = self.out_size(x.shape[r - 1], 1)?;
        let (kh, kw) = (self.kernel[0], self.kernel[1]);
        let (sh, sw) = (self.stride[0], self.stride[1]);
        let (dh, dw) = (self.dilation[0], self.dilation[1]);
        ensure!(
            kw > 0 && kh > 0,
            "kernel size should be greater than zero, but got kH: {kh} kW: {kw}"
        );
        ensure!(
            sw > 0 && sh > 0,
            "stride should be greater than zero, but got dH: {sh} dW: {sw}"
        );
        ensure!(
            dh > 0 && dw > 0,
            "dilation should be greater than zero, but got dilationH: {dh} dilationW: {dw}"
        );
        let valid = r >= 3
            && x.shape[r - 2] != 0
            && x.shape[r - 1] != 0
            && x.shape[r - 3] != 0
            && (r == 3 || r == 4);
        ensure!(
            valid,
            "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:{}",
            fmt_shape(&x.shape)
        );
        let (ph, pw) = (self.padding[0], self.padding[1]);
        ensure!(
            kw / 2 >= pw && kh / 2 >= ph,
            "pad should be smaller than or equal to half of kernel size, but got padW = {pw}, padH = {ph}, kW = {kw}, kH = {kh}"
        );
        let c = x.shape[r - 3];
        ensure!(
            oh >= 1 && ow >= 1,
            "Given input size: ({c}x{}x{}). Calculated output size: ({c}x{oh}x{ow}). Output size is too small",
            x.shape[r - 2],
            x.shape[r - 1]
        );
        let mut s = Shape::from_slice(&x.shape[..r - 2]);
        s.push(oh);
        s.push(ow);
        Ok(s)
    }

    /// max_pool3d / avg_pool3d: PyTorch's pool3d_shape_check.
    fn output_shape_3d(&self, op: OpId, x: &TensorType) -> Result<Shape, OpError> {
        let r = x.rank();
        let max = is_max_pool(op);
        ensure!(
            r == 4 || r == 5,
            "non-empty 4D or 5D (batch mode) tensor expected for input"
        );
        let input = &x.shape[r - 3..];
        // The output sizes come first, with their own checks, as in PyTorch.
        let out = [
            self.out_size(input[0], 0)?,
            self.out_size(input[1], 1)?,
            self.out_size(input[2], 2)?,
        ];
        let (k, s, d, p) = (&self.kernel, &self.stride, &self.dilation, &self.padding);
        ensure!(
            k.iter().all(|&v| v > 0),
            "kernel size should be greater than zero, but got kT: {} kH: {} kW: {}",
            k[0],
            k[1],
            k[2]
        );
        ensure!(
            s.iter().all(|&v| v > 0),
            "stride should be greater than zero, but got dT: {} dH: {} dW: {}",
            s[0],
            s[1],
            s[2]
        );
        ensure!(
            d.iter().all(|&v| v > 0),
            "dilation should be greater than zero, but got dilationT: {} dilationH: {} dilationW: {}",
            d[0],
            d[1],
            d[2]
        );
        let fn_name = if max { "max_pool3d" } else { "avg_pool3d" };
        for i in 0..r {
            if r == 5 && i == 0 {
                continue;
            }
            ensure!(
                x.shape[i] > 0,
                "{fn_name}: Expected input's non-batch dimensions to have positive length, but input has a shape of {} and non-batch dimension {} has length zero!",
                fmt_shape(&x.shape),
                x.shape[i]
            );
        }
        if !max {
            ensure!(
                input.iter().zip(k).all(|(&i, &k)| i >= k),
                "input image (T: {} H: {} W: {}) smaller than kernel size (kT: {} kH: {} kW: {})",
                input[0],
                input[1],
                input[2],
                k[0],
                k[1],
                k[2]
            );
        }
        ensure!(
            k[0] / 2 >= p[0] && k[2] / 2 >= p[2] && k[1] / 2 >= p[1],
            "pad should be smaller than or equal to half of kernel size, but got kT: {} kW: {} kH: {} padT: {} padW: {} padH: {}",
            k[0],
            k[2],
            k[1],
            p[0],
            p[2],
            p[1]
        );
        let c = x.shape[r - 4];
        ensure!(
            out.iter().all(|&o| o >= 1),
            "Given input size: ({c}x{}x{}x{}). Calculated output size: ({c}x{}x{}x{}). Output size is too small",
            input[0],
            input[1],
            input[2],
            out[0],
            out[1],
            out[2]
        );
        let mut s = Shape::from_slice(&x.shape[..r - 3]);
        s.extend_from_slice(&out);
        Ok(s)
    }

    /// The high-side padding along spatial dim `d` that makes the last window fit exactly
    /// (negative: the input's tail is never read).
    fn high_pad(&self, size: i64, out: i64, d: usize) -> i64 {
        (out - 1) * self.stride[d] + self.dilation[d] * (self.kernel[d] - 1) + 1
            - size
            - self.padding[d]
    }

    /// The high-side padding of every spatial dim of `x` for output shape `out`.
    fn high_pads(&self, x: &[i64], out: &[i64]) -> Vec<i64> {
        let (n, r) = (self.n(), x.len());
        (0..n)
            .map(|d| self.high_pad(x[r - n + d], out[r - n + d], d))
            .collect()
    }

    /// The divisor of each output position along spatial dim `d`, as PyTorch's avg_pool2d
    /// (1 where a window holds no input element: its sum is 0 and so is PyTorch's result).
    fn divisors(&self, size: i64, out: i64, d: usize) -> Vec<i64> {
        let (k, s, p) = (self.kernel[d], self.stride[d], self.padding[d]);
        (0..out)
            .map(|o| {
                let start = o * s - p;
                let end = (start + k).min(size + p);
                let valid = end.min(size) - start.max(0);
                if valid <= 0 {
                    1
                } else if self.count_include_pad {
                    end - start
                } else {
                    valid
                }
            })
            .collect()
    }
}

/// Checks that `g` has the shape `expected` (the forward output) in its channel and `n`
/// spatial dims, in PyTorch's words.
fn check_grad_shape(g: &TensorType, expected: &[i64], n: usize) -> Result<(), OpError> {
    let r = expected.len();
    for (d, &want) in expected.iter().enumerate().skip(r - n - 1) {
        ensure!(
            g.rank() == r && g.shape[d] == want,
            "Expected a tensor of dimension {r} and tensor.size[{d}] == {want} but got: dimension {} and tensor.size[{d}] = {}",
            g.rank(),
            g.shape.get(d).copied().unwrap_or(0)
        );
    }
    Ok(())
}

/// `stablehlo.reduce_window` over `inputs` with `window`, `strides` and `dilations` per dim and
/// no padding; `body` combines `(accumulators..., elements...)`.
fn reduce_window(
    e: &mut Emitter,
    inputs: &[Value],
    inits: &[Value],
    window: &[i64],
    strides: &[i64],
    dilations: &[i64],
    body: impl FnOnce(&mut Emitter, &[Value]) -> Vec<Value>,
) -> Vec<Value> {
    let scalar_types: Vec<TensorType> = inits
        .iter()
        .map(|&v| TensorType::scalar(e.dtype(v)))
        .collect();
    let mut arg_types = scalar_types.clone();
    arg_types.extend(scalar_types);
    let region = e.region(&arg_types, body);
    let shape: Shape = e
        .shape(inputs[0])
        .iter()
        .enumerate()
        .map(|(i, &n)| (n - ((window[i] - 1) * dilations[i] + 1)) / strides[i] + 1)
        .collect();
    let results: Vec<TensorType> = inputs.iter().map(|&v| e.ty(v).with_shape(&shape)).collect();
    let mut operands = inputs.to_vec();
    operands.extend_from_slice(inits);
    let attrs = format!(
        "window_dilations = {}, window_dimensions = {}, window_strides = {}",
        i64_array(dilations),
        i64_array(window),
        i64_array(strides)
    );
    e.op_with_regions(
        "stablehlo.reduce_window",
        &operands,
        &[region],
        &attrs,
        results,
    )
}

/// Window sizes, strides and dilations over all dims of a rank-`r` tensor: `spatial` in the
/// last dims, 1 elsewhere.
fn full_window(r: usize, spatial: &[i64]) -> Vec<i64> {
    let mut v = vec![1; r];
    v[r - spatial.len()..].copy_from_slice(spatial);
    v
}

/// Pad the last `lo.len()` dims of `x` with `value`: `lo` before, `hi` after, `interior`
/// between.
fn pad_spatial(
    e: &mut Emitter,
    x: Value,
    value: Value,
    lo: &[i64],
    hi: &[i64],
    interior: &[i64],
) -> Value {
    if lo.iter().chain(hi).chain(interior).all(|&v| v == 0) {
        return x;
    }
    let r = e.rank(x);
    let spread = |v: &[i64]| {
        let mut s = vec![0; r];
        s[r - v.len()..].copy_from_slice(v);
        s
    };
    e.pad(x, value, &spread(lo), &spread(hi), &spread(interior))
}

/// The smallest value of `dtype` (the identity of max).
fn lowest(dtype: DType) -> ScalarValue {
    if dtype.is_float() {
        ScalarValue::Float(f64::NEG_INFINITY)
    } else {
        ScalarValue::Int(dtype.min_value() as i64)
    }
}

/// Each element's flat position within its plane (the last `n` dims), row-major: the index
/// PyTorch's max pooling returns.
fn plane_positions(e: &mut Emitter, shape: &[i64], n: usize) -> Value {
    let r = shape.len();
    let ty = TensorType::new(DType::I64, shape);
    let mut idx: Option<Value> = None;
    let mut step = 1;
    for d in (r - n..r).rev() {
        let mut term = e.iota(ty.clone(), d);
        if step != 1 {
            let k = e.full_like(term, step as f64);
            term = e.mul(term, k);
        }
        idx = Some(match idx {
            Some(acc) => e.add(term, acc),
            None => term,
        });
        step *= shape[d];
    }
    idx.expect("at least one spatial dim")
}

/// PyTorch scans a window in index order and keeps an element that is greater than the best so
/// far, or NaN: the first of equal maxima wins, and the last NaN. As a commutative choice of
/// `(value, index)` pairs: NaN beats numbers, a larger index wins between NaNs, a smaller one
/// between equals.
fn pick_max(e: &mut Emitter, args: &[Value], float: bool) -> Vec<Value> {
    let (av, ai, bv, bi) = (args[0], args[1], args[2], args[3]);
    let gt = e.compare(Cmp::Gt, av, bv);
    let eq = e.compare(Cmp::Eq, av, bv);
    let first = e.compare(Cmp::Lt, ai, bi);
    let tie = e.and(eq, first);
    let mut pick_a = e.or(gt, tie);
    if float {
        let a_nan = e.compare(Cmp::Ne, av, av);
        let b_nan = e.compare(Cmp::Ne, bv, bv);
        let later = e.compare(Cmp::Gt, ai, bi);
        let nan_pick = e.and(a_nan, later);
        let num_pick = e.or(a_nan, pick_a);
        pick_a = e.select(b_nan, nan_pick, num_pick);
    }
    let v = e.select(pick_a, av, bv);
    let i = e.select(pick_a, ai, bi);
    vec![v, i]
}

/// Windows of at most this many elements are pooled element by element (one strided slice per
/// window element, all fused into one loop), rather than by a `reduce_window` over
/// `(value, index)` pairs and a `scatter`: those need an int64 position for every input element
/// and every gradient, which XLA materializes, and on the CPU the pair reduction is slow.
const UNROLLED_WINDOW: i64 = 16;

fn unrolls(pool: &Pool) -> bool {
    pool.kernel
        .iter()
        .try_fold(1i64, |n, &k| n.checked_mul(k))
        .is_some_and(|n| n <= UNROLLED_WINDOW)
}

/// The element offsets of a window (one per spatial dim), in PyTorch's scan order: row-major.
fn window_offsets(kernel: &[i64]) -> Vec<Vec<i64>> {
    let mut all = vec![vec![]];
    for &k in kernel {
        all = all
            .into_iter()
            .flat_map(|prefix: Vec<i64>| {
                (0..k).map(move |i| {
                    let mut v = prefix.clone();
                    v.push(i);
                    v
                })
            })
            .collect();
    }
    all
}

/// For window element `offset` of every output position (`out`, shaped like the pooled
/// output): its flat in-plane position in `x` (int64, as PyTorch's indices) and whether it lies
/// inside `x` rather than in the padding.
fn window_element(
    e: &mut Emitter,
    out: &[i64],
    x: &[i64],
    pool: &Pool,
    offset: &[i64],
) -> (Value, Value) {
    let (n, r) = (pool.n(), out.len());
    let ty = TensorType::new(DType::I64, out);
    let mut flat: Option<Value> = None;
    let mut inside: Option<Value> = None;
    let mut step = 1;
    for j in (0..n).rev() {
        let d = r - n + j;
        let o = e.iota(ty.clone(), d);
        let stride = e.full_like(o, pool.stride[j] as f64);
        let first = e.mul(o, stride);
        let shift = e.full_like(o, (offset[j] * pool.dilation[j] - pool.padding[j]) as f64);
        let c = e.add(first, shift);
        let above = e.compare_const(Cmp::Ge, c, 0.0);
        let below = e.compare_const(Cmp::Lt, c, x[d] as f64);
        let ok = e.and(above, below);
        let term = if step == 1 {
            c
        } else {
            let k = e.full_like(c, step as f64);
            e.mul(c, k)
        };
        flat = Some(match flat {
            Some(acc) => e.add(acc, term),
            None => term,
        });
        inside = Some(match inside {
            Some(acc) => e.and(acc, ok),
            None => ok,
        });
        step *= x[d];
    }
    (
        flat.expect("at least one spatial dim"),
        inside.expect("at least one spatial dim"),
    )
}

/// Max pooling as PyTorch's CPU kernel scans: over a window's elements inside `x`, in order,
/// take an element greater than the best so far or NaN; the first element inside is taken
/// whatever its value. Every window holds one (the padding is at most half the window).
fn max_pool_unrolled(e: &mut Emitter, x: Value, pool: &Pool, out: &TensorType) -> (Value, Value) {
    let xt = e.ty(x).clone();
    let n = pool.n();
    let hi = pool.high_pads(&xt.shape, &out.shape);
    let low_value = e.scalar_constant(xt.dtype, lowest(xt.dtype));
    let xp = pad_spatial(e, x, low_value, &pool.padding, &hi, &vec![0; n]);
    let r = xt.rank();
    let float = xt.dtype.is_float();
    let mut best: Option<(Value, Value)> = None;
    let mut seen: Option<Value> = None;
    for offset in window_offsets(&pool.kernel) {
        let mut start = vec![0; r];
        let mut limit = out.shape.to_vec();
        let mut strides = vec![1; r];
        for (j, &k) in offset.iter().enumerate() {
            let d = r - n + j;
            start[d] = k * pool.dilation[j];
            limit[d] = start[d] + (out.shape[d] - 1) * pool.stride[j] + 1;
            strides[d] = pool.stride[j];
        }
        let v = e.slice(xp, &start, &limit, &strides);
        let (at, inside) = window_element(e, &out.shape, &xt.shape, pool, &offset);
        best = Some(match (best, seen) {
            (Some((best_v, best_i)), Some(seen_before)) => {
                let mut better = e.compare(Cmp::Gt, v, best_v);
                if float {
                    let nan = e.compare(Cmp::Ne, v, v);
                    better = e.or(better, nan);
                }
                let first = e.not(seen_before);
                let wanted = e.or(first, better);
                let take = e.and(inside, wanted);
                (e.select(take, v, best_v), e.select(take, at, best_i))
            }
            // The first element: taken if inside; otherwise a placeholder the first element
            // inside replaces.
            _ => (v, at),
        });
        seen = Some(match seen {
            Some(s) => e.or(s, inside),
            None => inside,
        });
    }
    best.expect("a window has elements")
}

/// The gradient of [`max_pool_unrolled`]: each window element's output positions whose index
/// points at it pass their gradient to it (a strided `pad` places them in `x`'s shape). The
/// elements are summed from the last to the first, which adds the gradients that meet at one
/// input element in the order of their output positions, as PyTorch's kernel does.
fn max_pool_backward_unrolled(
    e: &mut Emitter,
    grad: Value,
    x: &TensorType,
    indices: Value,
    pool: &Pool,
) -> Value {
    let n = pool.n();
    let r = x.rank();
    let cd = acc_dtype(x.dtype);
    let g = e.convert(grad, cd);
    let out = e.shape(g).to_vec();
    let none = zeros(e, &TensorType::new(cd, &out));
    let zero = e.scalar_constant(cd, ScalarValue::Float(0.0));
    let mut sum: Option<Value> = None;
    for offset in window_offsets(&pool.kernel).into_iter().rev() {
        let (at, _) = window_element(e, &out, &x.shape, pool, &offset);
        let hit = e.compare(Cmp::Eq, indices, at);
        let passed = e.select(hit, g, none);
        let mut low = vec![0; n];
        let mut high = vec![0; n];
        let mut interior = vec![0; n];
        for j in 0..n {
            let d = r - n + j;
            low[j] = offset[j] * pool.dilation[j] - pool.padding[j];
            interior[j] = pool.stride[j] - 1;
            high[j] = x.shape[d] - (low[j] + (out[d] - 1) * pool.stride[j] + 1);
        }
        let placed = pad_spatial(e, passed, zero, &low, &high, &interior);
        sum = Some(match sum {
            Some(acc) => e.add(acc, placed),
            None => placed,
        });
    }
    let s = sum.expect("a window has elements");
    e.convert(s, x.dtype)
}

fn max_pool(e: &mut Emitter, x: Value, pool: &Pool, out: &TensorType) -> (Value, Value) {
    let xt = e.ty(x).clone();
    let r = xt.rank();
    let idx = plane_positions(e, &xt.shape, pool.n());
    let hi = pool.high_pads(&xt.shape, &out.shape);
    let low_value = e.scalar_constant(xt.dtype, lowest(xt.dtype));
    // Padding carries the largest index, so it loses every tie to a real element.
    let pad_index = e.scalar_constant(DType::I64, ScalarValue::Int(i64::MAX));
    let zeros = vec![0; pool.n()];
    let xp = pad_spatial(e, x, low_value, &pool.padding, &hi, &zeros);
    let ip = pad_spatial(e, idx, pad_index, &pool.padding, &hi, &zeros);
    let float = xt.dtype.is_float();
    let outs = reduce_window(
        e,
        &[xp, ip],
        &[low_value, pad_index],
        &full_window(r, &pool.kernel),
        &full_window(r, &pool.stride),
        &full_window(r, &pool.dilation),
        |e, args| pick_max(e, args, float),
    );
    (outs[0], outs[1])
}

/// `grad` (shaped like the pooled output) added at the flat per-plane `indices` of a zero
/// tensor shaped like `x`; a plane is the last `n` dims.
fn max_pool_backward(
    e: &mut Emitter,
    grad: Value,
    x: &TensorType,
    indices: Value,
    n: usize,
) -> Value {
    let r = x.rank();
    let planes: i64 = x.shape[..r - n].iter().product();
    let cells: i64 = x.shape[r - n..].iter().product();
    let gt = e.ty(grad).clone();
    let per_plane: i64 = gt.shape[r - n..].iter().product();
    let cd = acc_dtype(x.dtype);
    if planes * per_plane == 0 {
        return zeros(e, x);
    }
    let g = e.convert(grad, cd);
    let g = e.reshape(g, &[planes, per_plane]);
    let idx = e.convert(indices, DType::I64);
    let idx = e.reshape(idx, &[planes, per_plane, 1]);
    let plane = e.iota(TensorType::new(DType::I64, &[planes, per_plane, 1]), 0);
    let at = e.concatenate(&[plane, idx], 2);
    let base = zeros(e, &TensorType::new(cd, &[planes, cells]));
    let region = e.region(&[TensorType::scalar(cd), TensorType::scalar(cd)], |e, a| {
        vec![e.add(a[0], a[1])]
    });
    let attrs = "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>, indices_are_sorted = false, unique_indices = false";
    let ty = TensorType::new(cd, &[planes, cells]);
    let s = e.op_with_regions(
        "stablehlo.scatter",
        &[base, at, g],
        &[region],
        attrs,
        vec![ty],
    )[0];
    let s = e.reshape(s, &x.shape);
    e.convert(s, x.dtype)
}

/// The per-position divisors of avg_pool2d/3d for output shape `out` (in `dtype`), or the
/// override as a scalar broadcast.
fn avg_divisor(e: &mut Emitter, pool: &Pool, x: &TensorType, out: &[i64], dtype: DType) -> Value {
    let (r, n) = (x.rank(), pool.n());
    if let Some(d) = pool.divisor {
        let c = e.scalar_constant(dtype, ScalarValue::Int(d));
        return e.broadcast_to(c, out);
    }
    let spatial = &out[r - n..];
    let mut m: Option<Value> = None;
    for d in 0..n {
        let v = pool.divisors(x.shape[r - n + d], spatial[d], d);
        let c = e.dense_i64(TensorType::new(DType::I64, &[spatial[d]]), &v);
        let b = e.broadcast_in_dim(c, spatial, &[d]);
        m = Some(match m {
            Some(acc) => e.mul(acc, b),
            None => b,
        });
    }
    let m = e.convert(m.expect("spatial dims"), dtype);
    let dims: Vec<usize> = (r - n..r).collect();
    e.broadcast_in_dim(m, out, &dims)
}

/// `v / divisor` with PyTorch's arithmetic: integers divide as int64 (truncating).
fn divide(e: &mut Emitter, v: Value, pool: &Pool, x: &TensorType, out: &[i64]) -> Value {
    let dtype = e.dtype(v);
    if dtype.is_float() {
        let d = avg_divisor(e, pool, x, out, dtype);
        e.div(v, d)
    } else {
        let d = avg_divisor(e, pool, x, out, DType::I64);
        let wide = e.convert(v, DType::I64);
        let q = e.div(wide, d);
        e.convert(q, dtype)
    }
}

fn avg_pool(e: &mut Emitter, x: Value, pool: &Pool, out: &TensorType) -> Value {
    let xt = e.ty(x).clone();
    let r = xt.rank();
    let cd = acc_dtype(xt.dtype);
    let xc = e.convert(x, cd);
    let hi = pool.high_pads(&xt.shape, &out.shape);
    let zero = e.scalar_constant(cd, ScalarValue::Int(0));
    let xp = pad_spatial(e, xc, zero, &pool.padding, &hi, &vec![0; pool.n()]);
    let ones = vec![1; r];
    let sum = reduce_window(
        e,
        &[xp],
        &[zero],
        &full_window(r, &pool.kernel),
        &full_window(r, &pool.stride),
        &ones,
        |e, a| vec![e.add(a[0], a[1])],
    )[0];
    let q = divide(e, sum, pool, &xt, &out.shape);
    e.convert(q, out.dtype)
}

/// Each input element receives `grad / divisor` of every window that holds it: the scaled
/// gradient dilated by the stride, padded so each input position sees the windows that cover
/// it, and summed over a kernel-sized window.
fn avg_pool_backward(e: &mut Emitter, grad: Value, x: &TensorType, pool: &Pool) -> Value {
    let (r, n) = (x.rank(), pool.n());
    if x.numel() == 0 {
        return zeros(e, x);
    }
    let gt = e.ty(grad).clone();
    let cd = acc_dtype(x.dtype);
    let g = e.convert(grad, cd);
    let g = divide(e, g, pool, x, &gt.shape);
    let mut lo = vec![0; n];
    let mut hi = vec![0; n];
    let mut interior = vec![0; n];
    for d in 0..n {
        let (size, out) = (x.shape[r - n + d], gt.shape[r - n + d]);
        lo[d] = pool.kernel[d] - 1 - pool.padding[d];
        hi[d] = size + pool.padding[d] - (out - 1) * pool.stride[d] - 1;
        interior[d] = pool.stride[d] - 1;
    }
    let zero = e.scalar_constant(cd, ScalarValue::Int(0));
    let gp = pad_spatial(e, g, zero, &lo, &hi, &interior);
    let ones = vec![1; r];
    let s = reduce_window(
        e,
        &[gp],
        &[zero],
        &full_window(r, &pool.kernel),
        &ones,
        &ones,
        |e, a| vec![e.add(a[0], a[1])],
    )[0];
    e.convert(s, x.dtype)
}

/// Adaptive pooling's window bounds along one dim: window `o` spans
/// `[floor(o * size / out), ceil((o + 1) * size / out))`.
fn adaptive_bounds(size: i64, out: i64) -> (Vec<i64>, Vec<i64>) {
    // In i128: `(o + 1) * size` may pass i64's bounds; each bound is at most `size`.
    let (n, size) = (i128::from(out), i128::from(size));
    let bound = |v: i128| v as i64;
    let starts = (0..n).map(|o| bound(o * size / n)).collect();
    let ends = (0..n)
        .map(|o| bound(((o + 1) * size + n - 1) / n))
        .collect();
    (starts, ends)
}

/// The most entries of a table of adaptive windows the lowering writes into a module: each
/// output size along a pooled dim takes two int64 tables of that length, and a serialized XLA
/// module holds at most 2 GiB.
const MAX_ADAPTIVE_TABLE: i64 = 1 << 27;

/// Adaptive pooling's lowering to an output of shape `out` (pooled over its last two dims)
/// writes tables of window bounds as long as its output sizes: refuse sizes whose tables pass
/// [`MAX_ADAPTIVE_TABLE`] before building them, as PyTorch fails to allocate such an output.
fn check_adaptive_tables(name: &str, out: &TensorType) -> Result<(), OpError> {
    let r = out.rank();
    for d in r.saturating_sub(2)..r {
        let o = out.shape[d];
        ensure!(
            o <= MAX_ADAPTIVE_TABLE,
            "{name}: output size {o} at dimension {d} needs tables of {o} window bounds, more than the {MAX_ADAPTIVE_TABLE} a module holds (the result {} alone takes {} bytes); expected an output size of at most {MAX_ADAPTIVE_TABLE}",
            fmt_shape(&out.shape),
            i128::from(out.numel()) * out.dtype.size_bytes() as i128
        );
    }
    Ok(())
}

/// The bool matrix `[out, size]` of adaptive pooling's windows along one dim.
fn adaptive_mask(e: &mut Emitter, size: i64, out: i64) -> Value {
    let (starts, ends) = adaptive_bounds(size, out);
    let ty = TensorType::new(DType::I64, &[out, size]);
    let s = e.dense_i64(TensorType::new(DType::I64, &[out]), &starts);
    let t = e.dense_i64(TensorType::new(DType::I64, &[out]), &ends);
    let s = e.broadcast_in_dim(s, &[out, size], &[0]);
    let t = e.broadcast_in_dim(t, &[out, size], &[0]);
    let pos = e.iota(ty, 1);
    let after = e.compare(Cmp::Ge, pos, s);
    let before = e.compare(Cmp::Lt, pos, t);
    e.and(after, before)
}

/// Each adaptive window's length along one dim.
fn adaptive_lengths(size: i64, out: i64) -> Vec<i64> {
    let (starts, ends) = adaptive_bounds(size, out);
    starts.iter().zip(&ends).map(|(s, t)| t - s).collect()
}

/// The window sizes `[oh, ow]` of adaptive pooling broadcast to `shape` (its last two dims).
fn adaptive_counts(e: &mut Emitter, hl: &[i64], wl: &[i64], shape: &[i64], dtype: DType) -> Value {
    let r = shape.len();
    let (oh, ow) = (hl.len() as i64, wl.len() as i64);
    let hc = e.dense_i64(TensorType::new(DType::I64, &[oh]), hl);
    let wc = e.dense_i64(TensorType::new(DType::I64, &[ow]), wl);
    let hb = e.broadcast_in_dim(hc, &[oh, ow], &[0]);
    let wb = e.broadcast_in_dim(wc, &[oh, ow], &[1]);
    let m = e.mul(hb, wb);
    let m = e.convert(m, dtype);
    e.broadcast_in_dim(m, shape, &[r - 2, r - 1])
}

/// `shape` with `extra` inserted before `dim`, and where the other dims of `shape` land in it.
fn widened(shape: &[i64], dim: usize, extra: i64) -> (Vec<i64>, Vec<usize>) {
    let mut wide = shape.to_vec();
    wide.insert(dim, extra);
    let keep = (0..shape.len())
        .map(|d| if d < dim { d } else { d + 1 })
        .collect();
    (wide, keep)
}

/// [`adaptive_mask`] broadcast to `wide`, whose dims `dim` and `dim + 1` are the windows' `out`
/// and the pooled dim's `size`.
fn wide_window_mask(e: &mut Emitter, wide: &[i64], dim: usize, size: i64, out: i64) -> Value {
    let mask = adaptive_mask(e, size, out);
    e.broadcast_in_dim(mask, wide, &[dim, dim + 1])
}

/// `v` (shaped `wide`, as for [`wide_window_mask`]) with zeros where a position lies outside
/// its window.
fn zero_outside_windows(
    e: &mut Emitter,
    v: Value,
    wide: &[i64],
    dim: usize,
    size: i64,
    out: i64,
) -> Value {
    let mask = wide_window_mask(e, wide, dim, size, out);
    let dtype = e.ty(v).dtype;
    let zero = e.scalar_constant(dtype, ScalarValue::Float(0.0));
    let zero = e.broadcast_to(zero, wide);
    e.select(mask, v, zero)
}

/// Sums `x` over adaptive windows along `dim`: `[.., S, ..]` to `[.., O, ..]`. Windows that
/// tile the dim are a reshape and a sum; others sum under each window's mask. Never a product
/// with a 0/1 window matrix: `0 * inf` would carry a non-finite input into every window of its
/// row, where the CPU's sum leaves the other windows finite.
fn adaptive_window_sum(e: &mut Emitter, x: Value, dim: usize, out: i64) -> Value {
    let ty = e.ty(x).clone();
    let size = ty.shape[dim];
    if size % out == 0 {
        let mut split = ty.shape.to_vec();
        split[dim] = out;
        split.insert(dim + 1, size / out);
        let tiled = e.reshape(x, &split);
        return e.reduce_sum(tiled, &[dim + 1]);
    }
    let (wide, keep) = widened(&ty.shape, dim, out);
    let xb = e.broadcast_in_dim(x, &wide, &keep);
    let inside = zero_outside_windows(e, xb, &wide, dim, size, out);
    e.reduce_sum(inside, &[dim + 1])
}

/// The adjoint of [`adaptive_window_sum`]: `[.., O, ..]` to `[.., S, ..]`, each position the sum
/// of the values of the windows holding it.
fn adaptive_window_spread(e: &mut Emitter, g: Value, dim: usize, size: i64) -> Value {
    let ty = e.ty(g).clone();
    let out = ty.shape[dim];
    if size % out == 0 {
        let (wide, keep) = widened(&ty.shape, dim + 1, size / out);
        let spread = e.broadcast_in_dim(g, &wide, &keep);
        let mut full = ty.shape.to_vec();
        full[dim] = size;
        return e.reshape(spread, &full);
    }
    // [.., O, ..] -> [.., O, S, ..], summed over O.
    let (wide, keep) = widened(&ty.shape, dim + 1, size);
    let gb = e.broadcast_in_dim(g, &wide, &keep);
    let inside = zero_outside_windows(e, gb, &wide, dim, size, out);
    e.reduce_sum(inside, &[dim])
}

/// Adaptive average pooling: each window's exact sum (rows, then columns), divided by the
/// window's size.
fn adaptive_pool(e: &mut Emitter, x: Value, out: &TensorType) -> Value {
    if out.numel() == 0 {
        return zeros(e, out);
    }
    let xt = e.ty(x).clone();
    let r = xt.rank();
    let cd = acc_dtype(xt.dtype);
    let (oh, ow) = (out.shape[r - 2], out.shape[r - 1]);
    let hl = adaptive_lengths(xt.shape[r - 2], oh);
    let wl = adaptive_lengths(xt.shape[r - 1], ow);
    let xc = e.convert(x, cd);
    let t = adaptive_window_sum(e, xc, r - 2, oh);
    let s = adaptive_window_sum(e, t, r - 1, ow);
    let counts = adaptive_counts(e, &hl, &wl, &out.shape, cd);
    let y = e.div(s, counts);
    e.convert(y, out.dtype)
}

fn adaptive_pool_backward(e: &mut Emitter, grad: Value, x: &TensorType) -> Value {
    let gt = e.ty(grad).clone();
    if x.numel() == 0 || gt.numel() == 0 {
        return zeros(e, x);
    }
    let r = x.rank();
    let cd = acc_dtype(x.dtype);
    let hl = adaptive_lengths(x.shape[r - 2], gt.shape[r - 2]);
    let wl = adaptive_lengths(x.shape[r - 1], gt.shape[r - 1]);
    let g = e.convert(grad, cd);
    let counts = adaptive_counts(e, &hl, &wl, &gt.shape, cd);
    let g = e.div(g, counts);
    let t = adaptive_window_spread(e, g, r - 2, x.shape[r - 2]);
    let s = adaptive_window_spread(e, t, r - 1, x.shape[r - 1]);
    e.convert(s, x.dtype)
}

/// One step of adaptive max pooling: `(values, indices)` of shape `[.., S, ..]` (the pooled dim
/// `dim` of size S) reduced to `[.., O, ..]` over adaptive windows, keeping PyTorch's choice of
/// maximum. Windows of different lengths rule out reduce_window: each output position reduces
/// the whole dim under its window's mask.
fn adaptive_max_step(
    e: &mut Emitter,
    values: Value,
    indices: Value,
    dim: usize,
    out: i64,
) -> (Value, Value) {
    let ty = e.ty(values).clone();
    let size = ty.shape[dim];
    // [.., S, ..] -> [.., O, S, ..]
    let (wide, keep) = widened(&ty.shape, dim, out);
    let vb = e.broadcast_in_dim(values, &wide, &keep);
    let ib = e.broadcast_in_dim(indices, &wide, &keep);
    let mask = wide_window_mask(e, &wide, dim, size, out);
    let low_value = e.scalar_constant(ty.dtype, lowest(ty.dtype));
    let pad_index = e.scalar_constant(DType::I64, ScalarValue::Int(i64::MAX));
    let low = e.broadcast_to(low_value, &wide);
    let far = e.broadcast_to(pad_index, &wide);
    let vm = e.select(mask, vb, low);
    let im = e.select(mask, ib, far);
    let float = ty.dtype.is_float();
    let outs = e.reduce(&[vm, im], &[low_value, pad_index], &[dim + 1], |e, args| {
        pick_max(e, args, float)
    });
    (outs[0], outs[1])
}

/// Adaptive max pooling over the last two dims, separably: a maximum over each window of rows,
/// then over each window of columns, carrying the flat `h * W + w` index of the winner (the
/// row-major first maximum, or the last NaN, as PyTorch picks).
fn adaptive_max_pool(e: &mut Emitter, x: Value, out: &TensorType) -> (Value, Value) {
    let xt = e.ty(x).clone();
    let r = xt.rank();
    let idx = plane_positions(e, &xt.shape, 2);
    let (v, i) = adaptive_max_step(e, x, idx, r - 2, out.shape[r - 2]);
    adaptive_max_step(e, v, i, r - 1, out.shape[r - 1])
}

fn adaptive_output_shape(x: &TensorType, size: &[i64], name: &str) -> Result<Shape, OpError> {
    let r = x.rank();
    // The max variant puts a colon before the shape.
    let colon = if name.starts_with("adaptive_max") {
        ":"
    } else {
        ""
    };
    ensure!(
        r == 3 || r == 4,
        "{name}(): Expected 3D or 4D tensor, but got{colon} {}",
        fmt_shape(&x.shape)
    );
    for d in r - 3..r {
        ensure!(
            x.shape[d] != 0,
            "{name}(): Expected input to have non-zero size for non-batch dimensions, but input has sizes {} with dimension {d} being empty",
            fmt_shape(&x.shape)
        );
    }
    ensure!(size.len() == 2, "{name}: output_size must be 2");
    ensure!(
        size.iter().all(|&s| s >= 0),
        "{name}: elements of output_size must be greater than or equal to 0 but received {{{}, {}}}",
        size[0],
        size[1]
    );
    if !x.dtype.is_float() {
        return Err(not_implemented_for(name, x.dtype));
    }
    let mut s = Shape::from_slice(&x.shape[..r - 2]);
    s.extend_from_slice(size);
    Ok(s)
}

// ---- rules: each op's meta beside its lowering --------------------------------------------

/// A max pool's outputs: the maxima in the input's dtype, and their int64 positions.
fn values_and_indices(dtype: DType, shape: Shape) -> Meta {
    let mut outputs = MetaOutputs::new();
    outputs.push(TensorType {
        dtype,
        shape: shape.clone(),
    });
    outputs.push(TensorType {
        dtype: DType::I64,
        shape,
    });
    Meta::of_outputs(outputs)
}

/// `max_pool2d_with_indices` and `max_pool3d_with_indices`: each window's maximum and its flat
/// position in the input's plane (int64).
pub(crate) struct MaxPool;

impl OpRule for MaxPool {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        Ok(values_and_indices(a.inputs[0].dtype, pooled_shape(a)?))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let pool = Pool::parse(a.op, &a.params)?;
        let out = a.out(0).clone();
        if out.numel() == 0 {
            return Ok(vec![zeros(e, &out), zeros(e, a.out(1))]);
        }
        let (v, i) = if unrolls(&pool) {
            max_pool_unrolled(e, a.inputs[0], &pool, &out)
        } else {
            max_pool(e, a.inputs[0], &pool, &out)
        };
        Ok(vec![v, i])
    }
}

/// `max_pool2d_with_indices_backward` and `max_pool3d_with_indices_backward`: each window's
/// gradient added at the position of its maximum.
pub(crate) struct MaxPoolBackward;

impl OpRule for MaxPoolBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        let (n, shape) = pool_grad_shape(a, 3..=3)?;
        let (g, x) = (&i[0], &i[1]);
        ensure!(
            i[2].dtype == DType::I64,
            "expected scalar type Long but found {}",
            i[2].dtype.scalar_type_name()
        );
        if !x.dtype.is_float() {
            let name = if n == 2 {
                "max_pool2d_backward"
            } else {
                "max_pool3d_backward"
            };
            return Err(not_implemented_for(name, x.dtype));
        }
        check_grad_shape(g, &shape, n)?;
        check_grad_shape(&i[2], &shape, n)?;
        Ok(Meta::single(x.clone(), ScalarDTypes::new()))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let x = e.ty(a.inputs[1]).clone();
        let pool = Pool::parse(a.op, &a.params)?;
        let empty = e.ty(a.inputs[0]).numel() == 0 || x.numel() == 0;
        if unrolls(&pool) && !empty {
            return Ok(vec![max_pool_backward_unrolled(
                e,
                a.inputs[0],
                &x,
                a.inputs[2],
                &pool,
            )]);
        }
        Ok(vec![max_pool_backward(
            e,
            a.inputs[0],
            &x,
            a.inputs[2],
            pool.n(),
        )])
    }
}

/// `avg_pool2d` and `avg_pool3d`: each window's mean (padding counted or not, or a divisor
/// given).
pub(crate) struct AvgPool;

impl OpRule for AvgPool {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        single(TensorType {
            dtype: a.inputs[0].dtype,
            shape: pooled_shape(a)?,
        })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let pool = Pool::parse(a.op, &a.params)?;
        let out = a.out(0).clone();
        if out.numel() == 0 {
            return Ok(vec![zeros(e, &out)]);
        }
        Ok(vec![avg_pool(e, a.inputs[0], &pool, &out)])
    }
}

/// `avg_pool2d_backward` and `avg_pool3d_backward`: each window's gradient spread evenly over
/// it.
pub(crate) struct AvgPoolBackward;

impl OpRule for AvgPoolBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let (n, shape) = pool_grad_shape(a, 2..=2)?;
        let (g, x) = (&a.inputs[0], &a.inputs[1]);
        if x.dtype == DType::Bool {
            let name = if n == 2 {
                "avg_pool2d_backward_out_frame"
            } else {
                "avg_pool3d_backward_out_frame"
            };
            return Err(not_implemented_for(name, x.dtype));
        }
        check_grad_shape(g, &shape, n)?;
        Ok(Meta::single(x.clone(), ScalarDTypes::new()))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let pool = Pool::parse(a.op, &a.params)?;
        let x = e.ty(a.inputs[1]).clone();
        Ok(vec![avg_pool_backward(e, a.inputs[0], &x, &pool)])
    }
}

/// `_adaptive_avg_pool2d`: the mean of each of an output size's adaptive windows.
pub(crate) struct AdaptiveAvgPool;

impl OpRule for AdaptiveAvgPool {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        single(TensorType {
            dtype: a.inputs[0].dtype,
            shape: adaptive_shape(a, "adaptive_avg_pool2d")?,
        })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        if out.numel() != 0 {
            check_adaptive_tables("adaptive_avg_pool2d", &out)?;
        }
        Ok(vec![adaptive_pool(e, a.inputs[0], &out)])
    }
}

/// `_adaptive_avg_pool2d_backward`: each adaptive window's gradient spread evenly over it.
pub(crate) struct AdaptiveAvgPoolBackward;

impl OpRule for AdaptiveAvgPoolBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(2..=2, 0..=0)?;
        let (g, x) = (&a.inputs[0], &a.inputs[1]);
        let r = x.rank();
        ensure!(
            g.rank() == r,
            "adaptive_avg_pool2d_backward_out_cpu_template: Expected dimensions {r} for `grad_output` but got dimensions {}",
            g.rank()
        );
        ensure!(
            g.dtype == x.dtype,
            "adaptive_avg_pool2d_backward_out_cpu_template: Expected dtype {} for `grad_output` but got dtype {}",
            x.dtype.typemeta_name(),
            g.dtype.typemeta_name()
        );
        let size = if r >= 2 {
            &g.shape[r - 2..]
        } else {
            &g.shape[..]
        };
        adaptive_output_shape(x, size, "adaptive_avg_pool2d").map_err(|err| {
            if err.kind == crate::ErrorKind::NotImplemented {
                not_implemented_for("adaptive_avg_pool2d_backward", x.dtype)
            } else {
                err
            }
        })?;
        ensure!(
            g.shape[..r - 2] == x.shape[..r - 2],
            "adaptive_avg_pool2d_backward: expected grad_output of shape {} to match the leading dims of self {}",
            fmt_shape(&g.shape),
            fmt_shape(&x.shape)
        );
        Ok(Meta::single(x.clone(), ScalarDTypes::new()))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let x = e.ty(a.inputs[1]).clone();
        let g = e.ty(a.inputs[0]).clone();
        if x.numel() != 0 && g.numel() != 0 {
            check_adaptive_tables("adaptive_avg_pool2d_backward", &g)?;
        }
        Ok(vec![adaptive_pool_backward(e, a.inputs[0], &x)])
    }
}

/// `adaptive_max_pool2d`: the maximum of each of an output size's adaptive windows and its
/// flat position in the input's plane (int64).
pub(crate) struct AdaptiveMaxPool;

impl OpRule for AdaptiveMaxPool {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let shape = adaptive_shape(a, "adaptive_max_pool2d")?;
        Ok(values_and_indices(a.inputs[0].dtype, shape))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        if out.numel() == 0 {
            return Ok(vec![zeros(e, &out), zeros(e, a.out(1))]);
        }
        check_adaptive_tables("adaptive_max_pool2d", &out)?;
        let (v, i) = adaptive_max_pool(e, a.inputs[0], &out);
        Ok(vec![v, i])
    }
}

/// `adaptive_max_pool2d_backward`: each adaptive window's gradient added at the position of
/// its maximum.
pub(crate) struct AdaptiveMaxPoolBackward;

impl OpRule for AdaptiveMaxPoolBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(3..=3, 0..=0)?;
        let (g, x, idx) = (&a.inputs[0], &a.inputs[1], &a.inputs[2]);
        ensure!(
            g.dtype == x.dtype,
            "expected grad_output to have the same dtype as self, but got {} and {}",
            g.dtype.scalar_type_name(),
            x.dtype.scalar_type_name()
        );
        ensure!(
            idx.dtype == DType::I64,
            "expected indices to have dtype Long, but got {}",
            idx.dtype.scalar_type_name()
        );
        ensure!(
            g.rank() == x.rank() && idx.shape == g.shape,
            "expected sizes of indices {} and grad_output {} to match, with as many dims as self {}",
            fmt_shape(&idx.shape),
            fmt_shape(&g.shape),
            fmt_shape(&x.shape)
        );
        let r = x.rank();
        let size = if r >= 2 {
            &g.shape[r - 2..]
        } else {
            &g.shape[..]
        };
        adaptive_output_shape(x, size, "adaptive_max_pool2d_backward")?;
        ensure!(
            g.shape[..r - 2] == x.shape[..r - 2],
            "adaptive_max_pool2d_backward: expected grad_output of shape {} to match the leading dims of self {}",
            fmt_shape(&g.shape),
            fmt_shape(&x.shape)
        );
        Ok(Meta::single(x.clone(), ScalarDTypes::new()))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let x = e.ty(a.inputs[1]).clone();
        Ok(vec![max_pool_backward(e, a.inputs[0], &x, a.inputs[2], 2)])
    }
}

/// The output shape of a max or avg pool of the op's one input (not bool).
fn pooled_shape(a: &MetaArgs) -> Result<Shape, OpError> {
    a.expect_counts(1..=1, 0..=0)?;
    let pool = Pool::parse(a.op, &a.params)?;
    let x = &a.inputs[0];
    let shape = pool.output_shape(a.op, x)?;
    if x.dtype == DType::Bool {
        let name = match (is_max_pool(a.op), pool.n()) {
            (true, 2) => "max_pool2d",
            (true, _) => "max_pool3d",
            (false, 2) => "avg_pool2d",
            (false, _) => "avg_pool3d",
        };
        return Err(not_implemented_for(name, x.dtype));
    }
    Ok(shape)
}

/// The spatial dims and pooled shape of a max or avg pool's gradient op (`inputs` tensors, the
/// gradient first, then the pool's input, of one dtype).
fn pool_grad_shape(
    a: &MetaArgs,
    inputs: std::ops::RangeInclusive<usize>,
) -> Result<(usize, Shape), OpError> {
    a.expect_counts(inputs, 0..=0)?;
    let pool = Pool::parse(a.op, &a.params)?;
    let n = pool.n();
    let (g, x) = (&a.inputs[0], &a.inputs[1]);
    let shape = pool.output_shape(a.op, x)?;
    ensure!(
        g.dtype == x.dtype,
        "expected dtype {} for `gradOutput` but got dtype {}",
        x.dtype.typemeta_name(),
        g.dtype.typemeta_name()
    );
    Ok((n, shape))
}

/// The output shape of an adaptive pool (`name`) of the op's one input to its output size.
fn adaptive_shape(a: &MetaArgs, name: &str) -> Result<Shape, OpError> {
    a.expect_counts(1..=1, 0..=0)?;
    let output_size = layout::AdaptiveOutputSize::decode(&a.params)?.output_size;
    adaptive_output_shape(&a.inputs[0], output_size, name)
}
