//! Region keys: each node's digests (structure and sizes), hashed incrementally over the pending
//! list, and the one function both the flush and Strict's direct path key an op with.

use super::*;

impl<V: Clone> Graph<V> {
    /// The node's own digests: structure (shapeless) and sizes (dims), with inputs described
    /// relative to the pending list so one program shape gives one key wherever it starts.
    pub(super) fn node_digests(
        node: &Node,
        position: usize,
        base_seq: u64,
        arg_numbers: &mut HashMap<ExternalId, u32>,
        externals: &HashMap<ExternalId, External<V>>,
    ) -> (u64, u64) {
        let inputs = node.inputs.iter().map(|input| InputDigest {
            source: match input.value {
                ValueRef::Pending(out) => InputSource::Pending {
                    back: (position - (out.node.seq() - base_seq) as usize) as u64,
                    index: out.index,
                },
                ValueRef::External(e) => {
                    let next = arg_numbers.len() as u32;
                    InputSource::Argument {
                        number: *arg_numbers.entry(e).or_insert(next),
                        stored: externals.get(&e).map(|ext| &ext.ty),
                    }
                }
            },
            reshape_to: input.reshape_to.as_deref().map(|shape| shape.as_slice()),
            view: input.view.as_deref(),
        });
        op_digests(&node.op, &node.params, &node.scalars, inputs, &node.meta)
    }

    /// Recomputes every pending node's digests (after a partial flush moved the list's start).
    pub(super) fn rehash_pending(&mut self) {
        self.arg_numbers.clear();
        self.repeat_anchor = 0;
        let Some(base) = self.pending.front().map(|n| n.id.seq()) else {
            return;
        };
        let (mut prev_s, mut prev_d) = (0, 0);
        for position in 0..self.pending.len() {
            let (s, d) = Self::node_digests(
                &self.pending[position],
                position,
                base,
                &mut self.arg_numbers,
                &self.externals,
            );
            prev_s = fuse::combine(prev_s, s);
            prev_d = fuse::combine(prev_d, d);
            let node = &mut self.pending[position];
            node.prefix_shapeless = prev_s;
            node.prefix_dims = prev_d;
            self.track_repeats(position);
        }
    }
}

/// A region's key, built the same way by a flush and by Strict's direct path (which must find
/// the program a flush of its op would have compiled): the digests chained over the region's
/// ops, each output by its op's position and index, the checks' outputs, then the aliases.
pub(super) struct RegionKey {
    shapeless: StableHasher,
    dims: StableHasher,
}

impl RegionKey {
    /// Starts from the last region op's prefix digests, for a region of `outputs` outputs.
    pub(super) fn new(prefix: (u64, u64), outputs: usize) -> Self {
        let mut shapeless = StableHasher::new();
        let mut dims = StableHasher::new();
        shapeless.u64(prefix.0).u64(outputs as u64);
        dims.u64(prefix.1);
        RegionKey { shapeless, dims }
    }

    /// The next output: output `index` of the op at `position` in the region.
    pub(super) fn output(&mut self, position: usize, index: u32) {
        self.shapeless.u64(position as u64).u32(index);
    }

    /// Marks where the check verdicts' outputs start (each then added with `output`).
    pub(super) fn checks(&mut self, count: usize) {
        self.shapeless.u64(count as u64);
    }

    /// (shapeless, dims), with the (argument, output) aliases, sorted, ending the shapeless part.
    pub(super) fn finish(mut self, aliases: &[(u32, u32)]) -> (u64, u64) {
        self.shapeless.u64(aliases.len() as u64);
        for &(i, j) in aliases {
            self.shapeless.u32(i).u32(j);
        }
        (self.shapeless.finish(), self.dims.finish())
    }
}

/// What an op's digests need of one of its inputs.
pub(super) struct InputDigest<'a> {
    pub(super) source: InputSource<'a>,
    pub(super) reshape_to: Option<&'a [i64]>,
    pub(super) view: Option<&'a InputView>,
}

