//! The graph's rules with plain integers as device values: keys, the direct path, flush planning
//! and the signatures a recompile is explained from.

use super::*;
use crate::signature::explain;

/// `cat`'s params along `dim`.
fn cat_at(dim: i64) -> SmallVec<[i64; 6]> {
    typed::Cat.encode(layout::Dim { dim }).params
}

fn device(g: &mut Graph<u32>, dtype: DType, sizes: &[i64], value: u32) -> TensorRef {
    let n: i64 = sizes.iter().product();
    let s = g.new_storage(n as u64 * dtype.size_bytes() as u64);
    let t = TensorRef::contiguous(s, dtype, sizes);
    g.write_device(&t, value).unwrap();
    t
}

fn call<'a>(
    op: OpId,
    inputs: &'a [TensorRef],
    scalars: &'a [ScalarArg],
    outs: &'a [TensorRef],
) -> OpCall<'a> {
    OpCall {
        op,
        inputs,
        scalars,
        params: &[],
        outs,
    }
}

/// The key the direct path computes for `op` (it declines, having no program), then the key of
/// the capture and one-op flush of the same op.
fn direct_and_flush_keys(
    g: &mut Graph<u32>,
    op: OpId,
    inputs: &[TensorRef],
    scalars: &[ScalarArg],
    outs: &[TensorRef],
) -> ((u64, u64), (u64, u64)) {
    let mut asked = None;
    let run = g
        .run_if_compiled(
            call(op, inputs, scalars, outs),
            |_| 0,
            |s, d, ops| {
                assert_eq!(ops.ops, 1);
                asked = Some((s, d));
                false
            },
        )
        .unwrap();
    assert!(run.is_none(), "no program: the direct path declines");
    g.capture(op, inputs, scalars, &[], outs).unwrap();
    let flush = g
        .flush(FlushRequest::All, |_| 7)
        .unwrap()
        .expect("a region");
    (
        asked.expect("the direct path keyed the op"),
        (flush.shapeless, flush.dims),
    )
}

#[test]
fn the_direct_path_keys_an_op_as_its_flush_does() {
    let mut g: Graph<u32> = Graph::new();
    g.set_donation(true);
    let x = device(&mut g, DType::F32, &[4, 3], 1);
    let y = device(&mut g, DType::F32, &[4, 3], 2);
    let (direct, flushed) =
        direct_and_flush_keys(&mut g, OpId::Mul, &[x.clone(), y.clone()], &[], &[]);
    assert_eq!(direct, flushed, "a new result");
    // In place, donating the overwritten value: the alias is part of both keys.
    let (direct, flushed) = direct_and_flush_keys(
        &mut g,
        OpId::Add,
        &[x.clone(), y.clone()],
        &[],
        std::slice::from_ref(&x),
    );
    assert_eq!(direct, flushed, "an in-place update");
    // And a warm direct run returns that region, outputs installed.
    let (captured, flush) = g
        .run_if_compiled(
            call(OpId::Mul, &[x.clone(), y], &[], &[]),
            |_| 9,
            |_, _, _| true,
        )
        .unwrap()
        .expect("the program exists");
    assert_eq!(flush.outputs.as_slice(), &[9]);
    assert!(flush.region.is_none(), "a warm run builds no source");
    assert!(matches!(
        g.read_source(&TensorRef::contiguous(
            captured.outputs[0].0,
            DType::F32,
            &[4, 3]
        ))
        .unwrap(),
        Some(ReadSource::Device(9, _))
    ));
}

#[test]
fn a_flush_keeps_held_values_and_drops_dead_ones() {
    let mut g: Graph<u32> = Graph::new();
    let x = device(&mut g, DType::F32, &[8], 1);
    let a = g
        .capture(OpId::Neg, std::slice::from_ref(&x), &[], &[], &[])
        .unwrap();
    let a = TensorRef::contiguous(a.outputs[0].0, DType::F32, &[8]);
    // Captured before the requested value, so in its region (ordered materialization), and
    // read by nothing once released.
    let dead = g
        .capture(OpId::Sin, std::slice::from_ref(&x), &[], &[], &[])
        .unwrap();
    let b = g
        .capture(OpId::Exp, std::slice::from_ref(&a), &[], &[], &[])
        .unwrap();
    let b = TensorRef::contiguous(b.outputs[0].0, DType::F32, &[8]);
    // Captured after it: stays pending.
    let later = g
        .capture(OpId::Cos, std::slice::from_ref(&x), &[], &[], &[])
        .unwrap();
    g.release_storage(dead.outputs[0].0).unwrap();
    g.release_storage(a.storage).unwrap();
    assert_eq!(g.pending_len(), 4);
    let flush = g
        .flush(FlushRequest::Storages(&[b.storage]), |_| 5)
        .unwrap()
        .expect("a region");
    assert_eq!(flush.ops, 2, "neg and exp run; sin is dead");
    assert_eq!(flush.dropped_ops, 1);
    assert_eq!(flush.outputs.as_slice(), &[5], "only exp's result is held");
    assert_eq!(g.pending_len(), 1, "cos stays pending");
    assert!(g.any_pending(&[later.outputs[0].0]));
}

