//! Snapshots of fused regions' StableHLO text: captured on `defer::Graph<u32>` (no PJRT),
//! planned by a flush and emitted by `fuse::build_module`. A changed snapshot is a changed
//! program: review it with `cargo insta review`.

mod common;

use common::{layout, sum_all, typed, Call};
use defer::{FlushRequest, Graph, TensorRef};
use ops::params::Reduction;
use ops::{DType, ScalarArg, ScalarValue};

struct G {
    graph: Graph<u32>,
}

impl G {
    fn new() -> G {
        G {
            graph: Graph::new(),
        }
    }

    fn input(&mut self, dtype: DType, shape: &[i64]) -> TensorRef {
        let nbytes = shape.iter().product::<i64>() as u64 * dtype.size_bytes() as u64;
        let t = TensorRef::contiguous(self.graph.new_storage(nbytes), dtype, shape);
        self.graph.write_device(&t, 7).expect("write");
        t
    }

    fn op(
        &mut self,
        call: impl Call,
        inputs: &[&TensorRef],
        scalars: &[ScalarArg],
    ) -> Vec<TensorRef> {
        let call = call.encoded();
        let inputs: Vec<TensorRef> = inputs.iter().map(|t| (*t).clone()).collect();
        let captured = self
            .graph
            .capture(call.op, &inputs, scalars, &call.params, &[])
            .expect("capture");
        captured
            .outputs
            .iter()
            .map(|(s, ty)| TensorRef::contiguous(*s, ty.dtype, &ty.shape))
            .collect()
    }

    fn op1(&mut self, call: impl Call, inputs: &[&TensorRef], scalars: &[ScalarArg]) -> TensorRef {
        self.op(call, inputs, scalars).swap_remove(0)
    }

    fn release(&mut self, t: TensorRef) {
        self.graph.release_storage(t.storage).expect("release");
    }

    /// The module text of the region materializing `t`, with a header naming its shape.
    fn module_for(&mut self, t: &TensorRef) -> String {
        let flush = self
            .graph
            .flush(FlushRequest::Storages(&[t.storage]), |_| 0)
            .expect("flush")
            .expect("a region");
        let text = fuse::build_module(&flush.source().build()).expect("build the module");
        assert!(text.contains("func.func public @main"), "{text}");
        format!(
            "// {}: {} args, {} outputs, {} dropped, scalar packs {:?}\n{text}",
            flush.label,
            flush.args.len(),
            flush.outputs.len(),
            flush.dropped_ops,
            flush.source().build().scalar_packs
        )
    }
}

fn f(x: f64) -> ScalarArg {
    ScalarArg::float(x)
}

#[test]
fn elementwise_chain_with_lifted_scalars() {
    let mut g = G::new();
    let x = g.input(DType::F32, &[2, 3]);
    let y = g.input(DType::F32, &[3]);
    let a = g.op1(typed::Mul, &[&x], &[f(0.5)]);
    let b = g.op1(typed::Add, &[&a, &y], &[f(2.0)]);
    let c = g.op1(typed::Tanh, &[&b], &[]);
    let d = g.op1(typed::Sub, &[&c], &[f(1.0), f(3.0)]);
    for t in [a, b, c] {
        g.release(t);
    }
    insta::assert_snapshot!("elementwise_chain_with_lifted_scalars", g.module_for(&d));
}

#[test]
fn scalars_of_several_dtypes_travel_in_one_pack_each() {
    let mut g = G::new();
    let i = g.input(DType::I64, &[4]);
    let a = g.op1(typed::Add, &[&i], &[ScalarArg::int(3), ScalarArg::int(2)]);
    let b = g.op1(typed::Mul, &[&a], &[f(0.25)]);
    let c = g.op1(
        typed::Mul,
        &[&b],
        &[ScalarArg::tensor(ScalarValue::Float(1.5), DType::F64)],
    );
    let d = g.op1(typed::Gt, &[&c], &[ScalarArg::int(1)]);
    for t in [a, b, c] {
        g.release(t);
    }
    insta::assert_snapshot!("scalars_of_several_dtypes", g.module_for(&d));
}

