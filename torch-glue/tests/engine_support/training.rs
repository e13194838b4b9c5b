//! A small training loop through the engine: a linear layer with bias, relu and a summed loss,
//! its gradients by hand, and an SGD update of the weights in place with a learning rate that
//! changes every step (a lifted scalar: it never recompiles).

use super::{download_f32, output, upload_f32, view};
use defer::TensorRef;
use ops::{param_layout as layout, typed, DType, EncodedOp, OpId, ScalarArg};
use torch_glue::Engine;

pub const BATCH: i64 = 8;
pub const INPUTS: i64 = 16;
pub const OUTPUTS: i64 = 4;

/// The inputs and the parameters, resident on the device.
pub struct Model {
    pub x: TensorRef,
    pub w: TensorRef,
    pub b: TensorRef,
    /// `[batch, inputs, outputs]`.
    pub sizes: [i64; 3],
}

/// Deterministic values in [-1, 1).
fn values(n: i64, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

impl Model {
    pub fn upload(e: &Engine) -> Model {
        Model::upload_sized(e, BATCH, INPUTS, OUTPUTS)
    }

    /// The same layer at other sizes (benchmarks time it at a realistic one).
    pub fn upload_sized(e: &Engine, batch: i64, inputs: i64, outputs: i64) -> Model {
        Model {
            x: upload_f32(e, &values(batch * inputs, 1), &[batch, inputs]),
            w: upload_f32(e, &values(inputs * outputs, 2), &[inputs, outputs]),
            b: upload_f32(e, &values(outputs, 3), &[outputs]),
            sizes: [batch, inputs, outputs],
        }
    }

    /// The learning rate of step `n`.
    pub fn learning_rate(n: usize) -> f64 {
        0.05 / (1.0 + n as f64)
    }

    /// One step: forward, `loss.item()`, backward, SGD update. Returns the loss. With
    /// `sync`, everything is materialized and waited for before the loss is read and after the
    /// update (`torch_pjrt.sync()` twice a step), so no execution is in flight when a region is
    /// planned.
    pub fn step(&self, e: &Engine, n: usize, sync: bool) -> f32 {
        let [batch, inputs, outputs] = self.sizes;
        let op = |call: EncodedOp, inputs: &[&TensorRef], scalars: &[ScalarArg]| {
            let inputs: Vec<TensorRef> = inputs.iter().map(|t| (*t).clone()).collect();
            output(
                &e.op(call.op, &inputs, scalars, &call.params, &[])
                    .unwrap_or_else(|err| panic!("{}: {}", call.op.name(), err.message)),
            )
        };
        let h = op(typed::Mm.encode(()), &[&self.x, &self.w], &[]);
        let z = op(typed::Add.encode(()), &[&h, &self.b], &[]);
        let r = op(typed::Relu.encode(()), &[&z], &[]);
        let loss = op(
            typed::Sum.encode(layout::ReduceDtypeDims {
                keepdim: false,
                dtype: None,
                dims: &[],
            }),
            &[&r],
            &[],
        );
        if sync {
            e.sync().expect("sync");
        }
        let loss_value = download_f32(e, &loss)[0];
        // d loss / d z = 1 where z > 0: relu's backward of a ones gradient.
        let ones = op(
            typed::Ones.encode(layout::Creation {
                dtype: DType::F32,
                sizes: &[batch, outputs],
            }),
            &[],
            &[],
        );
        let g = op(
            typed::ThresholdBackward.encode(()),
            &[&ones, &z],
            &[ScalarArg::float(0.0)],
        );
        // x.t() @ g, reading x through a transposed view.
        let x_t = view(&self.x, &[inputs, batch], &[1, inputs], 0);
        let grad_w = op(typed::Mm.encode(()), &[&x_t, &g], &[]);
        let grad_b = op(
            typed::Sum.encode(layout::ReduceDtypeDims {
                keepdim: false,
                dtype: None,
                dims: &[0],
            }),
            &[&g],
            &[],
        );
        let lr = Model::learning_rate(n);
        for (param, grad) in [(&self.w, &grad_w), (&self.b, &grad_b)] {
            // param.add_(grad, alpha=-lr)
            e.op(
                OpId::Add,
                &[param.clone(), grad.clone()],
                &[ScalarArg::float(-lr)],
                &[],
                std::slice::from_ref(param),
            )
            .unwrap_or_else(|err| panic!("sgd update: {}", err.message));
        }
        for t in [h, z, r, loss, ones, g, grad_w, grad_b] {
            e.release_storage(t.storage).expect("release");
        }
        if sync {
            e.sync().expect("sync");
        }
        loss_value
    }
}