#[test]
fn a_view_over_a_longer_value_keeps_the_structure_key() {
    // `x.t()` of a `[4, len]` value, negated: one structure, a new dimensions key per length.
    let keys = |len: i64| {
        let mut g: Graph<u32> = Graph::new();
        let base = device(&mut g, DType::F32, &[4, len], 1);
        let transposed = TensorRef {
            storage: base.storage,
            dtype: DType::F32,
            sizes: Shape::from_slice(&[len, 4]),
            strides: SmallVec::from_slice(&[1, len]),
            offset: 0,
        };
        g.capture(OpId::Neg, &[transposed], &[], &[], &[]).unwrap();
        let flush = g.flush(FlushRequest::All, |_| 0).unwrap().unwrap();
        let signature = flush.source().signature();
        ((flush.shapeless, flush.dims), signature)
    };
    let ((s9, d9), sig9) = keys(9);
    let ((s10, d10), sig10) = keys(10);
    assert_eq!(s9, s10);
    assert_ne!(d9, d10);
    // The explanation names the input's new length and its view.
    assert_eq!(sig9.skeleton, sig10.skeleton);
    let changes = explain(&sig9, &sig10);
    assert_eq!(changes[0].what, "input 0 (self) dim 0");
    assert_eq!(
        (changes[0].old.as_str(), changes[0].new.as_str()),
        ("9", "10")
    );
    assert!(
        changes.iter().any(|c| c.what == "input 0 (self) view"),
        "{changes:?}"
    );
}

#[test]
fn signatures_see_static_params_and_dtypes() {
    let sig = |dtype: DType, dims: i64| {
        let mut g: Graph<u32> = Graph::new();
        let x = device(&mut g, dtype, &[3, 4], 1);
        let sum = typed::Sum.encode(layout::ReduceDtypeDims {
            keepdim: false,
            dtype: None,
            dims: &[dims],
        });
        g.capture(sum.op, &[x], &[], &sum.params, &[]).unwrap();
        g.flush(FlushRequest::All, |_| 0)
            .unwrap()
            .unwrap()
            .source()
            .signature()
    };
    let changes = explain(&sig(DType::F32, 0), &sig(DType::F32, 1));
    assert_eq!(changes[0].what, "param 2 (dims)");
    let changes = explain(&sig(DType::F32, 0), &sig(DType::F16, 0));
    assert_eq!(changes[0].what, "input 0 (self) dtype");
}

#[test]
fn isolation_cuts_put_each_varying_op_in_a_region_of_its_own() {
    // Kept ops at pending positions 0, 1, 3 (2 was dropped), 4, 5; ops 1 and 3 vary.
    let positions = [0, 1, 3, 4, 5];
    assert_eq!(isolation_cuts(&positions, &[1, 3]), vec![1, 3, 4, 5]);
    // The first op needs no cut before it; the last no cut after it.
    assert_eq!(isolation_cuts(&positions, &[0, 4]), vec![1, 5]);
    assert_eq!(isolation_cuts(&positions, &[]), Vec::<usize>::new());
    assert_eq!(
        isolation_cuts(&positions, &[9]),
        Vec::<usize>::new(),
        "unknown index"
    );
}

#[test]
fn the_planned_region_is_what_the_flush_runs() {
    let mut g: Graph<u32> = Graph::new();
    let x = device(&mut g, DType::F32, &[8], 1);
    let a = g
        .capture(OpId::Neg, std::slice::from_ref(&x), &[], &[], &[])
        .unwrap();
    let dead = g
        .capture(OpId::Sin, std::slice::from_ref(&x), &[], &[], &[])
        .unwrap();
    g.release_storage(dead.outputs[0].0).unwrap();
    let a = TensorRef::contiguous(a.outputs[0].0, DType::F32, &[8]);
    let b = g
        .capture(OpId::Exp, std::slice::from_ref(&a), &[], &[], &[])
        .unwrap();
    let request = [b.outputs[0].0];
    let PlannedRegion {
        skeleton,
        positions,
        prefix,
    } = g
        .planned_region(FlushRequest::Storages(&request))
        .unwrap()
        .unwrap();
    assert_eq!(positions, vec![0, 2], "neg and exp; sin is dead");
    assert_eq!(g.pending_len(), 3, "planning changes nothing");
    let flush = g
        .flush(FlushRequest::Storages(&request), |_| 0)
        .unwrap()
        .unwrap();
    assert_eq!(flush.source().signature().skeleton, skeleton);
    assert_eq!(flush.prefix, prefix);
}

/// Each step's cache length and region key.
type StepKeys = Vec<(i64, (u64, u64))>;

/// Reads `t` in one op (a product by 0.5) and flushes everything pending as one region.
fn halve_and_flush(g: &mut Graph<u32>, t: TensorRef) -> Flush<u32> {
    g.capture(OpId::Mul, &[t], &[ScalarArg::float(0.5)], &[], &[])
        .unwrap();
    g.flush(FlushRequest::All, |_| 7)
        .unwrap()
        .expect("a region")
}