pub(super) enum InputSource<'a> {
    /// Output `index` of the op `back` places earlier in the pending list.
    Pending { back: u64, index: u32 },
    /// Region argument `number` (numbered by first use), of the stored type when known.
    Argument {
        number: u32,
        stored: Option<&'a TensorType>,
    },
}

/// An op's own digests: structure (shapeless) and sizes (dims). Shared by capture and by
/// Strict's direct path, which must key a one-op region exactly as a flush of it would.
/// Inlined into both: it runs on every captured op.
#[inline(always)]
pub(super) fn op_digests<'a>(
    op: &RegionOp,
    params: &[i64],
    scalars: &[ScalarArg],
    inputs: impl ExactSizeIterator<Item = InputDigest<'a>>,
    meta: &Meta,
) -> (u64, u64) {
    let outputs = &meta.outputs[..];
    let mut s = StableHasher::new();
    let mut d = StableHasher::new();
    match op {
        RegionOp::Aten(op) => {
            s.u32(op.id() as u32);
            // Most ops have no value-picked lowering; skipping the word keeps their keys as
            // they were. Op ids sit below 0x10000, so the tagged word can't read as another op's.
            if meta.variant != 0 {
                s.u32(0x1_0000 | meta.variant as u32);
            }
        }
        RegionOp::WriteView(w) => {
            s.u32(0xffff)
                .dtype(w.view_dtype)
                .dtype(w.base_dtype)
                .u32(u32::from(w.window.is_some()));
            d.i64(w.base_len).i64(w.window.unwrap_or(-1));
            views::hash_write_program_split(&w.program, &mut s, &mut d);
        }
        RegionOp::Padded(p) => {
            s.u32(0xfffe).u32(p.op.id() as u32).u32(meta.variant as u32);
            for dims in &p.plan.inputs {
                s.u64(dims.len() as u64);
                for &dim in dims {
                    s.u64(dim as u64);
                }
            }
        }
        RegionOp::Append(a) => {
            s.u32(0xfffd).u64(a.dim as u64);
            d.i64(a.out_bucket);
        }
    }
    let sizes_from = match op {
        RegionOp::Aten(op) => op.first_size_param(),
        RegionOp::Padded(p) => p.op.first_size_param(),
        RegionOp::WriteView(_) | RegionOp::Append(_) => None,
    };
    match sizes_from {
        Some(k) if k <= params.len() => {
            s.i64s(&params[..k]).u64(params.len() as u64);
            d.i64s(&params[k..]);
        }
        _ => {
            s.i64s(params);
        }
    }
    s.u64(scalars.len() as u64);
    for scalar in scalars {
        s.scalar_kind(scalar);
    }
    s.u64(inputs.len() as u64);
    for input in inputs {
        match input.source {
            InputSource::Pending { back, index } => {
                s.u32(1).u64(back).u32(index);
            }
            InputSource::Argument { number, stored } => {
                s.u32(2).u32(number);
                if let Some(ty) = stored {
                    s.dtype(ty.dtype);
                    d.i64s(&ty.shape);
                }
            }
        }
        match (input.reshape_to, input.view) {
            (_, Some(view)) => {
                s.u32(2)
                    .dtype(view.view_dtype)
                    .dtype(view.base_dtype)
                    .u32(u32::from(view.window.is_some()));
                d.i64(view.window.unwrap_or(-1));
                views::hash_chain_split(&view.chain, &mut s, &mut d);
            }
            (Some(shape), None) => {
                s.u32(1);
                d.i64s(shape);
            }
            (None, None) => {
                s.u32(0);
            }
        }
    }
    for out in outputs {
        s.dtype(out.dtype);
        d.i64s(&out.shape);
    }
    // A default float dtype other than float32 may have picked the result's or a scalar's
    // dtype; float32 keys stay as they were.
    if let Some(default) = meta.float_default {
        s.u32(0x2_0000).dtype(default);
    }
    // So does a float32 product precision other than full (`torch.set_float32_matmul_precision`).
    if let Some(precision) = meta.matmul_precision {
        s.u32(0x3_0000 | precision.code());
    }
    (s.finish(), d.finish())
}
