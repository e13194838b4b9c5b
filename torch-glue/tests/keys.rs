//! Cache keys of fused regions, on the capture graph alone (`defer::Graph<u32>`, plain values
//! instead of device buffers, no PJRT): the shapeless part covers structure and scalar kinds,
//! the dims part sizes; scalar values are lifted and never reach the key or the module text.

mod common;

use common::{layout, typed, Call, NoParams};
use defer::{Flush, FlushRequest, Graph, TensorRef};
use ops::{DType, ScalarArg, ScalarValue};

/// A capture graph with methods shaped like the engine's calls.
struct G {
    graph: Graph<u32>,
    next_value: u32,
}

impl G {
    fn new() -> G {
        G {
            graph: Graph::new(),
            next_value: 1000,
        }
    }

    /// A materialized input (an uploaded tensor).
    fn input(&mut self, dtype: DType, shape: &[i64]) -> TensorRef {
        let nbytes = shape.iter().product::<i64>() as u64 * dtype.size_bytes() as u64;
        let t = TensorRef::contiguous(self.graph.new_storage(nbytes), dtype, shape);
        self.next_value += 1;
        self.graph.write_device(&t, self.next_value).expect("write");
        t
    }

    fn op(&mut self, call: impl Call, inputs: &[&TensorRef], scalars: &[ScalarArg]) -> TensorRef {
        let call = call.encoded();
        let inputs: Vec<TensorRef> = inputs.iter().map(|t| (*t).clone()).collect();
        let captured = self
            .graph
            .capture(call.op, &inputs, scalars, &call.params, &[])
            .expect("capture");
        let (storage, ty) = captured.outputs[0].clone();
        TensorRef::contiguous(storage, ty.dtype, &ty.shape)
    }

    fn release(&mut self, t: TensorRef) {
        self.graph.release_storage(t.storage).expect("release");
    }

    fn flush_all(&mut self) -> Flush<u32> {
        self.graph
            .flush(FlushRequest::All, |_| 0)
            .expect("flush")
            .expect("a region")
    }

    fn flush_for(&mut self, t: &TensorRef) -> Flush<u32> {
        self.graph
            .flush(FlushRequest::Storages(&[t.storage]), |_| 0)
            .expect("flush")
            .expect("a region")
    }
}

fn key(f: &Flush<u32>) -> (u64, u64) {
    (f.shapeless, f.dims)
}

/// `((x * a + b) * x).tanh()` over `shape` with the given scalars; returns its flush.
fn program(g: &mut G, shape: &[i64], a: ScalarArg, b: ScalarArg) -> Flush<u32> {
    let x = g.input(DType::F32, shape);
    let t1 = g.op(typed::Mul, &[&x], &[a]);
    let t2 = g.op(typed::Add, &[&t1], &[b]);
    let t3 = g.op(typed::Mul, &[&t2, &x], &[]);
    let y = g.op(typed::Tanh, &[&t3], &[]);
    for t in [t1, t2, t3] {
        g.release(t);
    }
    g.flush_for(&y)
}

#[test]
fn the_same_program_has_the_same_key_wherever_it_runs() {
    let f = ScalarArg::float;
    let first = program(&mut G::new(), &[4, 5], f(2.0), f(1.0));
    let mut g = G::new();
    let again = program(&mut g, &[4, 5], f(2.0), f(1.0));
    let third = program(&mut g, &[4, 5], f(2.0), f(1.0));
    assert_eq!(key(&first), key(&again));
    assert_eq!(key(&again), key(&third), "a later run on the same graph");
    assert_eq!(first.source().len(), 4);
    assert_eq!(
        first.outputs.len(),
        1,
        "released intermediates are not outputs"
    );
}