/// A `[1, 2, len, 4]` cache grown by one position per step, as a decoding loop grows its KV
/// cache; returns the cache and each step's attention-like region key (a transposed read of
/// the cache, scaled).
fn grow_cache(g: &mut Graph<u32>, steps: usize) -> (TensorRef, StepKeys) {
    let mut cache = device(g, DType::F32, &[1, 2, 8, 4], 1);
    let mut keys = Vec::new();
    for step in 0..steps {
        let new = device(g, DType::F32, &[1, 2, 1, 4], 10 + step as u32);
        let captured = g
            .capture(OpId::Cat, &[cache.clone(), new], &[], &cat_at(2), &[])
            .unwrap();
        let (storage, ty) = captured.outputs[0].clone();
        cache = TensorRef::contiguous(storage, ty.dtype, &ty.shape);
        g.flush(FlushRequest::All, |_| 7).unwrap();
        let len = ty.shape[2];
        let transposed = TensorRef {
            strides: SmallVec::from_slice(&[8 * len, 4 * len, 1, 4]),
            sizes: Shape::from_slice(&[1, 2, 4, len]),
            ..cache.clone()
        };
        let flush = halve_and_flush(g, transposed);
        keys.push((len, (flush.shapeless, flush.dims)));
    }
    (cache, keys)
}

#[test]
fn a_growing_cache_is_padded_from_its_second_append_and_keyed_by_bucket() {
    let mut g: Graph<u32> = Graph::new();
    let (cache, keys) = grow_cache(&mut g, 12);
    assert!(g.stats().padded_ops > 0);
    assert!(g.is_padded(cache.storage));
    assert!(
        !g.is_whole(&cache).unwrap(),
        "a padded value is never read whole"
    );
    let key_of = |len: i64| keys.iter().find(|(l, _)| *l == len).unwrap().1;
    // Lengths 10..=16 share the bucket of 16, 17..=20 that of 32.
    for len in 11..=16 {
        assert_eq!(key_of(len), key_of(10), "length {len}");
    }
    assert_ne!(key_of(17), key_of(16));
    assert_eq!(key_of(18), key_of(20));
    // The first step saw no growth yet: exact.
    assert_ne!(key_of(9), key_of(10));
    assert_eq!(g.stats().unpadded_values, 0);
}

#[test]
fn a_read_into_the_extent_cuts_the_padding_off_first() {
    let mut g: Graph<u32> = Graph::new();
    let (cache, _) = grow_cache(&mut g, 4);
    assert!(g.is_padded(cache.storage));
    let len = cache.sizes[2];
    // The last position alone is a true element of the padded value: read as it is.
    let last = TensorRef {
        sizes: Shape::from_slice(&[1, 2, 1, 4]),
        offset: (len - 1) * 4,
        ..cache.clone()
    };
    let captured = g.capture(OpId::Clone, &[last], &[], &[], &[]).unwrap();
    assert_eq!(captured.outputs[0].1.shape.as_slice(), &[1, 2, 1, 4]);
    assert_eq!(g.stats().unpadded_values, 0);
    assert!(g.is_padded(cache.storage));
    // The last two: a slice of the extent, which no padded program reads. It reads an exact
    // copy; the cache stays padded for its next append.
    let last_two = TensorRef {
        sizes: Shape::from_slice(&[1, 2, 2, 4]),
        offset: (len - 2) * 4,
        ..cache.clone()
    };
    let captured = g.capture(OpId::Clone, &[last_two], &[], &[], &[]).unwrap();
    assert_eq!(captured.outputs[0].1.shape.as_slice(), &[1, 2, 2, 4]);
    assert_eq!(g.stats().unpadded_values, 1);
    assert!(g.is_padded(cache.storage));
    // Written through that slice: cut back in place.
    let one = device(&mut g, DType::F32, &[1, 2, 2, 4], 3);
    let last_two = TensorRef {
        sizes: Shape::from_slice(&[1, 2, 2, 4]),
        offset: (len - 2) * 4,
        ..cache.clone()
    };
    g.capture(OpId::Copy, &[last_two.clone(), one], &[], &[], &[last_two])
        .unwrap();
    assert!(!g.is_padded(cache.storage));
    assert!(g.is_whole(&cache).unwrap());
}

