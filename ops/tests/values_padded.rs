//! Padded programs against exact ones on the XLA CPU PJRT plugin: for random true lengths
//! inside a bucket, each op run on padded buffers (garbage in the padding) by
//! `ops::padding` must give, in its true elements, what the op gives on the exact tensors.
//! `PADDED_ROUNDS` scales the number of random lengths tried (default 4).

mod common;

use common::*;
use ops::padding::{self, PaddedDims};
use ops::{f64_param, meta, DType, Emitter, OpId, ScalarArg, TensorType, Value};

/// One op call with a symbolic extent: every `(input, dim)` in `padded` has the true length.
#[derive(Clone)]
struct Template {
    op: OpId,
    /// `None` marks the padded extent's size.
    shapes: Vec<(DType, Vec<Option<i64>>)>,
    params: Vec<i64>,
    scalars: Vec<ScalarArg>,
    /// Bit-for-bit equal to the exact program (no reassociated sums).
    bitwise: bool,
    /// Value range of the inputs (indices need a small one).
    range: (f64, f64),
}

fn t(op: OpId, shapes: &[(DType, &[Option<i64>])], params: &[i64], bitwise: bool) -> Template {
    Template {
        op,
        shapes: shapes.iter().map(|(d, s)| (*d, s.to_vec())).collect(),
        params: params.to_vec(),
        scalars: Vec::new(),
        bitwise,
        range: (-3.0, 3.0),
    }
}

const L: Option<i64> = None;
const F: DType = DType::F32;

fn n(x: i64) -> Option<i64> {
    Some(x)
}