#[test]
fn changed_scalar_values_keep_the_key_and_the_module_text() {
    let f = ScalarArg::float;
    let a = program(&mut G::new(), &[4, 5], f(0.5), f(1.0));
    let b = program(&mut G::new(), &[4, 5], f(0.25), f(-3.5));
    assert_eq!(
        key(&a),
        key(&b),
        "x * 0.5 and x * 0.25 share one executable"
    );
    assert_eq!(
        fuse::build_module(&a.source().build()).unwrap(),
        fuse::build_module(&b.source().build()).unwrap(),
        "scalar values are runtime arguments, not constants"
    );
    // The values travel in one packed f32 buffer.
    assert_eq!(a.scalar_packs.len(), 1);
    assert_eq!(a.scalar_packs[0].dtype, DType::F32);
    assert_eq!(a.scalar_packs[0].count, 2);
    let values = |f: &Flush<u32>| -> Vec<f32> {
        f.scalar_packs[0]
            .bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    assert_eq!(values(&a), vec![0.5, 1.0]);
    assert_eq!(values(&b), vec![0.25, -3.5]);

    // alpha and a fill value are lifted too.
    let alpha = |v: f64| {
        let mut g = G::new();
        let x = g.input(DType::F32, &[8]);
        let filled = g.op(
            typed::Full.encode(layout::Creation {
                dtype: DType::F32,
                sizes: &[8],
            }),
            &[],
            &[ScalarArg::float(v * 3.0)],
        );
        let y = g.op(typed::Add, &[&x, &filled], &[ScalarArg::float(v)]);
        g.release(filled);
        key(&g.flush_for(&y))
    };
    assert_eq!(alpha(2.0), alpha(-7.25));
}

#[test]
fn scalar_kinds_are_part_of_the_shapeless_key() {
    let int = program(&mut G::new(), &[6], ScalarArg::int(2), ScalarArg::int(1));
    let float = program(
        &mut G::new(),
        &[6],
        ScalarArg::float(2.0),
        ScalarArg::int(1),
    );
    let tensor = program(
        &mut G::new(),
        &[6],
        ScalarArg::tensor(ScalarValue::Float(2.0), DType::F32),
        ScalarArg::int(1),
    );
    let boolean = program(
        &mut G::new(),
        &[6],
        ScalarArg::bool(true),
        ScalarArg::int(1),
    );
    assert_ne!(
        int.shapeless, float.shapeless,
        "x * 2 and x * 2.0 compile separately"
    );
    assert_ne!(
        float.shapeless, tensor.shapeless,
        "a Python float and a CPU 0-d tensor"
    );
    assert_ne!(int.shapeless, boolean.shapeless);
    assert_eq!(int.dims, float.dims, "kinds do not change sizes");
}

#[test]
fn other_dims_keep_the_shapeless_part() {
    let f = ScalarArg::float;
    let small = program(&mut G::new(), &[4, 5], f(2.0), f(1.0));
    let large = program(&mut G::new(), &[64, 3], f(2.0), f(1.0));
    let flat = program(&mut G::new(), &[7], f(2.0), f(1.0));
    assert_eq!(small.shapeless, large.shapeless);
    assert_eq!(small.shapeless, flat.shapeless, "rank is a dimension too");
    assert_ne!(small.dims, large.dims);
    assert_ne!(small.dims, flat.dims);

    // Broadcasting shapes of a binary op.
    let bcast = |a: &[i64], b: &[i64]| {
        let mut g = G::new();
        let x = g.input(DType::F32, a);
        let y = g.input(DType::F32, b);
        let z = g.op(typed::Add, &[&x, &y], &[]);
        g.flush_for(&z)
    };
    let p = bcast(&[3, 1], &[4]);
    let q = bcast(&[5, 1], &[2]);
    assert_eq!(p.shapeless, q.shapeless);
    assert_ne!(p.dims, q.dims);
}

#[test]
fn structure_dtypes_params_and_order_change_the_shapeless_part() {
    let unary_pair = |first: NoParams, second: NoParams, dtype: DType| {
        let mut g = G::new();
        let x = g.input(dtype, &[4]);
        let a = g.op(first, &[&x], &[]);
        let b = g.op(second, &[&a], &[]);
        g.release(a);
        g.flush_for(&b).shapeless
    };
    let base = unary_pair(typed::Exp, typed::Log, DType::F32);
    assert_eq!(base, unary_pair(typed::Exp, typed::Log, DType::F32));
    assert_ne!(
        base,
        unary_pair(typed::Log, typed::Exp, DType::F32),
        "order"
    );
    assert_ne!(base, unary_pair(typed::Exp, typed::Sin, DType::F32), "op");
    assert_ne!(
        base,
        unary_pair(typed::Exp, typed::Log, DType::F64),
        "dtype"
    );

    let reduce = |keepdim: bool, correction: f64, dim: i64| {
        let var = typed::Var.encode(layout::ReduceCorrectionDims {
            keepdim,
            correction,
            dims: &[dim],
        });
        let mut g = G::new();
        let x = g.input(DType::F32, &[3, 4]);
        let s = g.op(var, &[&x], &[]);
        g.flush_for(&s).shapeless
    };
    assert_ne!(reduce(false, 1.0, 0), reduce(false, 1.0, 1), "dims");
    assert_ne!(reduce(false, 1.0, 0), reduce(true, 1.0, 0), "keepdim");
    assert_ne!(reduce(false, 0.0, 0), reduce(false, -0.0, 0), "+0 vs -0");
    assert_eq!(
        reduce(false, f64::NAN, 0),
        reduce(false, f64::NAN, 0),
        "NaN params equal themselves"
    );
}

#[test]
fn aliasing_and_live_outputs_change_the_shapeless_part() {
    let add = |same: bool| {
        let mut g = G::new();
        let x = g.input(DType::F32, &[4]);
        let y = if same {
            x.clone()
        } else {
            g.input(DType::F32, &[4])
        };
        let z = g.op(typed::Add, &[&x, &y], &[]);
        let f = g.flush_for(&z);
        (f.shapeless, f.args.len())
    };
    let (same, same_args) = add(true);
    let (distinct, distinct_args) = add(false);
    assert_ne!(same, distinct, "x + x and x + y");
    assert_eq!((same_args, distinct_args), (1, 2));

    // The same ops with an intermediate still held by a storage: it is an output too.
    let chain = |keep: bool| {
        let mut g = G::new();
        let x = g.input(DType::F32, &[4]);
        let a = g.op(typed::Exp, &[&x], &[]);
        let b = g.op(typed::Neg, &[&a], &[]);
        if !keep {
            g.release(a);
        }
        g.flush_for(&b)
    };
    let kept = chain(true);
    let dropped = chain(false);
    assert_ne!(kept.shapeless, dropped.shapeless);
    assert_eq!(kept.outputs.len(), 2);
    assert_eq!(dropped.outputs.len(), 1);
}

#[test]
fn dead_ops_are_dropped_and_younger_ops_stay_pending() {
    let mut g = G::new();
    let x = g.input(DType::F32, &[4]);
    let old = g.op(typed::Sin, &[&x], &[]);
    let dead = g.op(typed::Cos, &[&x], &[]);
    g.release(dead);
    let wanted = g.op(typed::Exp, &[&x], &[]);
    let younger = g.op(typed::Neg, &[&x], &[]);
    let f = g.flush_for(&wanted);
    // Ordered materialization: `old` is older than `wanted` and runs with it; `dead` is dropped.
    assert_eq!(f.source().len(), 2, "{}", f.label);
    assert_eq!(f.dropped_ops, 1);
    assert_eq!(
        f.outputs.len(),
        2,
        "the requested value and the live older value"
    );
    assert_eq!(g.graph.pending_len(), 1, "the younger op stays pending");
    assert!(!g.graph.any_pending(&[old.storage, wanted.storage]));
    assert!(g.graph.any_pending(&[younger.storage]));
}

#[test]
fn a_partial_flush_leaves_the_rest_keyed_as_if_fresh() {
    let f = ScalarArg::float;
    let alone = {
        let mut g = G::new();
        let y = g.input(DType::F32, &[3, 3]);
        let a = g.op(typed::Mul, &[&y, &y], &[]);
        let _b = g.op(typed::Add, &[&a], &[f(1.0)]);
        g.release(a);
        key(&g.flush_all())
    };
    let mut g = G::new();
    let x = g.input(DType::F32, &[5]);
    let first = g.op(typed::Exp, &[&x], &[]);
    let y = g.input(DType::F32, &[3, 3]);
    let a = g.op(typed::Mul, &[&y, &y], &[]);
    let b = g.op(typed::Add, &[&a], &[f(1.0)]);
    g.release(a);
    let head = g.flush_for(&first);
    assert_eq!(head.source().len(), 1);
    assert_eq!(g.graph.pending_len(), 2);
    assert_eq!(
        key(&g.flush_all()),
        alone,
        "the remaining ops were rehashed from their new start"
    );
    assert!(!g.graph.any_pending(&[b.storage]));
}

#[test]
fn lookup_key_does_not_depend_on_values_of_externals() {
    // Two programs reading different device values of the same type share a key.
    let mut g = G::new();
    let x = g.input(DType::F32, &[2, 2]);
    let y = g.op(typed::Exp, &[&x], &[]);
    let first = g.flush_for(&y);
    let x2 = g.input(DType::F32, &[2, 2]);
    let y2 = g.op(typed::Exp, &[&x2], &[]);
    let second = g.flush_for(&y2);
    assert_eq!(key(&first), key(&second));
    assert_ne!(first.args, second.args, "the device values differ");
}

#[test]
fn size_params_belong_to_the_dims_part() {
    // `torch.full((n,), v) * x` for two n: the same structure with other dimensions.
    let full = |n: i64| {
        let mut g = G::new();
        let x = g.input(DType::F32, &[n]);
        let filled = g.op(
            typed::Full.encode(layout::Creation {
                dtype: DType::F32,
                sizes: &[n],
            }),
            &[],
            &[ScalarArg::float(1.5)],
        );
        let y = g.op(typed::Mul, &[&filled, &x], &[]);
        g.release(filled);
        g.flush_for(&y)
    };
    let (a, b) = (full(4), full(9));
    assert_ne!(a.dims, b.dims);
    assert_eq!(
        a.shapeless, b.shapeless,
        "sizes belong to the dims part of the key"
    );
}

#[test]
fn a_flush_of_only_dead_ops_runs_nothing() {
    let mut g = G::new();
    let x = g.input(DType::F32, &[4]);
    let a = g.op(typed::Exp, &[&x], &[]);
    let b = g.op(typed::Neg, &[&a], &[]);
    g.release(a);
    g.release(b);
    let flush = g.graph.flush(FlushRequest::All, |_| 0).expect("flush");
    assert_eq!(g.graph.pending_len(), 0, "the dead ops are dropped");
    assert!(
        flush.is_none(),
        "nothing needs to run, yet a region of {} ops and {} outputs was planned",
        flush.as_ref().map_or(0, |f| f.source().len()),
        flush.as_ref().map_or(0, |f| f.outputs.len())
    );
}