#[test]
fn a_first_entry_is_padded_at_once_so_its_first_append_reads_a_bucket() {
    let mut g: Graph<u32> = Graph::new();
    let empty = device(&mut g, DType::F32, &[0], 0);
    let x = device(&mut g, DType::F32, &[1, 2, 8, 4], 1);
    let captured = g.capture(OpId::Cat, &[empty, x], &[], &[-2], &[]).unwrap();
    let (storage, ty) = captured.outputs[0].clone();
    assert_eq!(
        ty.shape.as_slice(),
        &[1, 2, 8, 4],
        "PyTorch sees the true shape"
    );
    assert!(g.is_padded(storage));
    let mut cache = TensorRef::contiguous(storage, ty.dtype, &ty.shape);
    g.flush(FlushRequest::All, |_| 7).unwrap();
    // A read the padded programs cannot run (a slice of the extent) keeps it padded.
    let first_two = TensorRef {
        sizes: Shape::from_slice(&[1, 2, 2, 4]),
        ..cache.clone()
    };
    g.capture(OpId::Clone, &[first_two], &[], &[], &[]).unwrap();
    g.flush(FlushRequest::All, |_| 7).unwrap();
    assert!(g.is_padded(storage));
    // Each append, the first included, is the same program while the bucket holds.
    let mut keys = Vec::new();
    for step in 0..4 {
        let new = device(&mut g, DType::F32, &[1, 2, 1, 4], 10 + step);
        let captured = g
            .capture(OpId::Cat, &[cache.clone(), new], &[], &[2], &[])
            .unwrap();
        let (storage, ty) = captured.outputs[0].clone();
        assert!(g.is_padded(storage));
        cache = TensorRef::contiguous(storage, ty.dtype, &ty.shape);
        let flush = g
            .flush(FlushRequest::All, |_| 7)
            .unwrap()
            .expect("a region");
        keys.push((flush.shapeless, flush.dims));
    }
    assert!(keys.windows(2).all(|w| w[0] == w[1]), "{keys:?}");
}

#[test]
fn bounded_shapes_off_keeps_every_value_exact() {
    let mut g: Graph<u32> = Graph::new();
    g.set_bounded(false);
    let (cache, keys) = grow_cache(&mut g, 4);
    assert_eq!(g.stats().padded_ops, 0);
    assert!(!g.is_padded(cache.storage));
    assert_ne!(keys[2].1, keys[3].1);
}

#[test]
fn tensors_made_at_the_appended_length_are_padded_like_the_sequence() {
    let mut g: Graph<u32> = Graph::new();
    let (cache, _) = grow_cache(&mut g, 4);
    let len = cache.sizes[2];
    let zeros = typed::Zeros.encode(layout::Creation {
        dtype: DType::F32,
        sizes: &[1, len],
    });
    let zeros = g.capture(zeros.op, &[], &[], &zeros.params, &[]).unwrap();
    let (storage, ty) = zeros.outputs[0].clone();
    assert_eq!(
        ty.shape.as_slice(),
        &[1, len],
        "PyTorch sees the true sizes"
    );
    assert!(g.is_padded(storage));
    let arange = typed::Arange.encode(layout::ArangeRange {
        dtype: DType::I64,
        start: 0.0,
        end: len as f64,
        step: 1.0,
    });
    let positions = g.capture(arange.op, &[], &[], &arange.params, &[]).unwrap();
    assert!(g.is_padded(positions.outputs[0].0));
    // Other lengths are not the sequence's.
    let other = typed::Zeros.encode(layout::Creation {
        dtype: DType::F32,
        sizes: &[3, 5],
    });
    let other = g.capture(other.op, &[], &[], &other.params, &[]).unwrap();
    assert!(!g.is_padded(other.outputs[0].0));
}

#[test]
fn an_in_place_op_on_a_padded_value_keeps_it_padded() {
    let mut g: Graph<u32> = Graph::new();
    let (cache, _) = grow_cache(&mut g, 4);
    let before = g.stats().padded_ops;
    g.capture(
        OpId::Add,
        &[cache.clone(), cache.clone()],
        &[],
        &[],
        std::slice::from_ref(&cache),
    )
    .unwrap();
    assert_eq!(g.stats().padded_ops, before + 1);
    assert_eq!(g.stats().unpadded_values, 0);
    assert!(g.is_padded(cache.storage));
    // Writing part of it needs the exact value first.
    let first = TensorRef {
        sizes: Shape::from_slice(&[1, 2, 1, 4]),
        ..cache.clone()
    };
    g.capture(
        OpId::Neg,
        std::slice::from_ref(&first),
        &[],
        &[],
        std::slice::from_ref(&first),
    )
    .unwrap();
    assert_eq!(g.stats().unpadded_values, 1);
    assert!(!g.is_padded(cache.storage));
}

#[test]
fn a_copy_of_a_padded_value_stays_padded_until_a_host_read_makes_it_exact() {
    // `_to_copy` into a fresh tensor (`.float()`, `.clone()`) keeps the bucket, so the ops
    // that read the copy stay padded; a host read asks for the exact value first.
    let mut g: Graph<u32> = Graph::new();
    let (cache, _) = grow_cache(&mut g, 4);
    let nbytes = cache.numel() as u64 * 4;
    let temp = TensorRef::contiguous(g.new_storage(nbytes), DType::F32, &cache.sizes);
    g.capture(
        OpId::Clone,
        std::slice::from_ref(&cache),
        &[],
        &[],
        std::slice::from_ref(&temp),
    )
    .unwrap();
    assert!(g.is_padded(temp.storage));
    assert!(!g.is_whole(&temp).unwrap());
    let unpadded = g.stats().unpadded_values;
    g.make_exact(temp.storage).unwrap();
    assert!(!g.is_padded(temp.storage));
    assert!(g.is_whole(&temp).unwrap());
    assert_eq!(g.stats().unpadded_values, unpadded + 1);
}

