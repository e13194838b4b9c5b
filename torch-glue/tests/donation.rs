//! Which region arguments are donated, and to which outputs: on the capture graph alone
//! (`defer::Graph<Arc<u32>>`, a plain value standing in for a device buffer). The decision rests
//! on the graph (which storage and which pending op still reads a value), never on who else
//! happens to hold the value at the moment.

use defer::{Flush, FlushRequest, Graph, TensorRef};
use ops::{DType, OpId, ScalarArg};
use std::sync::Arc;

struct G {
    graph: Graph<Arc<u32>>,
}

impl G {
    fn new() -> G {
        let mut graph = Graph::new();
        graph.set_donation(true);
        G { graph }
    }

    fn input(&mut self, value: u32, shape: &[i64]) -> TensorRef {
        let nbytes = shape.iter().product::<i64>() as u64 * 4;
        let t = TensorRef::contiguous(self.graph.new_storage(nbytes), DType::F32, shape);
        self.graph.write_device(&t, Arc::new(value)).expect("write");
        t
    }

    fn op(&mut self, op: OpId, inputs: &[&TensorRef], scalars: &[ScalarArg]) -> TensorRef {
        let inputs: Vec<TensorRef> = inputs.iter().map(|t| (*t).clone()).collect();
        let captured = self
            .graph
            .capture(op, &inputs, scalars, &[], &[])
            .expect("capture");
        let (storage, ty) = captured.outputs[0].clone();
        TensorRef::contiguous(storage, ty.dtype, &ty.shape)
    }

    /// `target op= source` (the in-place form: the result goes into `target`'s storage).
    fn update(&mut self, op: OpId, target: &TensorRef, inputs: &[&TensorRef], s: &[ScalarArg]) {
        let inputs: Vec<TensorRef> = inputs.iter().map(|t| (*t).clone()).collect();
        self.graph
            .capture(op, &inputs, s, &[], std::slice::from_ref(target))
            .expect("capture in place");
    }

    fn flush(&mut self) -> Flush<Arc<u32>> {
        let mut next = 100;
        self.graph
            .flush(FlushRequest::All, |_| {
                next += 1;
                Arc::new(next)
            })
            .expect("flush")
            .expect("a region")
    }
}

/// The argument index of the device value `value` in a flush.
fn arg_of(f: &Flush<Arc<u32>>, value: u32) -> u32 {
    f.args
        .iter()
        .position(|a| **a == value)
        .expect("an argument") as u32
}

#[test]
fn each_updated_parameter_is_donated_to_its_own_new_value() {
    // An SGD-with-momentum step: the gradient (a new value of the same shape) comes first among
    // the outputs, so matching donors to outputs by shape alone would pick it for the parameter.
    let mut g = G::new();
    let w = g.input(1, &[8, 4]);
    let buf = g.input(2, &[8, 4]);
    let x = g.input(3, &[8, 4]);
    let grad = g.op(OpId::Mul, &[&w, &x], &[]);
    g.update(OpId::Mul, &buf, &[&buf], &[ScalarArg::float(0.9)]);
    g.update(OpId::Add, &buf, &[&buf, &grad], &[]);
    g.update(OpId::Sub, &w, &[&w, &buf], &[ScalarArg::float(0.1)]);
    let f = g.flush();
    assert_eq!(f.outputs.len(), 3, "grad, buf and w are held");
    let aliases = f.source().aliases().to_vec();
    assert_eq!(
        aliases.len(),
        2,
        "w and buf are donated, x is still held: {aliases:?}"
    );
    // Outputs are in capture order of their producers: grad (0), buf (1), w (2).
    assert!(
        aliases.contains(&(arg_of(&f, 1), 2)),
        "w → new w: {aliases:?}"
    );
    assert!(
        aliases.contains(&(arg_of(&f, 2), 1)),
        "buf → new buf: {aliases:?}"
    );
    let module = fuse::build_module(&f.source().build()).unwrap();
    assert_eq!(module.matches("tf.aliasing_output").count(), 2, "{module}");
    assert!(!module.contains("buffer_donor"), "{module}");
}