fn templates() -> Vec<Template> {
    let eps = f64_param(1e-5);
    let mut index = t(
        OpId::Embedding,
        &[(F, &[n(10), n(4)]), (DType::I64, &[L])],
        &[],
        true,
    );
    index.range = (0.0, 10.0);
    let mut select = t(
        OpId::IndexSelect,
        &[(F, &[L, n(4)]), (DType::I64, &[n(3)])],
        &[1],
        true,
    );
    select.range = (0.0, 4.0);
    // A mask read at `[batch, position]` indices (an attention mask built by indexing).
    let mut gather_rows = t(
        OpId::Gather,
        &[(F, &[n(3), L]), (DType::I64, &[n(3), n(2)])],
        &[1],
        true,
    );
    gather_rows.range = (0.0, 1.0);
    let mut gather_positions = t(
        OpId::Gather,
        &[(F, &[n(3), n(6)]), (DType::I64, &[n(3), L])],
        &[1],
        true,
    );
    gather_positions.range = (0.0, 6.0);
    let mut index_padded = t(
        OpId::Index,
        &[(F, &[n(4), n(5)]), (DType::I64, &[n(2), L])],
        &[1],
        true,
    );
    index_padded.range = (0.0, 5.0);
    // Which ids are special tokens (`isin(input_ids, eos)`), as generation's setup asks.
    let mut isin = t(
        OpId::Isin,
        &[(DType::I64, &[n(2), L]), (DType::I64, &[n(3)])],
        &[0],
        true,
    );
    isin.range = (0.0, 6.0);
    let mut scaled = t(OpId::Mul, &[(F, &[n(1), n(2), n(8), L])], &[], true);
    scaled.scalars = vec![ScalarArg::float(0.125)];
    vec![
        t(OpId::Add, &[(F, &[n(2), L]), (F, &[n(1), L])], &[], true),
        t(OpId::Add, &[(F, &[n(3), L]), (F, &[n(3), n(1)])], &[], true),
        scaled,
        t(OpId::Exp, &[(F, &[L, n(3)])], &[], true),
        t(OpId::Sum, &[(F, &[n(3), L])], &[0, -1, 1], false),
        t(OpId::Sum, &[(F, &[L, n(3)])], &[1, -1, 0], false),
        t(OpId::Sum, &[(F, &[n(2), L])], &[0, -1], false),
        t(OpId::Sum, &[(F, &[n(2), L])], &[0, -1, 0], true),
        t(OpId::Mean, &[(F, &[L, n(5)])], &[0, -1, 1], true),
        t(OpId::Amax, &[(F, &[n(3), L])], &[0, 1], true),
        t(OpId::Amin, &[(DType::I32, &[n(3), L])], &[1, -1], true),
        t(OpId::Argmax, &[(F, &[n(3), L])], &[0, 1], true),
        t(OpId::Softmax, &[(F, &[n(2), L])], &[-1, 0], false),
        t(OpId::Softmax, &[(F, &[L, n(4)])], &[1, 0], true),
        t(OpId::LogSoftmax, &[(F, &[n(2), L])], &[1, 0], false),
        t(
            OpId::SafeSoftmax,
            &[(F, &[n(1), n(2), n(1), L])],
            &[3, -1],
            false,
        ),
        t(
            OpId::NativeLayerNorm,
            &[(F, &[L, n(8)]), (F, &[n(8)]), (F, &[n(8)])],
            &[1, 1, eps, 8],
            true,
        ),
        t(OpId::Cumsum, &[(F, &[n(2), L])], &[1, -1], false),
        t(OpId::Cumsum, &[(F, &[L, n(3)])], &[1, -1], true),
        // Attention over a growing key and value (a decoding step), with a mask growing
        // alike, grouped heads, and a prefill whose queries grow too under a causal mask.
        t(
            OpId::Attention,
            &[
                (F, &[n(1), n(2), n(1), n(8)]),
                (F, &[n(1), n(2), L, n(8)]),
                (F, &[n(1), n(2), L, n(4)]),
            ],
            &[0, 0, 0, f64_param(0.0)],
            false,
        ),
        t(
            OpId::Attention,
            &[
                (F, &[n(1), n(4), n(2), n(8)]),
                (F, &[n(1), n(2), L, n(8)]),
                (F, &[n(1), n(2), L, n(8)]),
                (F, &[n(1), n(1), n(2), L]),
            ],
            &[0, 1, 1, f64_param(0.3)],
            false,
        ),
        t(
            OpId::Attention,
            &[
                (F, &[n(2), n(2), L, n(8)]),
                (F, &[n(2), n(2), L, n(8)]),
                (F, &[n(2), n(2), L, n(8)]),
            ],
            &[1, 0, 0, f64_param(0.0)],
            false,
        ),
        // Its gradients on a padded batch: causal, and with a float mask and its gradient.
        t(
            OpId::AttentionBackward,
            &[
                (F, &[n(1), n(2), L, n(4)]),
                (F, &[n(1), n(2), L, n(8)]),
                (F, &[n(1), n(2), L, n(8)]),
                (F, &[n(1), n(2), L, n(4)]),
                (F, &[n(1), n(2), L, n(4)]),
            ],
            &[1, 0, 0, f64_param(0.0), 0],
            false,
        ),
        t(
            OpId::AttentionBackward,
            &[
                (F, &[n(2), n(2), L, n(4)]),
                (F, &[n(2), n(2), L, n(8)]),
                (F, &[n(2), n(2), L, n(8)]),
                (F, &[n(2), n(2), L, n(4)]),
                (F, &[n(2), n(2), L, n(4)]),
                (F, &[n(2), n(1), L, L]),
            ],
            &[0, 1, 1, f64_param(0.5), 1],
            false,
        ),
        // q @ k^T with k growing: the padding is a free dimension of the product.
        t(
            OpId::Bmm,
            &[(F, &[n(2), n(1), n(8)]), (F, &[n(2), n(8), L])],
            &[],
            false,
        ),
        // p @ v: the product contracts over the padding.
        t(
            OpId::Bmm,
            &[(F, &[n(2), n(1), L]), (F, &[n(2), L, n(8)])],
            &[],
            false,
        ),
        t(OpId::Mm, &[(F, &[L, n(4)]), (F, &[n(4), n(3)])], &[], false),
        // A linear layer on a padded batch: the rows are free, the bias broadcasts.
        t(
            OpId::Addmm,
            &[(F, &[n(3)]), (F, &[L, n(4)]), (F, &[n(4), n(3)])],
            &[],
            false,
        ),
        // Its weight's gradient: the product contracts over the padding.
        t(
            OpId::Addmm,
            &[(F, &[n(2), n(3)]), (F, &[n(2), L]), (F, &[L, n(3)])],
            &[],
            false,
        ),
        t(OpId::Cat, &[(F, &[n(2), L]), (F, &[n(3), L])], &[0], true),
        // A causal mask: the extent is both of the triangle's dimensions.
        t(OpId::Tril, &[(F, &[L, L])], &[0], true),
        t(OpId::Triu, &[(F, &[n(2), L, L])], &[1], true),
        t(OpId::Tril, &[(F, &[n(3), L])], &[-1], true),
        t(OpId::Triu, &[(F, &[L, n(3)])], &[0], true),
        isin,
        index,
        select,
        gather_rows,
        gather_positions,
        index_padded,
    ]
}