#[test]
fn a_value_regrown_before_it_outgrows_its_bucket_appends_as_at_the_steps_after() {
    let mut g: Graph<u32> = Graph::new();
    // Length 16: the bucket is full, the next append outgrows it.
    let (mut cache, _) = grow_cache(&mut g, 8);
    let mut keys = Vec::new();
    for step in 0..3 {
        let new = device(&mut g, DType::F32, &[1, 2, 1, 4], 50 + step);
        let inputs = [cache.clone(), new];
        if let Some(regrow) = g.append_regrow(&inputs, &cat_at(2)) {
            assert_eq!(step, 0, "only the append that outgrows the bucket regrows");
            assert_eq!((regrow.dim, regrow.bucket, regrow.value), (2, 32, 7));
            assert_eq!(regrow.held.shape.as_slice(), &[1, 2, 16, 4]);
            assert_eq!(regrow.grown_sizes().as_slice(), &[1, 2, 32, 4]);
            g.install_regrown(&regrow, 99).unwrap();
        }
        let captured = g.capture(OpId::Cat, &inputs, &[], &cat_at(2), &[]).unwrap();
        let (storage, ty) = captured.outputs[0].clone();
        assert_eq!(
            ty.shape[2],
            17 + step as i64,
            "PyTorch sees the true length"
        );
        cache = TensorRef::contiguous(storage, ty.dtype, &ty.shape);
        let flush = g
            .flush(FlushRequest::All, |_| 7)
            .unwrap()
            .expect("a region");
        if step == 0 {
            assert!(
                flush.args.contains(&99),
                "the append reads the regrown value"
            );
        }
        keys.push((flush.shapeless, flush.dims));
    }
    // The crossing append's program is the one of the appends after it.
    assert_eq!(keys[0], keys[1]);
    assert_eq!(keys[1], keys[2]);
    assert_eq!(g.stats().regrown_values, 1);
    assert_eq!(g.stats().unpadded_values, 0);
}

#[test]
fn only_a_padded_device_value_about_to_outgrow_its_bucket_regrows() {
    let mut g: Graph<u32> = Graph::new();
    let (cache, _) = grow_cache(&mut g, 4); // length 12 of 16
    let new = device(&mut g, DType::F32, &[1, 2, 1, 4], 50);
    assert!(g
        .append_regrow(&[cache.clone(), new.clone()], &cat_at(2))
        .is_none());
    // Five more rows would outgrow it, but not along another dimension, nor an exact value.
    let five = device(&mut g, DType::F32, &[1, 2, 5, 4], 51);
    assert!(g
        .append_regrow(&[cache.clone(), five.clone()], &cat_at(2))
        .is_some());
    assert!(g
        .append_regrow(&[cache.clone(), five.clone()], &cat_at(1))
        .is_none());
    let exact = device(&mut g, DType::F32, &[1, 2, 16, 4], 52);
    assert!(g
        .append_regrow(&[exact, five.clone()], &cat_at(2))
        .is_none());
    // A pending padded value grows inside its region.
    let pending = g
        .capture(OpId::Cat, &[cache, new], &[], &cat_at(2), &[])
        .unwrap()
        .outputs[0]
        .clone();
    let pending = TensorRef::contiguous(pending.0, pending.1.dtype, &pending.1.shape);
    assert!(g.append_regrow(&[pending, five], &cat_at(2)).is_none());
}

#[test]
fn an_append_writes_into_the_buffer_of_a_padded_value_nothing_else_holds() {
    // A dynamic cache's old value is released once the new one replaces it: the append then
    // takes over its buffer (same bucket, same type), so the cache is updated in place.
    for released in [true, false] {
        let mut g: Graph<u32> = Graph::new();
        g.set_donation(true);
        let (cache, _) = grow_cache(&mut g, 4);
        let new = device(&mut g, DType::F32, &[1, 2, 1, 4], 50);
        let appended = g
            .capture(OpId::Cat, &[cache.clone(), new], &[], &cat_at(2), &[])
            .unwrap();
        if released {
            g.release_storage(cache.storage).unwrap();
        }
        let (storage, ty) = appended.outputs[0].clone();
        let grown = TensorRef::contiguous(storage, ty.dtype, &ty.shape);
        let flush = halve_and_flush(&mut g, grown);
        assert_eq!(
            flush.aliases.is_empty(),
            !released,
            "a cache still held keeps its buffer: {:?}",
            flush.aliases
        );
    }
}

#[test]
fn a_host_gather_copies_a_views_elements_in_row_major_order() {
    // A [3, 4] value of one-byte elements 0..12; its transpose's first two columns.
    let value: Vec<u8> = (0..12).collect();
    let gather = HostGather {
        sizes: Shape::from_slice(&[2, 3]),
        strides: SmallVec::from_slice(&[1, 4]),
        offset: 1,
    };
    let mut dst = [0u8; 6];
    assert!(gather.copy(&value, 1, &mut dst));
    assert_eq!(dst, [1, 5, 9, 2, 6, 10]);
    // Rows of a contiguous window, two bytes per element.
    let wide: Vec<u8> = (0..24).collect();
    let window = HostGather {
        sizes: Shape::from_slice(&[1, 3]),
        strides: SmallVec::from_slice(&[3, 1]),
        offset: 2,
    };
    let mut dst = [0u8; 6];
    assert!(window.copy(&wide, 2, &mut dst));
    assert_eq!(dst, [4, 5, 6, 7, 8, 9]);
    // A view reaching past the value is refused.
    let past = HostGather {
        sizes: Shape::from_slice(&[5]),
        strides: SmallVec::from_slice(&[3]),
        offset: 0,
    };
    assert!(!past.copy(&value, 1, &mut [0u8; 5]));
}