#[test]
fn softmax_and_reduction_with_a_live_intermediate() {
    let mut g = G::new();
    let x = g.input(DType::F32, &[4, 5]);
    let s = g.op1(
        typed::Softmax.encode(layout::SoftmaxDim {
            dim: 1,
            half_to_float: false,
        }),
        &[&x],
        &[],
    );
    let m = g.op1(
        typed::Mean.encode(layout::ReduceDtypeDims {
            keepdim: false,
            dtype: None,
            dims: &[0],
        }),
        &[&s],
        &[],
    );
    let dead = g.op1(typed::Exp, &[&x], &[]);
    g.release(dead);
    let total = g.op1(sum_all(), &[&m], &[]);
    // `s` is still held: the region outputs it as well as `total`; `dead` is dropped.
    insta::assert_snapshot!("softmax_reduction_live_intermediate", g.module_for(&total));
    drop(s);
}

#[test]
fn linear_layer_forward() {
    let mut g = G::new();
    let x = g.input(DType::F32, &[8, 4]);
    let w = g.input(DType::F32, &[4, 16]);
    let bias = g.input(DType::F32, &[16]);
    let w2 = g.input(DType::F32, &[16, 3]);
    let h = g.op1(typed::Addmm, &[&bias, &x, &w], &[]);
    let a = g.op1(typed::Relu, &[&h], &[]);
    let logits = g.op1(typed::Mm, &[&a, &w2], &[]);
    g.release(h);
    g.release(a);
    insta::assert_snapshot!("linear_layer_forward", g.module_for(&logits));
}

#[test]
fn nll_loss_of_log_softmax() {
    let mut g = G::new();
    let logits = g.input(DType::F32, &[6, 5]);
    let target = g.input(DType::I64, &[6]);
    let logp = g.op1(
        typed::LogSoftmax.encode(layout::SoftmaxDim {
            dim: 1,
            half_to_float: false,
        }),
        &[&logits],
        &[],
    );
    let outs = g.op(
        typed::NllLoss.encode(layout::NllLossReduction {
            reduction: Reduction::Mean,
            ignore_index: -100,
        }),
        &[&logp, &target],
        &[],
    );
    g.release(logp);
    g.release(outs[1].clone());
    insta::assert_snapshot!("nll_loss_of_log_softmax", g.module_for(&outs[0]));
}

#[test]
fn reshaped_reads_unwritten_storages_and_cat() {
    let mut g = G::new();
    let flat = g.input(DType::F32, &[6]);
    // The same storage read as [2, 3]: the region reshapes it.
    let as_matrix = TensorRef::contiguous(flat.storage, DType::F32, &[2, 3]);
    let zeros = TensorRef::contiguous(g.graph.new_storage(12), DType::F32, &[1, 3]);
    let a = g.op1(typed::Neg, &[&as_matrix], &[]);
    // An unwritten storage reads as zeros.
    let c = g.op1(
        typed::Cat.encode(layout::Dim { dim: 0 }),
        &[&a, &zeros, &as_matrix],
        &[],
    );
    let d = g.op1(
        typed::Convert.encode(layout::ConvertTo { dtype: DType::BF16 }),
        &[&c],
        &[],
    );
    g.release(a);
    g.release(c);
    insta::assert_snapshot!("reshaped_reads_zeros_and_cat", g.module_for(&d));
}

#[test]
fn a_random_draw_hashes_a_counter_with_its_lifted_key() {
    let mut g = G::new();
    let x = g.input(DType::F32, &[2, 3]);
    let drawn = g.op1(
        typed::Uniform.encode(layout::Creation {
            dtype: DType::F32,
            sizes: &[2, 3],
        }),
        &[],
        &[f(-1.0), f(1.0), ScalarArg::int(12345)],
    );
    let d = g.op1(typed::Mul, &[&x, &drawn], &[]);
    insta::assert_snapshot!("random_draw_counter_hash", g.module_for(&d));
}

#[test]
fn a_sequence_starts_padded_and_grows_in_its_bucket() {
    let mut g = G::new();
    let empty = g.input(DType::F32, &[0]);
    let x = g.input(DType::F32, &[1, 2, 3, 4]);
    // `cat([torch.tensor([]), x], -2)`: the first entry, padded to a bucket of 16 at once.
    let first = g.op1(
        typed::Cat.encode(layout::Dim { dim: -2 }),
        &[&empty, &x],
        &[],
    );
    let new = g.input(DType::F32, &[1, 2, 1, 4]);
    // Its append reads the bucket and writes the next position, the true length a runtime scalar.
    let grown = g.op1(
        typed::Cat.encode(layout::Dim { dim: 2 }),
        &[&first, &new],
        &[],
    );
    g.release(first);
    insta::assert_snapshot!("sequence_first_entry_and_append", g.module_for(&grown));
}