/// The shape with the extent at `len`.
fn shape_at(shape: &[Option<i64>], len: i64) -> Vec<i64> {
    shape.iter().map(|s| s.unwrap_or(len)).collect()
}

fn padded_dims(shape: &[Option<i64>]) -> PaddedDims {
    (0..shape.len()).filter(|&d| shape[d].is_none()).collect()
}

fn unravel(mut i: usize, shape: &[i64]) -> Vec<i64> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i as i64 % shape[d];
        i /= shape[d] as usize;
    }
    idx
}

fn ravel(idx: &[i64], shape: &[i64]) -> usize {
    idx.iter()
        .zip(shape)
        .fold(0usize, |acc, (&i, &s)| acc * s as usize + i as usize)
}

/// `exact` placed into a buffer of `padded_shape`, the rest garbage of `exact`'s dtype.
fn pad_host(exact: &Host, padded_shape: &[i64], seed: u64) -> Host {
    let n: i64 = padded_shape.iter().product();
    let dtype = exact.ty.dtype;
    let garbage = [f64::NAN, f64::INFINITY, 1e30, -7.0, 123456.0];
    let data: Vec<f64> = (0..n as usize)
        .map(|i| {
            let idx = unravel(i, padded_shape);
            if idx.iter().zip(&exact.ty.shape).all(|(i, s)| i < s) {
                exact.data[ravel(&idx, &exact.ty.shape)]
            } else if dtype.is_float() {
                garbage[(i + seed as usize) % garbage.len()]
            } else {
                [99999.0, -5.0, 7.0][(i + seed as usize) % 3]
            }
        })
        .collect();
    Host::new(dtype, padded_shape, &data)
}

/// The true elements (those below `true_shape` in every dimension) of a padded result.
fn unpad_host(padded: &Host, true_shape: &[i64]) -> Vec<f64> {
    let n: i64 = true_shape.iter().product();
    (0..n as usize)
        .map(|i| padded.data[ravel(&unravel(i, true_shape), &padded.ty.shape)])
        .collect()
}

fn upload(client: &pjrt::Client, h: &Host) -> pjrt::Buffer {
    client
        .buffer_from_host(
            &encode(h.ty.dtype, &h.data),
            element_type(h.ty.dtype),
            &h.ty.shape,
        )
        .expect("upload")
}

/// One padded case as run: its template, its length and bucket, its exact inputs.
struct Drawn {
    template: Template,
    len: i64,
    bucket: i64,
    inputs: Vec<Host>,
}

fn draw(template: &Template, round: u64, k: u64) -> Drawn {
    let seed = round * 1000 + k;
    // Lengths across the whole bucket, its ends included.
    let len = match round {
        0 => 1,
        1 => 16,
        _ => 1 + (seed.wrapping_mul(2654435761) >> 7) as i64 % 16,
    };
    let bucket = padding::bucket(len);
    let inputs = template
        .shapes
        .iter()
        .enumerate()
        .map(|(i, (dtype, shape))| {
            Host::random(
                *dtype,
                &shape_at(shape, len),
                template.range.0,
                template.range.1,
                seed * 7 + i as u64,
            )
        })
        .collect();
    Drawn {
        template: template.clone(),
        len,
        bucket,
        inputs,
    }
}