#[test]
fn a_view_of_a_padded_storage_is_gathered_through_the_padded_value() {
    let mut g: Graph<u32> = Graph::new();
    let (cache, _) = grow_cache(&mut g, 4);
    assert!(g.is_padded(cache.storage));
    let len = cache.sizes[2];
    // The second head's last position.
    let last = TensorRef {
        sizes: Shape::from_slice(&[4]),
        strides: SmallVec::from_slice(&[1]),
        offset: len * 4 + (len - 1) * 4,
        ..cache.clone()
    };
    let gather = g.host_gather(&last, 1 << 20).unwrap().unwrap();
    let bucket = ops::padding::bucket(len);
    assert_eq!(gather.offset, bucket * 4 + (len - 1) * 4);
    assert_eq!(gather.strides.as_slice(), &[1]);
    // The whole padded storage is read too; nothing was cut back.
    assert!(g.host_gather(&cache, 1 << 20).unwrap().is_some());
    assert_eq!(g.stats().unpadded_values, 0);
}

#[test]
fn a_default_float_other_than_float32_keys_its_programs_apart() {
    // `int == 2.5` is a bool either way, but its scalar is compared in the default dtype: the
    // dtype must be in the key. Float32's keys are those of a capture with no default given.
    let mut g: Graph<u32> = Graph::new();
    let ints = device(&mut g, DType::I64, &[3], 1);
    let half = [ScalarArg::float(2.5)];
    let keys = |g: &mut Graph<u32>, default: Option<DType>| {
        let _guard = default.map(ops::scoped_default_float);
        direct_and_flush_keys(g, OpId::Eq, std::slice::from_ref(&ints), &half, &[])
    };
    let (plain_direct, plain) = keys(&mut g, None);
    let (f32_direct, f32) = keys(&mut g, Some(DType::F32));
    let (f64_direct, f64) = keys(&mut g, Some(DType::F64));
    assert_eq!((plain_direct, f32_direct), (plain, f32));
    assert_eq!(
        f64_direct, f64,
        "the direct path keys the default as the flush does"
    );
    assert_eq!(plain, f32);
    assert_ne!(f32.0, f64.0);
}