#[test]
fn values_of_another_type_or_with_donation_off_are_not_donated() {
    let mut g = G::new();
    // w's old value is read in the same region after being overwritten (r = old w * 2 is
    // captured first): still donated, the compiler orders the read before the update.
    let w = g.input(1, &[4]);
    let r = g.op(OpId::Mul, &[&w], &[ScalarArg::float(2.0)]);
    g.update(OpId::Add, &w, &[&w], &[ScalarArg::float(1.0)]);
    let f = g.flush();
    assert_eq!(
        f.source().aliases(),
        &[(0, 1)],
        "w's old buffer becomes w's new value"
    );
    let _ = r;

    // A storage holding a 2x2 value, updated through a flat view: the new value is a
    // 4-element array, which the old buffer's type does not match.
    let v = g.input(5, &[2, 2]);
    let flat = TensorRef::contiguous(v.storage, DType::F32, &[4]);
    g.update(OpId::Add, &flat, &[&flat], &[ScalarArg::float(1.0)]);
    let f = g.flush();
    assert!(
        f.source().aliases().is_empty(),
        "{:?}",
        f.source().aliases()
    );

    // Donation off: nothing is aliased.
    let mut off = G::new();
    off.graph.set_donation(false);
    let u = off.input(1, &[4]);
    off.update(OpId::Add, &u, &[&u], &[ScalarArg::float(1.0)]);
    assert!(off.flush().source().aliases().is_empty());
}

#[test]
fn an_update_flushed_in_a_later_region_is_donated_there() {
    let mut g = G::new();
    let w = g.input(1, &[16]);
    for step in 0..3 {
        g.update(OpId::Add, &w, &[&w], &[ScalarArg::float(1.0)]);
        let f = g.flush();
        assert_eq!(f.source().aliases(), &[(0, 0)], "step {step}");
    }
}

#[test]
fn a_write_waits_for_the_outputs_that_read_its_old_value() {
    // The backward pass of an SGD step reads a weight through a product whose result the
    // weight's own update does not need: XLA can only keep that update in place (no copy of the
    // weight) if the product is ordered before it, so the update reads the weight through a
    // data dependency on the product's result.
    let mut g = G::new();
    let w = g.input(1, &[4, 4]);
    let x = g.input(2, &[4, 4]);
    let buf = g.input(3, &[4, 4]);
    let grad_input = g.op(OpId::Mm, &[&x, &w], &[]);
    g.update(OpId::Sub, &w, &[&w, &buf], &[ScalarArg::float(0.1)]);
    let f = g.flush();
    assert_eq!(f.source().aliases().len(), 1, "w is donated");
    let module = fuse::build_module(&f.source().build()).unwrap();
    let product = module.find("stablehlo.dot_general").expect("the product");
    let tie = module
        .find("stablehlo.or")
        .expect("the update waits for the product");
    let update = module.find("stablehlo.subtract").expect("the update");
    assert!(product < tie && tie < update, "{module}");
    assert_eq!(
        module.matches("stablehlo.shift_right_logical").count(),
        2,
        "{module}"
    );
    let _ = grad_input;
}

#[test]
fn a_write_that_already_depends_on_every_read_waits_for_nothing() {
    // The update consumes the product that reads the old weight: XLA orders them already.
    let mut g = G::new();
    let w = g.input(1, &[4, 4]);
    let x = g.input(2, &[4, 4]);
    let step = g.op(OpId::Mm, &[&x, &w], &[]);
    g.update(OpId::Sub, &w, &[&w, &step], &[ScalarArg::float(0.1)]);
    let f = g.flush();
    assert_eq!(f.source().aliases().len(), 1, "w is donated");
    let module = fuse::build_module(&f.source().build()).unwrap();
    assert!(!module.contains("stablehlo.or"), "{module}");
    assert!(!module.contains("shift_right_logical"), "{module}");
}