/// Runs every drawn case padded in one module; returns each case's padded outputs.
fn run_padded(cases: &[Drawn]) -> Vec<Vec<Host>> {
    let mut e = Emitter::new();
    let mut host_args = Vec::new();
    let mut results: Vec<Value> = Vec::new();
    let mut out_types = Vec::new();
    for (k, c) in cases.iter().enumerate() {
        let tpl = &c.template;
        let true_types: Vec<TensorType> = c.inputs.iter().map(|h| h.ty.clone()).collect();
        let padded: Vec<PaddedDims> = tpl.shapes.iter().map(|(_, s)| padded_dims(s)).collect();
        let plan = padding::plan(
            tpl.op,
            &true_types,
            &padded,
            c.bucket,
            &tpl.scalars,
            &tpl.params,
        )
        .expect("meta")
        .unwrap_or_else(|| panic!("{:?} {:?} has no padded plan", tpl.op, tpl.params));
        let inputs: Vec<Value> = c
            .inputs
            .iter()
            .zip(&tpl.shapes)
            .map(|(h, (_, shape))| {
                let p = pad_host(h, &shape_at(shape, c.bucket), k as u64);
                let v = e.argument(p.ty.clone());
                host_args.push(p);
                v
            })
            .collect();
        let len = e.argument(TensorType::scalar(DType::I64));
        host_args.push(Host::new(DType::I64, &[], &[c.len as f64]));
        let scalars: Vec<Value> = tpl
            .scalars
            .iter()
            .zip(&plan.meta.scalar_dtypes)
            .map(|(s, &d)| {
                host_args.push(Host::new(d, &[], &[s.value.as_f64()]));
                e.argument(TensorType::scalar(d))
            })
            .collect();
        let outs =
            padding::lower_padded(tpl.op, &mut e, &inputs, len, &scalars, &tpl.params, &plan)
                .expect("lower");
        results.extend(outs);
        out_types.push(plan.meta.outputs.clone());
    }
    execute(e, &results, &host_args, out_types)
}

fn execute(
    e: Emitter,
    results: &[Value],
    host_args: &[Host],
    out_types: Vec<ops::MetaOutputs>,
) -> Vec<Vec<Host>> {
    let text = e.finish(results);
    let client = client();
    let exe = client
        .compile(&text)
        .unwrap_or_else(|err| panic!("compile failed: {err}\n{text}"));
    let buffers: Vec<pjrt::Buffer> = host_args.iter().map(|h| upload(client, h)).collect();
    let refs: Vec<&pjrt::Buffer> = buffers.iter().collect();
    let mut outs = exe.execute(&refs).expect("execute").into_iter();
    out_types
        .into_iter()
        .map(|types| {
            types
                .into_iter()
                .map(|ty| {
                    let bytes = outs.next().expect("an output").to_host().expect("download");
                    Host {
                        data: decode(ty.dtype, &bytes),
                        ty,
                    }
                })
                .collect()
        })
        .collect()
}