#[test]
fn a_view_merging_the_extent_with_outer_dimensions_is_gathered_run_by_run() {
    // A linear layer's `[heads * length, features]` rows of a padded `[1, heads, length, 4]`
    // cache: each head's rows are a run of the bucket, of which the first `length` are true.
    let mut g: Graph<u32> = Graph::new();
    let (cache, _) = grow_cache(&mut g, 4);
    let len = cache.sizes[2];
    let bucket = ops::padding::bucket(len);
    assert!(len < bucket, "the cache is padded past its length");
    let rows = TensorRef {
        sizes: Shape::from_slice(&[2 * len, 4]),
        strides: SmallVec::from_slice(&[4, 1]),
        offset: 0,
        ..cache.clone()
    };
    let gather = g.host_gather(&rows, 1 << 20).unwrap().unwrap();
    // The padded value, two bytes per element: each true element holds its index in the true
    // tensor, the padding holds a value no true element has.
    let mut padded = Vec::new();
    for head in 0..2 {
        for position in 0..bucket {
            for feature in 0..4 {
                let value: u16 = if position < len {
                    (head * len * 4 + position * 4 + feature) as u16
                } else {
                    u16::MAX
                };
                padded.extend(value.to_le_bytes());
            }
        }
    }
    let mut dst = vec![0u8; (2 * len * 4 * 2) as usize];
    assert!(gather.copy(&padded, 2, &mut dst));
    let read: Vec<u16> = dst
        .chunks(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    let expected: Vec<u16> = (0..(2 * len * 4) as u16).collect();
    assert_eq!(read, expected, "every true row in order, no padding");
}

#[test]
fn the_host_follows_small_integer_values_through_uploads_fills_and_copies() {
    let mut g: Graph<u32> = Graph::new();
    let long = DType::I64;
    let bytes =
        |values: &[i64]| -> Vec<u8> { values.iter().flat_map(|v| v.to_ne_bytes()).collect() };
    // An upload of [[1, 2], [3, 4]]: its transpose reads 1, 3, 2, 4.
    let t = device(&mut g, long, &[2, 2], 0);
    g.note_uploaded(&t, &bytes(&[1, 2, 3, 4]));
    let transposed = TensorRef {
        strides: SmallVec::from_slice(&[1, 2]),
        ..t.clone()
    };
    assert_eq!(g.known_elements(&transposed), Some(vec![1, 3, 2, 4]));
    // Read as another dtype, the bytes are not followed.
    let as_int = TensorRef::contiguous(t.storage, DType::I32, &[8]);
    assert_eq!(g.known_elements(&as_int), None);

    // A fill of one element through a view keeps the others (`t[1, 1] = 10`).
    let corner = TensorRef {
        sizes: Shape::new(),
        strides: SmallVec::new(),
        offset: 3,
        ..t.clone()
    };
    let fill = typed::Full.encode(layout::Creation {
        dtype: long,
        sizes: &[],
    });
    g.capture(
        fill.op,
        &[],
        &[ScalarArg::int(10)],
        &fill.params,
        std::slice::from_ref(&corner),
    )
    .unwrap();
    assert_eq!(g.known_elements(&t), Some(vec![1, 2, 3, 10]));

    // A copy into a new storage, and a cast that wraps as PyTorch's does.
    let copy = g
        .capture(OpId::Clone, std::slice::from_ref(&t), &[], &[], &[])
        .unwrap();
    let copy = TensorRef::contiguous(copy.outputs[0].0, long, &[2, 2]);
    assert_eq!(g.known_elements(&copy), Some(vec![1, 2, 3, 10]));
    let filled = device(&mut g, long, &[4], 0);
    let big = typed::Full.encode(layout::Creation {
        dtype: long,
        sizes: &[4],
    });
    // `ones` fills with the float 1.0: a whole float is followed, a fraction is not.
    g.capture(
        big.op,
        &[],
        &[ScalarArg::float(1.5)],
        &big.params,
        std::slice::from_ref(&filled),
    )
    .unwrap();
    assert_eq!(g.known_elements(&filled), None);
    g.capture(
        big.op,
        &[],
        &[ScalarArg::float(300.0)],
        &big.params,
        std::slice::from_ref(&filled),
    )
    .unwrap();
    let to_byte = typed::Convert.encode(layout::ConvertTo { dtype: DType::U8 });
    let cast = g
        .capture(to_byte.op, &[filled], &[], &to_byte.params, &[])
        .unwrap();
    let cast = TensorRef::contiguous(cast.outputs[0].0, DType::U8, &[4]);
    assert_eq!(g.known_elements(&cast), Some(vec![44; 4]));

    // `arange`, and a fill the direct path runs.
    let range = typed::Arange.encode(layout::ArangeRange {
        dtype: long,
        start: 3.0,
        end: -3.0,
        step: -2.0,
    });
    let made = g.capture(range.op, &[], &[], &range.params, &[]).unwrap();
    let made = TensorRef::contiguous(made.outputs[0].0, long, &[3]);
    assert_eq!(g.known_elements(&made), Some(vec![3, 1, -1]));
    g.flush(FlushRequest::All, |_| 1).unwrap();
    let ones = typed::Ones.encode(layout::Creation {
        dtype: long,
        sizes: &[3],
    });
    let ran = g
        .run_if_compiled(
            OpCall {
                op: ones.op,
                inputs: &[],
                scalars: &[],
                params: &ones.params,
                outs: &[],
            },
            |_| 2,
            |_, _, _| true,
        )
        .unwrap()
        .expect("a program for the key");
    let ones = TensorRef::contiguous(ran.0.outputs[0].0, long, &[3]);
    assert_eq!(g.known_elements(&ones), Some(vec![1, 1, 1]));

    // A write the host does not follow leaves the values unknown.
    g.capture(
        OpId::Neg,
        std::slice::from_ref(&t),
        &[],
        &[],
        std::slice::from_ref(&t),
    )
    .unwrap();
    assert_eq!(g.known_elements(&t), None);
    assert_eq!(g.known_elements(&copy), Some(vec![1, 2, 3, 10]));
    // So does a fill through a view of a storage whose other elements are unknown.
    g.capture(
        fill.op,
        &[],
        &[ScalarArg::int(0)],
        &fill.params,
        std::slice::from_ref(&corner),
    )
    .unwrap();
    assert_eq!(g.known_elements(&t), None);
    // Large tensors are not followed.
    let large = device(&mut g, long, &[5000], 0);
    g.note_uploaded(&large, &bytes(&[0; 5000]));
    assert_eq!(g.known_elements(&large), None);
}

/// Captures `fill(value)` into a fresh `[sizes]` float storage and returns it.
fn pending_fill(g: &mut Graph<u32>, sizes: &[i64], value: f64) -> TensorRef {
    let n: i64 = sizes.iter().product();
    let s = g.new_storage(n as u64 * 4);
    let t = TensorRef::contiguous(s, DType::F32, sizes);
    let params: SmallVec<[i64; 4]> = std::iter::once(ops::dtype_param(Some(DType::F32)))
        .chain(sizes.iter().copied())
        .collect();
    g.capture(
        OpId::Full,
        &[],
        &[ScalarArg::float(value)],
        &params,
        std::slice::from_ref(&t),
    )
    .unwrap();
    t
}

#[test]
fn a_prologue_is_pending_ops_that_make_only_graph_inputs() {
    let mut g: Graph<u32> = Graph::new();
    let x = device(&mut g, DType::F32, &[4], 1);
    let seed = pending_fill(&mut g, &[], 1.0);
    let inputs = [x.storage, seed.storage];
    let p = g
        .pending_prologue(&inputs)
        .expect("a fill held by an input");
    assert_eq!(p.held_inputs().collect::<Vec<_>>(), vec![1]);
    assert_eq!(p.scalars().len(), 1);
    // Not when the value is held by a storage outside the graph's inputs.
    assert!(g.pending_prologue(&[x.storage]).is_none());
    // The same ops pending again, with another value, are the same prologue.
    g.release_storage(seed.storage).unwrap();
    assert!(g.drop_unheld_pending(), "nothing holds the fill: dropped");
    assert_eq!(g.pending_len(), 0);
    let seed = pending_fill(&mut g, &[], 2.0);
    let again = g.pending_prologue(&[x.storage, seed.storage]).unwrap();
    assert!(again.same_ops(&p));
    assert_ne!(again.scalars()[0].0, p.scalars()[0].0);
    // Another size is another prologue.
    g.release_storage(seed.storage).unwrap();
    g.drop_unheld_pending();
    let wide = pending_fill(&mut g, &[3], 1.0);
    assert!(!g
        .pending_prologue(&[x.storage, wide.storage])
        .unwrap()
        .same_ops(&p));
    // Held values are not dropped.
    assert!(!g.drop_unheld_pending());
    // An op that reads a device value is no prologue: its argument would be the caller's.
    let neg = g
        .capture(OpId::Neg, std::slice::from_ref(&x), &[], &[], &[])
        .unwrap();
    assert!(g
        .pending_prologue(&[x.storage, wide.storage, neg.outputs[0].0])
        .is_none());
}

#[test]
fn a_one_long_first_entry_is_padded_from_its_first_append() {
    let mut g: Graph<u32> = Graph::new();
    let empty = device(&mut g, DType::F32, &[0], 0);
    let x = device(&mut g, DType::F32, &[1, 2, 1, 4], 1);
    let captured = g.capture(OpId::Cat, &[empty, x], &[], &[-2], &[]).unwrap();
    let (storage, ty) = captured.outputs[0].clone();
    // One element has no extent to pad: the entry stays exact.
    assert!(!g.is_padded(storage));
    let cache = TensorRef::contiguous(storage, ty.dtype, &ty.shape);
    g.flush(FlushRequest::All, |_| 7).unwrap();
    let new = device(&mut g, DType::F32, &[1, 2, 1, 4], 2);
    let captured = g.capture(OpId::Cat, &[cache, new], &[], &[2], &[]).unwrap();
    let (storage, ty) = captured.outputs[0].clone();
    assert_eq!(ty.shape.as_slice(), &[1, 2, 2, 4]);
    assert!(g.is_padded(storage), "the first append starts the padding");
}

#[test]
fn ops_that_only_make_values_could_be_a_prologue_and_ops_reading_device_values_could_not() {
    let mut g: Graph<u32> = Graph::new();
    let x = device(&mut g, DType::F32, &[2], 0);
    assert!(!g.pending_could_be_prologue(), "nothing pending");
    assert!(g.reads_device_value(std::slice::from_ref(&x)));
    let seed = pending_fill(&mut g, &[], 1.0);
    assert!(
        !g.reads_device_value(std::slice::from_ref(&seed)),
        "a pending value is not on the device yet"
    );
    assert!(g.pending_could_be_prologue());
    let doubled = g
        .capture(OpId::Add, &[seed.clone(), seed], &[], &[], &[])
        .unwrap();
    assert!(
        g.pending_could_be_prologue(),
        "an op on pending values only still makes values"
    );
    let (storage, ty) = doubled.outputs[0].clone();
    let doubled = TensorRef::contiguous(storage, ty.dtype, &ty.shape);
    g.capture(OpId::Add, &[doubled, x], &[], &[], &[]).unwrap();
    assert!(!g.pending_could_be_prologue(), "an op read a device value");
}

#[test]
fn storages_and_regions_stay_on_the_device_their_ops_run_on() {
    let mut g: Graph<u32> = Graph::new();
    g.set_device(2).unwrap();
    let x = device(&mut g, DType::F32, &[4], 1);
    assert_eq!(g.storage_device(x.storage).unwrap(), 2);
    let elsewhere = g.new_storage_on(16, 1);
    assert_eq!(g.storage_device(elsewhere).unwrap(), 1);
    let other = TensorRef::contiguous(elsewhere, DType::F32, &[4]);
    assert_eq!(g.other_device(std::slice::from_ref(&x), 2).unwrap(), None);
    assert_eq!(g.other_device(&[x.clone(), other], 2).unwrap(), Some(1));
    let neg = g
        .capture(OpId::Neg, std::slice::from_ref(&x), &[], &[], &[])
        .unwrap();
    // An op's result is on the device it ran on.
    assert_eq!(g.storage_device(neg.outputs[0].0).unwrap(), 2);
    // Another device's ops wait until the pending ones are launched.
    assert!(g.set_device(0).is_err());
    let flush = g
        .flush(FlushRequest::All, |_| 9)
        .unwrap()
        .expect("a region");
    assert_eq!(flush.device, 2);
    g.set_device(0).unwrap();
    let made = g.new_storage(16);
    assert_eq!(g.storage_device(made).unwrap(), 0);
}