fn same_bits(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

fn rounds() -> u64 {
    std::env::var("PADDED_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

#[test]
fn padded_ops_equal_exact_ops_for_every_length_in_the_bucket() {
    let templates = templates();
    let mut failures = Vec::new();
    for round in 0..rounds() {
        let drawn: Vec<Drawn> = templates
            .iter()
            .enumerate()
            .map(|(k, t)| draw(t, round, k as u64))
            .collect();
        let exact_cases: Vec<Case> = drawn
            .iter()
            .map(|d| {
                let mut c = Case::new(
                    d.template.op,
                    d.inputs.clone(),
                    d.template.scalars.clone(),
                    d.template.params.clone(),
                );
                c.scalars = d.template.scalars.clone();
                c
            })
            .collect();
        let exact = run_batch(&exact_cases);
        let padded = run_padded(&drawn);
        for ((d, want), got) in drawn.iter().zip(&exact).zip(&padded) {
            for (o, (w, g)) in want.iter().zip(got).enumerate() {
                let got_true = unpad_host(g, &w.ty.shape);
                let label = format!(
                    "{:?} {:?} len {} bucket {} output {o}",
                    d.template.op, d.template.params, d.len, d.bucket
                );
                if d.template.bitwise {
                    if let Some(i) = (0..w.data.len()).find(|&i| !same_bits(got_true[i], w.data[i]))
                    {
                        failures.push(format!(
                            "{label}: [{i}] got {} want {} (bit for bit)",
                            got_true[i], w.data[i]
                        ));
                    }
                } else {
                    let got = Host {
                        ty: w.ty.clone(),
                        data: got_true,
                    };
                    if let Err(msg) = compare(&label, &got, &w.ty, &w.data, 4.0) {
                        failures.push(msg);
                    }
                }
            }
        }
    }
    report(failures);
}

#[test]
fn appends_along_the_extent_equal_cat() {
    let mut failures = Vec::new();
    let client = client();
    for (k, &a_len) in [1i64, 7, 15, 16, 31].iter().enumerate() {
        let a = Host::random(F, &[1, 2, a_len, 4], -2.0, 2.0, 40 + k as u64);
        let b = Host::random(F, &[1, 2, 1, 4], -2.0, 2.0, 80 + k as u64);
        let want = &run_batch(&[Case::new(
            OpId::Cat,
            vec![a.clone(), b.clone()],
            vec![],
            vec![2],
        )])[0][0];
        for a_padded in [false, true] {
            let a_bucket = if a_padded {
                padding::bucket(a_len)
            } else {
                a_len
            };
            let out_bucket = padding::bucket(a_len + 1);
            let mut e = Emitter::new();
            let pa = pad_host(&a, &[1, 2, a_bucket, 4], k as u64);
            let va = e.argument(pa.ty.clone());
            let vb = e.argument(b.ty.clone());
            let vl = e.argument(TensorType::scalar(DType::I64));
            let out = padding::lower_append(&mut e, va, vb, 2, vl, out_bucket);
            assert_eq!(e.shape(out), &[1, 2, out_bucket, 4]);
            let args = [pa, b.clone(), Host::new(DType::I64, &[], &[a_len as f64])];
            let out_ty = TensorType::new(F, &[1, 2, out_bucket, 4]);
            let got = &execute(e, &[out], &args, vec![[out_ty].into_iter().collect()])[0][0];
            let got_true = unpad_host(got, &want.ty.shape);
            if got_true != want.data {
                failures.push(format!(
                    "append after {a_len} (padded: {a_padded}): {:?} != {:?}",
                    &got_true[..8],
                    &want.data[..8]
                ));
            }
        }
    }
    let _ = client;
    report(failures);
}

#[test]
fn plans_exist_for_every_template_and_meta_agrees() {
    for tpl in templates() {
        let types: Vec<TensorType> = tpl
            .shapes
            .iter()
            .map(|(d, s)| TensorType::new(*d, &shape_at(s, 5)))
            .collect();
        let padded: Vec<PaddedDims> = tpl.shapes.iter().map(|(_, s)| padded_dims(s)).collect();
        let plan = padding::plan(tpl.op, &types, &padded, 16, &tpl.scalars, &tpl.params)
            .unwrap()
            .unwrap_or_else(|| panic!("{:?} has no plan", tpl.op));
        let exact = meta(tpl.op, &types, &tpl.scalars, &tpl.params).unwrap();
        for (p, (x, dims)) in plan
            .meta
            .outputs
            .iter()
            .zip(exact.outputs.iter().zip(&plan.outputs))
        {
            for (d, (&ps, &xs)) in p.shape.iter().zip(&x.shape).enumerate() {
                assert_eq!(ps != xs, dims.contains(&d), "{:?} output dim {d}", tpl.op);
            }
        }
    }
}

#[test]
fn an_extent_merged_with_outer_dimensions_is_planned_only_where_rows_are_free() {
    // A [3, 5, 4] batch (length 5, bucket 16) read as [15, 4] by a linear layer.
    let rows = TensorType::new(F, &[15, 4]);
    let weight = TensorType::new(F, &[4, 6]);
    let merged: PaddedDims = [0].into_iter().collect();
    let plan = padding::plan_at(
        OpId::Mm,
        &[rows.clone(), weight.clone()],
        &[merged.clone(), PaddedDims::new()],
        16,
        5,
        &[],
        &[],
    )
    .unwrap()
    .expect("the rows of a product are free");
    assert_eq!(plan.meta.outputs[0].shape.as_slice(), &[48, 6]);
    assert_eq!(plan.true_outputs[0].shape.as_slice(), &[15, 6]);
    assert_eq!(plan.outputs[0].as_slice(), &[0]);
    // A sum over the merged rows masks each run; a cumulative sum along them is refused.
    let sum = padding::plan_at(
        OpId::Sum,
        std::slice::from_ref(&rows),
        std::slice::from_ref(&merged),
        16,
        5,
        &[],
        &[0, -1, 0],
    )
    .unwrap()
    .expect("a sum over runs");
    assert_eq!(sum.fills[0], Some(padding::PadFill::Zero));
    let cumsum = padding::plan_at(
        OpId::Cumsum,
        std::slice::from_ref(&rows),
        std::slice::from_ref(&merged),
        16,
        5,
        &[],
        &[0, -1],
    )
    .unwrap();
    assert!(cumsum.is_none());
    // A size that is not a whole number of runs is refused.
    let odd = TensorType::new(F, &[14, 4]);
    assert!(padding::plan_at(
        OpId::Mm,
        &[odd, weight],
        &[merged, PaddedDims::new()],
        16,
        5,
        &[],
        &[]
    )
    .unwrap()
    .is_none());
}

#[test]
fn sums_and_products_over_merged_runs_equal_the_exact_ones() {
    // [3 runs, length len of bucket 16] rows of 4 features, garbage (NaN, 1e30) in every run's
    // padding: a bias gradient (sum over the rows) and a weight gradient (rows contracted).
    for len in [1, 5, 16] {
        let runs = 3usize;
        let bucket = 16usize;
        let exact = Host::random(F, &[(runs * len) as i64, 4], -3.0, 3.0, len as u64);
        let other = Host::random(F, &[(runs * len) as i64, 2], -3.0, 3.0, 7 + len as u64);
        let pad_rows = |h: &Host, width: usize| {
            let mut data = Vec::new();
            for r in 0..runs * bucket {
                let (run, pos) = (r / bucket, r % bucket);
                for c in 0..width {
                    data.push(if pos < len {
                        h.data[(run * len + pos) * width + c]
                    } else if (r + c) % 2 == 0 {
                        f64::NAN
                    } else {
                        1e30
                    });
                }
            }
            Host::new(F, &[(runs * bucket) as i64, width as i64], &data)
        };
        let merged: PaddedDims = [0].into_iter().collect();
        let mut e = Emitter::new();
        let a = e.argument(TensorType::new(F, &[(runs * bucket) as i64, 4]));
        let b = e.argument(TensorType::new(F, &[(runs * bucket) as i64, 2]));
        let n = e.argument(TensorType::scalar(DType::I64));
        let sum_plan = padding::plan_at(
            OpId::Sum,
            std::slice::from_ref(&exact.ty),
            std::slice::from_ref(&merged),
            bucket as i64,
            len as i64,
            &[],
            &[0, -1, 0],
        )
        .unwrap()
        .unwrap();
        let summed =
            padding::lower_padded(OpId::Sum, &mut e, &[a], n, &[], &[0, -1, 0], &sum_plan).unwrap();
        // aᵀ b: [4, rows] x [rows, 2], the rows contracted.
        let at = e.transpose(a, &[1, 0]);
        let at_ty = TensorType::new(F, &[4, (runs * len) as i64]);
        let mm_plan = padding::plan_at(
            OpId::Mm,
            &[at_ty, other.ty.clone()],
            &[[1].into_iter().collect(), merged.clone()],
            bucket as i64,
            len as i64,
            &[],
            &[],
        )
        .unwrap()
        .unwrap();
        let product =
            padding::lower_padded(OpId::Mm, &mut e, &[at, b], n, &[], &[], &mm_plan).unwrap();
        let outs = execute(
            e,
            &[summed[0], product[0]],
            &[
                pad_rows(&exact, 4),
                pad_rows(&other, 2),
                Host::new(DType::I64, &[], &[len as f64]),
            ],
            vec![sum_plan.meta.outputs.clone(), mm_plan.meta.outputs.clone()],
        );
        for c in 0..4 {
            let want: f64 = (0..runs * len).map(|r| exact.data[r * 4 + c]).sum();
            assert!(
                close(outs[0][0].data[c], want, 1e-5, 1e-5),
                "len {len} sum {c}"
            );
            for k in 0..2 {
                let want: f64 = (0..runs * len)
                    .map(|r| exact.data[r * 4 + c] * other.data[r * 2 + k])
                    .sum();
                assert!(
                    close(outs[1][0].data[c * 2 + k], want, 1e-4, 1e-4),
                    "len {len} mm"
                );
            }
        }
    }
}
