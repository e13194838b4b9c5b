//! Capture on padded values (bounded shapes, RFC 0029): appends that start or continue a
//! growing sequence, ops run at the bucket's size by `ops::padding`'s plans, and the cut back
//! to true sizes for every reader that needs exact values.

use super::*;
use crate::bucket::{PaddedView, Padding};
use fuse::{AppendOp, PaddedOp};
use ops::padding::{self, PaddedDims};
use ops::{Params, TypedOp};

impl<V: Clone> Graph<V> {
    pub(super) fn is_padded(&self, id: StorageId) -> bool {
        self.storages.get(&id).is_some_and(|s| s.padding.is_some())
    }

    fn padding_of(&self, id: StorageId) -> Option<Arc<Padding>> {
        self.storages.get(&id).and_then(|s| s.padding.clone())
    }

    /// Gives storage `id` its exact value (no padding) for a reader outside capture, as a
    /// host read, that needs the true elements laid out as PyTorch sees them.
    pub fn make_exact(&mut self, id: StorageId) -> Result<(), EngineError> {
        self.unpad(id)
    }

    /// Replaces a padded storage's value by its true elements (a slice per padded dimension),
    /// for a reader that needs the exact value.
    pub(super) fn unpad(&mut self, id: StorageId) -> Result<(), EngineError> {
        if let Some(out) = self.exact_value(id)? {
            self.write_pending(id, out);
        }
        Ok(())
    }

    /// A new storage holding padded storage `id`'s true elements, for one reader that needs
    /// them exact; `id` itself stays padded for its other readers. The caller releases it.
    fn exact_copy(&mut self, id: StorageId) -> Result<Option<StorageId>, EngineError> {
        let Some(out) = self.exact_value(id)? else {
            return Ok(None);
        };
        let storage = self.storage(id)?;
        let (nbytes, native) = (storage.nbytes, storage.native);
        let native = native
            .ok_or_else(|| EngineError::runtime("internal error: a padded storage has no dtype"))?;
        Ok(Some(self.new_pending_storage(nbytes, native, out)))
    }

    /// Pushes the nodes that cut padded storage `id`'s value back to its true elements (a
    /// slice per padded dimension); their result. `None` when `id` is not padded.
    fn exact_value(&mut self, id: StorageId) -> Result<Option<NodeOutput>, EngineError> {
        let Some(padding) = self.padding_of(id) else {
            return Ok(None);
        };
        let native = self
            .storage(id)?
            .native
            .ok_or_else(|| EngineError::runtime("internal error: a padded storage has no dtype"))?;
        let mut input = self.read_whole_padded(id, native, &padding)?;
        let mut ty = TensorType::new(native, &padding.padded_sizes());
        let mut last = None;
        for &d in &padding.dims {
            let slice = typed::Slice.encode(layout::SliceRange {
                dim: d as i64,
                start: 0,
                end: padding.sizes[d],
                step: 1,
            });
            let meta = ops::meta(slice.op, std::slice::from_ref(&ty), &[], &slice.params)?;
            ty = meta.outputs[0].clone();
            let node = self.push_node(
                RegionOp::Aten(slice.op),
                &slice.params,
                &[],
                meta,
                SmallVec::from_elem(input, 1),
            );
            input = NodeInput::plain(ValueRef::Pending(node.output(0)));
            last = Some(node.output(0));
        }
        self.stats.unpadded_values += 1;
        Ok(last)
    }

    /// The node input reading padded storage `id`'s whole padded value (of dtype `native`).
    fn read_whole_padded(
        &mut self,
        id: StorageId,
        native: DType,
        padding: &Padding,
    ) -> Result<NodeInput, EngineError> {
        let whole = TensorRef::contiguous(id, native, &padding.padded_sizes());
        let placement = Placement {
            native,
            base_len: padding.padded_numel(),
            whole: true,
            padded: false,
        };
        self.read_for_node(&whole, &placement)
    }

    /// Every padded storage `inputs` and `outs` touch, cut back to its true elements.
    fn unpad_all(&mut self, inputs: &[TensorRef], outs: &[TensorRef]) -> Result<(), EngineError> {
        for t in inputs.iter().chain(outs) {
            self.unpad(t.storage)?;
        }
        Ok(())
    }

    /// The node input reading `t` (a view PyTorch took of a padded storage) as a view of the
    /// padded value, and the view's padded dimensions; `None` when the view is not one
    /// (`bucket::Padding::translate`).
    fn read_padded(
        &mut self,
        t: &TensorRef,
        padding: &Padding,
        native: DType,
    ) -> Result<Option<(NodeInput, PaddedDims)>, EngineError> {
        if t.dtype != native {
            return Ok(None);
        }
        let Some(PaddedView {
            sizes,
            strides,
            offset,
            dims,
            ..
        }) = padding.translate(&t.sizes, &t.strides, t.offset)
        else {
            return Ok(None);
        };
        let view = TensorRef {
            storage: t.storage,
            dtype: t.dtype,
            sizes,
            strides,
            offset,
        };
        let base_len = padding.padded_numel();
        let whole = offset == 0 && view.contiguous_numel() == Some(base_len);
        let placement = Placement {
            native,
            base_len,
            whole,
            padded: false,
        };
        Ok(Some((self.read_for_node(&view, &placement)?, dims)))
    }

    /// Captures `op` when one of its tensors is padded: at the bucket's size when the op's
    /// plan allows and every padded input is read as a view of its padded value; otherwise on
    /// the true values, cut back first. `types` are the inputs' true types (meta ran on them).
    pub(super) fn capture_padded(
        &mut self,
        op: OpId,
        inputs: &[TensorRef],
        scalars: &[ScalarArg],
        params: &[i64],
        outs: &[TensorRef],
        types: &[TensorType],
    ) -> Result<Captured, EngineError> {
        // `cat` skips 1-d empty inputs (PyTorch's legacy rule): a cache that starts as
        // `torch.tensor([])` and takes a padded first entry is that entry, still padded.
        if op == OpId::Cat && inputs.iter().any(|t| t.sizes.as_slice() == [0]) {
            let kept: SmallVec<[TensorRef; 3]> = inputs
                .iter()
                .filter(|t| t.sizes.as_slice() != [0])
                .cloned()
                .collect();
            let same_dtype = inputs
                .iter()
                .all(|t| kept.first().is_some_and(|k| k.dtype == t.dtype));
            if let ([only], true) = (kept.as_slice(), same_dtype) {
                let ty = only.ty();
                return self.capture_padded(
                    OpId::Clone,
                    std::slice::from_ref(only),
                    &[],
                    &[],
                    outs,
                    std::slice::from_ref(&ty),
                );
            }
        }
        if outs.len() <= 1 && self.bounded {
            if let Some(captured) = self.try_padded(op, inputs, scalars, params, outs, types)? {
                self.stats.captured_ops += 1;
                self.stats.padded_ops += 1;
                return Ok(captured);
            }
        }
        // A sequence (a cache) that the op reads but does not write is read through an exact
        // copy made for this op: it stays padded for its next append (a cache's first entry
        // read by a prefill's causal attention stays padded for the first decoding step, so
        // that step runs the program of the steps after it). Other padded values, and what
        // the op writes, are cut back in place once.
        let mut exact_inputs: SmallVec<[TensorRef; 3]> = SmallVec::new();
        let mut copies: SmallVec<[(StorageId, StorageId); 2]> = SmallVec::new();
        for t in inputs {
            let mut t = t.clone();
            if self.is_padded(t.storage)
                && self.growth.is_sequence(t.storage)
                && !outs.iter().any(|o| o.storage == t.storage)
            {
                let copy = match copies.iter().find(|(from, _)| *from == t.storage) {
                    Some(&(_, copy)) => Some(copy),
                    None => {
                        let copy = self.exact_copy(t.storage)?;
                        if let Some(copy) = copy {
                            copies.push((t.storage, copy));
                        }
                        copy
                    }
                };
                if let Some(copy) = copy {
                    t.storage = copy;
                }
            }
            exact_inputs.push(t);
        }
        let captured = self
            .unpad_all(&exact_inputs, outs)
            .and_then(|()| self.capture_op(op, &exact_inputs, scalars, params, outs));
        for (_, copy) in copies {
            self.release_storage(copy)?;
        }
        captured
    }

    fn try_padded(
        &mut self,
        op: OpId,
        inputs: &[TensorRef],
        scalars: &[ScalarArg],
        params: &[i64],
        outs: &[TensorRef],
        types: &[TensorType],
    ) -> Result<Option<Captured>, EngineError> {
        let out = outs.first();
        if let Some(out) = out {
            if self.padding_of(out.storage).is_some() && !self.is_whole_out(out)? {
                return self.write_into_padded_view(op, inputs, scalars, params, out);
            }
            // An in-place op (or `out=`, as `_to_copy` into a fresh tensor) writing every
            // element of its storage: its result is the storage's new value, padded. Other
            // views of the same storage are capture's to check.
            if inputs.iter().any(|t| t.storage == out.storage && t != out) {
                return Ok(None);
            }
            if !self.is_whole_out(out)? {
                return self
                    .write_padded_into_fresh_window(op, inputs, scalars, params, out, types);
            }
        }
        // The padded inputs' paddings, and the one extent (length and bucket) they share.
        let mut paddings: SmallVec<[Option<Arc<Padding>>; 3]> = SmallVec::new();
        let mut bucket = None;
        let mut extent = None;
        for t in inputs {
            let p = self.padding_of(t.storage);
            if let Some(p) = &p {
                if extent.is_some_and(|e| e != (p.true_len(), p.bucket)) {
                    return Ok(None);
                }
                extent = Some((p.true_len(), p.bucket));
                bucket = Some(p.bucket);
            }
            paddings.push(p);
        }
        let Some(bucket) = bucket else {
            return Ok(None);
        };
        // Views first: a view that is not one of the padded value leaves nothing captured.
        let mut views: SmallVec<[Option<PaddedView>; 3]> = SmallVec::new();
        for (t, p) in inputs.iter().zip(&paddings) {
            views.push(match p {
                Some(p) => match p.translate(&t.sizes, &t.strides, t.offset) {
                    Some(v) if t.dtype == self.storage(t.storage)?.native.unwrap_or(t.dtype) => {
                        Some(v)
                    }
                    _ => return Ok(None),
                },
                None => None,
            });
        }
        let dims: SmallVec<[PaddedDims; 3]> = views
            .iter()
            .map(|v| v.as_ref().map(|v| v.dims.clone()).unwrap_or_default())
            .collect();
        let merged = views.iter().flatten().any(|v| v.merged);
        if op == OpId::Cat && inputs.len() == 2 && dims[1].is_empty() && !merged {
            let dim = cat_dim(params, types[0].shape.len().max(1));
            if let Some(dim) = dim.filter(|&d| dims[0].as_slice() == [d]) {
                return self.append(inputs, types, dim, true);
            }
        }
        if dims.iter().all(|d| d.is_empty()) {
            // Every padded input is read at true positions only (`hidden[:, 0]`): the op runs
            // exact on views of the padded values.
            return self.exact_on_padded_views(op, inputs, scalars, params, out);
        }
        let len = paddings
            .iter()
            .flatten()
            .map(|p| p.true_len())
            .next()
            .expect("a padded input");
        let mut dims = dims;
        let Some(widened) =
            self.widen_exact_operands(op, inputs, &views, &mut dims, len, bucket)?
        else {
            return Ok(None);
        };
        let Some(plan) = padding::plan_at(op, types, &dims, bucket, len, scalars, params)? else {
            return Ok(None);
        };
        if let Some(out) = out {
            let produced = &plan.true_outputs;
            if produced.len() != 1
                || produced[0].dtype != out.dtype
                || produced[0].shape != out.sizes
            {
                return Ok(None);
            }
        }
        let Some(node_inputs) = self.read_operands(op, inputs, &widened, false)? else {
            return Ok(None);
        };
        Ok(Some(self.push_padded(
            op,
            plan,
            node_inputs,
            len,
            scalars,
            params,
            out,
        )))
    }

    /// `op` on padded inputs written into `out`, a contiguous window of a storage nothing has
    /// written yet (a growing sequence's new capacity buffer taking its padded first part:
    /// `buffer[:n].copy_(ids)`). Past the window the storage holds no value, so the whole
    /// bucket is written there: the true elements land in the window and the padding after
    /// them, and the program knows the bucket, not the length. `None` when the result is not
    /// padded as one run, or the bucket does not fit.
    fn write_padded_into_fresh_window(
        &mut self,
        op: OpId,
        inputs: &[TensorRef],
        scalars: &[ScalarArg],
        params: &[i64],
        out: &TensorRef,
        types: &[TensorType],
    ) -> Result<Option<Captured>, EngineError> {
        let fresh = matches!(self.storage(out.storage)?.value, StorageValue::Uninit);
        let numel = out.numel();
        if !fresh || self.is_padded(out.storage) || out.contiguous_numel() != Some(numel) {
            return Ok(None);
        }
        let placement = self.placement(&"an output", out)?;
        if placement.native != out.dtype {
            return Ok(None);
        }
        // A run: every dimension before the padded one is a unit, so the true elements are
        // the first ones of the padded value.
        let fits = |p: &Padding| {
            matches!(p.dims.as_slice(), [d] if p.sizes[..*d].iter().all(|&s| s == 1))
                && p.sizes.iter().product::<i64>() == numel
                && out.offset + p.padded_numel() <= placement.base_len
        };
        let meta = ops::meta(op, types, scalars, params)?;
        let [ty] = meta.outputs.as_slice() else {
            return Ok(None);
        };
        if ty.dtype != out.dtype || ty.shape.iter().product::<i64>() != numel {
            return Ok(None);
        }
        let Some(captured) = self.try_padded(op, inputs, scalars, params, &[], types)? else {
            return Ok(None);
        };
        let result = captured.outputs[0].0;
        let padding = match self.padding_of(result) {
            Some(p) if fits(&p) => p,
            _ => {
                // Exact after all, or padded otherwise: the caller captures the op on exact
                // values; nothing reads the node made here.
                self.release_storage(result)?;
                return Ok(None);
            }
        };
        let padded_numel = padding.padded_numel();
        let value = self.read_whole_padded(result, out.dtype, &padding)?;
        let reshape = typed::Reshape.encode(layout::Sizes {
            sizes: &[padded_numel],
        });
        let flat = ops::meta(
            reshape.op,
            &[TensorType::new(out.dtype, &padding.padded_sizes())],
            &[],
            &reshape.params,
        )?;
        let node = self.push_node(
            RegionOp::Aten(reshape.op),
            &reshape.params,
            &[],
            flat,
            SmallVec::from_elem(value, 1),
        );
        let target = TensorRef {
            storage: out.storage,
            dtype: out.dtype,
            sizes: Shape::from_slice(&[padded_numel]),
            strides: SmallVec::from_slice(&[1]),
            offset: out.offset,
        };
        self.write_through_view(&target, &placement, node.output(0))?;
        self.release_storage(result)?;
        let mut outputs = CapturedOutputs::new();
        outputs.push((out.storage, out.ty()));
        Ok(Some(Captured { outputs }))
    }

    /// `op` written through `out`, a view of a padded storage that reaches true positions only
    /// (`grad_input.select(1, 0).copy_(grad)`, as `select_backward` writes a gradient into
    /// zeros made padded): the op runs exact and its result is written into the padded value,
    /// which stays padded. `None` for any other view (the caller cuts the padding off).
    fn write_into_padded_view(
        &mut self,
        op: OpId,
        inputs: &[TensorRef],
        scalars: &[ScalarArg],
        params: &[i64],
        out: &TensorRef,
    ) -> Result<Option<Captured>, EngineError> {
        let Some(padding) = self.padding_of(out.storage) else {
            return Ok(None);
        };
        let native = self.storage(out.storage)?.native.unwrap_or(out.dtype);
        let Some(view) = padding.translate(&out.sizes, &out.strides, out.offset) else {
            return Ok(None);
        };
        if !view.dims.is_empty()
            || out.dtype != native
            || out.numel() == 0
            || inputs.iter().any(|t| t.storage == out.storage)
        {
            return Ok(None);
        }
        let types: SmallVec<[TensorType; 3]> = inputs.iter().map(|t| t.ty()).collect();
        let meta = ops::meta(op, &types, scalars, params)?;
        if meta.outputs.len() != 1
            || meta.outputs[0].dtype != out.dtype
            || meta.outputs[0].shape != out.sizes
        {
            return Ok(None);
        }
        let Some(node_inputs) = self.read_operands(op, inputs, &[], true)? else {
            return Ok(None);
        };
        let id = self.push_node(RegionOp::Aten(op), params, scalars, meta, node_inputs);
        let target = TensorRef {
            storage: out.storage,
            dtype: out.dtype,
            sizes: view.sizes,
            strides: view.strides,
            offset: view.offset,
        };
        let placement = Placement {
            native,
            base_len: padding.padded_numel(),
            whole: false,
            padded: false,
        };
        self.write_through_view(&target, &placement, id.output(0))?;
        // The write keeps the storage's padding: only true positions changed.
        self.set_padding(out.storage, (*padding).clone());
        self.stats.captured_ops += 1;
        self.stats.padded_ops += 1;
        let mut outputs = CapturedOutputs::new();
        outputs.push((out.storage, out.ty()));
        Ok(Some(Captured { outputs }))
    }

    /// `op` captured exact, its padded inputs read through views of their padded values that
    /// reach no padding; a fresh result only (an `out=` into a padded storage is capture's).
    fn exact_on_padded_views(
        &mut self,
        op: OpId,
        inputs: &[TensorRef],
        scalars: &[ScalarArg],
        params: &[i64],
        out: Option<&TensorRef>,
    ) -> Result<Option<Captured>, EngineError> {
        if out.is_some() {
            return Ok(None);
        }
        let types: SmallVec<[TensorType; 3]> = inputs.iter().map(|t| t.ty()).collect();
        let meta = ops::meta(op, &types, scalars, params)?;
        let Some(node_inputs) = self.read_operands(op, inputs, &[], true)? else {
            return Ok(None);
        };
        let true_outputs = meta.outputs.clone();
        let id = self.push_node(RegionOp::Aten(op), params, scalars, meta, node_inputs);
        let mut outputs = CapturedOutputs::new();
        for (i, ty) in true_outputs.into_iter().enumerate() {
            let storage = self.place_output(None, &ty, id.output(i as u32), None);
            outputs.push((storage, ty));
        }
        Ok(Some(Captured { outputs }))
    }

    /// The padded node of `op` by `plan` on `node_inputs`, its outputs placed (in `out` when
    /// given) with their paddings.
    #[allow(clippy::too_many_arguments)]
    fn push_padded(
        &mut self,
        op: OpId,
        plan: padding::PaddedPlan,
        node_inputs: SmallVec<[NodeInput; 3]>,
        len: i64,
        scalars: &[ScalarArg],
        params: &[i64],
        out: Option<&TensorRef>,
    ) -> Captured {
        let bucket = plan.bucket;
        let mut meta = plan.meta.clone();
        meta.scalar_dtypes.push(DType::I64);
        let mut node_scalars: SmallVec<[ScalarArg; 3]> = SmallVec::from_slice(scalars);
        node_scalars.push(ScalarArg::int(len));
        let true_outputs = plan.true_outputs.clone();
        let output_dims = plan.outputs.clone();
        let padded_outputs = plan.meta.outputs.clone();
        let id = self.push_node(
            RegionOp::Padded(Arc::new(PaddedOp { op, plan })),
            params,
            &node_scalars,
            meta,
            node_inputs,
        );
        let mut outputs = CapturedOutputs::new();
        for (i, (ty, dims)) in true_outputs.into_iter().zip(output_dims).enumerate() {
            let padding = (!dims.is_empty())
                .then(|| output_padding(&ty.shape, &padded_outputs[i].shape, &dims, bucket));
            let storage = self.place_output(out, &ty, id.output(i as u32), padding);
            outputs.push((storage, ty));
        }
        Captured { outputs }
    }

    /// Whether `window_padded` may read op `op`'s windowed operands at a growing value's bucket:
    /// the gathers, while bounded shapes have seen a padded extent. Strict's direct path leaves
    /// such calls to capture.
    pub(super) fn may_read_windows_at_bucket(&self, op: OpId) -> bool {
        self.bounded
            && self.last_extent.is_some()
            && matches!(
                op,
                OpId::Embedding | OpId::Gather | OpId::Index | OpId::IndexSelect | OpId::IndexCheck
            )
    }

    /// An indexing op (`embedding`, `gather`, `index`, `index_select`, the engine's check of
    /// indices) none of whose inputs is
    /// padded, reading a window of a longer buffer at the length of the latest padded
    /// sequence or batch (`position_ids[:, :length]`, a registered buffer sliced to the
    /// batch's length): the window is read at the bucket's size, as a padded input, so the
    /// result is padded and combines with the batch's values without cutting their padding
    /// off. `None`: capture it exact.
    pub(super) fn window_padded(
        &mut self,
        op: OpId,
        inputs: &[TensorRef],
        scalars: &[ScalarArg],
        params: &[i64],
        types: &[TensorType],
    ) -> Result<Option<Captured>, EngineError> {
        if !self.may_read_windows_at_bucket(op) {
            return Ok(None);
        }
        let Some((len, bucket)) = self.last_extent else {
            return Ok(None);
        };
        let mut dims: SmallVec<[PaddedDims; 3]> = SmallVec::new();
        let mut reads: SmallVec<[TensorRef; 3]> = SmallVec::new();
        for t in inputs {
            let (wide, wide_dims) = self
                .window_at_bucket(t, len, bucket)?
                .unwrap_or_else(|| (t.clone(), PaddedDims::new()));
            dims.push(wide_dims);
            reads.push(wide);
        }
        if dims.iter().all(|d| d.is_empty()) {
            return Ok(None);
        }
        let Some(plan) = padding::plan_at(op, types, &dims, bucket, len, scalars, params)? else {
            return Ok(None);
        };
        // A check's verdict is exact; it is read padded so that its program is the bucket's.
        if op != OpId::IndexCheck && plan.outputs.iter().all(|d| d.is_empty()) {
            return Ok(None);
        }
        let mut node_inputs: SmallVec<[NodeInput; 3]> = SmallVec::new();
        for (i, t) in reads.iter().enumerate() {
            let placement = self.placement(&OperandName(op, "input", i), t)?;
            node_inputs.push(self.read_for_node(t, &placement)?);
        }
        self.stats.captured_ops += 1;
        self.stats.padded_ops += 1;
        Ok(Some(self.push_padded(
            op,
            plan,
            node_inputs,
            len,
            scalars,
            params,
            None,
        )))
    }

    /// The exact operands of elementwise op `op` that meet a padded operand's extent (the same
    /// output dimension, the true length `len`) read at the bucket's size instead, as views of
    /// their own storage: an expanded gradient (stride 0) or a window of a longer buffer whose
    /// storage holds the wider read. Their elements past `len` are read but never used, like
    /// any padding. Fills `dims` for them; `None` when one cannot be read wider (the caller
    /// then cuts the padding off instead).
    #[allow(clippy::type_complexity)]
    fn widen_exact_operands(
        &mut self,
        op: OpId,
        inputs: &[TensorRef],
        views: &[Option<PaddedView>],
        dims: &mut SmallVec<[PaddedDims; 3]>,
        len: i64,
        bucket: i64,
    ) -> Result<Option<SmallVec<[Option<TensorRef>; 3]>>, EngineError> {
        let mut widened: SmallVec<[Option<TensorRef>; 3]> = SmallVec::from_elem(None, inputs.len());
        if views.iter().flatten().any(|v| v.merged) {
            return Ok(Some(widened));
        }
        if is_indexing(op) {
            // Indices that are a window of a longer buffer at the extent's length (the
            // positions of a padded batch) are read at the bucket's size, as `window_padded`.
            for (i, t) in inputs.iter().enumerate() {
                if views[i].is_some() {
                    continue;
                }
                if let Some((wide, wide_dims)) = self.window_at_bucket(t, len, bucket)? {
                    dims[i] = wide_dims;
                    widened[i] = Some(wide);
                }
            }
            return Ok(Some(widened));
        }
        if !op.is_pointwise() {
            return Ok(Some(widened));
        }
        // Broadcasting aligns dimensions from the right.
        let rank = inputs.iter().map(|t| t.sizes.len()).max().unwrap_or(0);
        let mut extent: SmallVec<[usize; 2]> = SmallVec::new();
        for (t, v) in inputs.iter().zip(views) {
            for &d in v.iter().flat_map(|v| &v.dims) {
                let at = d + rank - t.sizes.len();
                if !extent.contains(&at) {
                    extent.push(at);
                }
            }
        }
        for (i, t) in inputs.iter().enumerate() {
            if views[i].is_some() {
                continue;
            }
            let shift = rank - t.sizes.len();
            let mut wide = t.clone();
            let mut wide_dims = PaddedDims::new();
            for &at in &extent {
                if at >= shift && t.sizes[at - shift] == len {
                    wide.sizes[at - shift] = bucket;
                    wide_dims.push(at - shift);
                }
            }
            if wide_dims.is_empty() {
                continue;
            }
            if !self.holds_view(&wide)? {
                return Ok(None);
            }
            dims[i] = wide_dims;
            widened[i] = Some(wide);
        }
        Ok(Some(widened))
    }

    /// The node inputs reading `inputs`: padded storages through views of their padded values
    /// (only views that reach no padding when `true_positions_only`), others as they are or,
    /// where `widened` has one, at the bucket's size. `None` when a padded storage's view is
    /// not one of its padded value.
    fn read_operands(
        &mut self,
        op: OpId,
        inputs: &[TensorRef],
        widened: &[Option<TensorRef>],
        true_positions_only: bool,
    ) -> Result<Option<SmallVec<[NodeInput; 3]>>, EngineError> {
        let mut node_inputs: SmallVec<[NodeInput; 3]> = SmallVec::new();
        for (i, t) in inputs.iter().enumerate() {
            let input = match self.padding_of(t.storage) {
                Some(padding) => {
                    let native = self.storage(t.storage)?.native.unwrap_or(t.dtype);
                    match self.read_padded(t, &padding, native)? {
                        Some((input, dims)) if !true_positions_only || dims.is_empty() => input,
                        _ => return Ok(None),
                    }
                }
                None => {
                    let t = widened.get(i).and_then(Option::as_ref).unwrap_or(t);
                    let placement = self.placement(&OperandName(op, "input", i), t)?;
                    self.read_for_node(t, &placement)?
                }
            };
            node_inputs.push(input);
        }
        Ok(Some(node_inputs))
    }

    /// Exact view `t` read at the bucket's size along every dimension of the extent's length
    /// `len`, and those dimensions, when it is a window of a longer storage that holds the
    /// wider read (`position_ids[:, :length]` of a registered buffer).
    fn window_at_bucket(
        &mut self,
        t: &TensorRef,
        len: i64,
        bucket: i64,
    ) -> Result<Option<(TensorRef, PaddedDims)>, EngineError> {
        let dims: PaddedDims = (0..t.sizes.len()).filter(|&d| t.sizes[d] == len).collect();
        if dims.is_empty() || self.placement(&"a window", t)?.whole {
            return Ok(None);
        }
        let mut wide = t.clone();
        for &d in &dims {
            wide.sizes[d] = bucket;
        }
        Ok(self.holds_view(&wide)?.then_some((wide, dims)))
    }

    /// Whether view `t` reads only elements of its storage, in the storage's native dtype.
    fn holds_view(&self, t: &TensorRef) -> Result<bool, EngineError> {
        let storage = self.storage(t.storage)?;
        if storage.native.is_some_and(|n| n != t.dtype) || storage.padding.is_some() {
            return Ok(false);
        }
        if t.strides.iter().any(|&s| s < 0) || t.offset < 0 {
            return Ok(false);
        }
        let last = t.offset
            + t.sizes
                .iter()
                .zip(&t.strides)
                .map(|(&n, &s)| (n - 1).max(0) * s)
                .sum::<i64>();
        Ok((last + 1) * t.dtype.size_bytes() as i64 <= storage.nbytes as i64)
    }

    /// Whether `out` is every element of its storage, contiguous from offset 0 in its dtype:
    /// of the true tensor, in any shape of it that is a view of the padded value, when the
    /// storage is padded.
    fn is_whole_out(&mut self, out: &TensorRef) -> Result<bool, EngineError> {
        match self.padding_of(out.storage) {
            Some(p) => {
                let numel: i64 = p.sizes.iter().product();
                Ok(out.contiguous_numel() == Some(numel)
                    && self.storage(out.storage)?.native == Some(out.dtype)
                    && p.translate(&out.sizes, &out.strides, out.offset).is_some())
            }
            None => Ok(self.placement(&"an output", out)?.whole),
        }
    }

    /// Installs `value` (of true type `ty`) in `out`'s storage, or in a new storage, with its
    /// padding; returns the storage.
    fn place_output(
        &mut self,
        out: Option<&TensorRef>,
        ty: &TensorType,
        value: NodeOutput,
        padding: Option<Padding>,
    ) -> StorageId {
        let storage = match out {
            Some(out) => {
                self.write_pending(out.storage, value);
                out.storage
            }
            None => self.new_pending_storage(ty.nbytes(), ty.dtype, value),
        };
        if let Some(padding) = padding {
            self.set_padding(storage, padding);
        }
        storage
    }

    fn set_padding(&mut self, storage: StorageId, padding: Padding) {
        if let Some(s) = self.storages.get_mut(&storage) {
            s.padding = Some(Arc::new(padding));
        }
    }

    /// Whether `cat([a, b], dim)` of exact values of `types` (with `a` whole) continues a
    /// sequence seen growing; records the append either way. Both capture and Strict's direct
    /// path ask, so a warm append still counts as the sequence's step.
    pub(super) fn continues_growth(
        &mut self,
        a_storage: StorageId,
        types: &[TensorType],
        params: &[i64],
    ) -> Option<usize> {
        let (a, b) = (&types[0], &types[1]);
        let rank = a.shape.len();
        if rank == 0 || b.shape.len() != rank || a.dtype != b.dtype {
            return None;
        }
        let dim = cat_dim(params, rank)?;
        let (a_len, b_len) = (a.shape[dim], b.shape[dim]);
        // A first entry of one element (an encoder-decoder's decoder starts from one token)
        // is too short to be padded itself (`first_entry_dim`); its first append starts the
        // padding instead, so the second decoding step already runs the bucket's program.
        let one_long_first = a_len == 1 && b_len == 1 && self.growth.is_first_entry(a_storage);
        if (a_len < 2 && !one_long_first) || b_len < 1 || b_len > a_len {
            return None;
        }
        self.growth
            .note_append(a.dtype, a_storage, &a.shape, dim, b_len)
            .then_some(dim)
    }

    /// The dimension along which `cat([torch.tensor([]), x], dim)` (of `types`) starts a
    /// sequence, when its result is to be made padded at once (`first_entry`): a sequence
    /// that starts empty and is appended to is a dynamic cache's, whose first append then
    /// reads a padded buffer like every later one.
    pub(super) fn first_entry_dim(
        &self,
        op: OpId,
        inputs: &[TensorRef],
        outs: &[TensorRef],
        types: &[TensorType],
        params: &[i64],
    ) -> Option<usize> {
        if op != OpId::Cat || inputs.len() != 2 || !outs.is_empty() || !self.bounded {
            return None;
        }
        let (empty, x) = (&types[0], &types[1]);
        if empty.shape.as_slice() != [0] || empty.dtype != x.dtype || x.shape.is_empty() {
            return None;
        }
        let dim = cat_dim(params, x.shape.len())?;
        // One element has no extent to pad (`Padding::translate` refuses it).
        (x.shape[dim] >= 2 && self.padding_of(inputs[1].storage).is_none()).then_some(dim)
    }

    /// `cat([torch.tensor([]), x], dim)`, a sequence's first entry (`first_entry_dim`): its
    /// result is `x` padded along `dim` to the bucket of its length. Without it the first
    /// append reads an exact buffer and compiles a program of its own, one more per request of
    /// a new prompt length than the buckets need.
    pub(super) fn first_entry(
        &mut self,
        inputs: &[TensorRef],
        types: &[TensorType],
        dim: usize,
    ) -> Result<Captured, EngineError> {
        let ty = types[1].clone();
        let placement = self.placement(&OperandName(OpId::Cat, "input", 1), &inputs[1])?;
        let x = self.read_for_node(&inputs[1], &placement)?;
        let len = ty.shape[dim];
        let captured = self.push_append(SmallVec::from_elem(x, 1), ty, dim, len);
        self.stats.captured_ops += 1;
        self.stats.padded_ops += 1;
        Ok(captured)
    }

    /// `cat([a, b], dim)` of exact values: when it continues a sequence seen growing along
    /// `dim`, its result is the first padded value of the sequence.
    pub(super) fn start_append(
        &mut self,
        inputs: &[TensorRef],
        params: &[i64],
        types: &[TensorType],
        placements: &[Placement],
    ) -> Result<Option<Captured>, EngineError> {
        if !placements[0].whole {
            return Ok(None);
        }
        let Some(dim) = self.continues_growth(inputs[0].storage, types, params) else {
            return Ok(None);
        };
        let captured = self.append(inputs, types, dim, false)?;
        if captured.is_some() {
            self.stats.captured_ops += 1;
            self.stats.padded_ops += 1;
        }
        Ok(captured)
    }

    /// The append node: `a` read padded (`a_padded`) or whole, `b` exact; the result padded
    /// along `dim` to the bucket of its length.
    fn append(
        &mut self,
        inputs: &[TensorRef],
        types: &[TensorType],
        dim: usize,
        a_padded: bool,
    ) -> Result<Option<Captured>, EngineError> {
        let cat = typed::Cat.encode(layout::Dim { dim: dim as i64 });
        let exact = ops::meta(cat.op, types, &[], &cat.params)?;
        let out_ty = exact.outputs[0].clone();
        let a_len = types[0].shape[dim];
        let out_len = out_ty.shape[dim];
        let out_bucket = padding::bucket(out_len);
        let a_input = if a_padded {
            let padding = self
                .padding_of(inputs[0].storage)
                .ok_or_else(|| EngineError::runtime("internal error: an unpadded append"))?;
            if padding.bucket > out_bucket {
                return Ok(None);
            }
            match self.read_padded(&inputs[0], &padding, types[0].dtype)? {
                Some((input, _)) => input,
                None => return Ok(None),
            }
        } else {
            let placement = self.placement(&OperandName(OpId::Cat, "input", 0), &inputs[0])?;
            self.read_for_node(&inputs[0], &placement)?
        };
        let b_placement = self.placement(&OperandName(OpId::Cat, "input", 1), &inputs[1])?;
        let b_input = self.read_for_node(&inputs[1], &b_placement)?;
        let mut node_inputs: SmallVec<[NodeInput; 3]> = SmallVec::new();
        node_inputs.push(a_input);
        node_inputs.push(b_input);
        Ok(Some(self.push_append(node_inputs, out_ty, dim, a_len)))
    }

    /// The `Append` node over `node_inputs` (`a`, or a first entry alone, then `b`) whose true
    /// result is `out_ty`, padded along `dim` to the bucket of its length; `a_len` is `a`'s true
    /// length, its one runtime scalar. Its storage is padded, and the sequence's extent is the
    /// one what the next ops make from its length follows.
    fn push_append(
        &mut self,
        node_inputs: SmallVec<[NodeInput; 3]>,
        out_ty: TensorType,
        dim: usize,
        a_len: i64,
    ) -> Captured {
        let out_len = out_ty.shape[dim];
        let out_bucket = padding::bucket(out_len);
        let mut padded_shape = out_ty.shape.clone();
        padded_shape[dim] = out_bucket;
        let meta = Meta {
            outputs: smallvec::smallvec![TensorType::new(out_ty.dtype, &padded_shape)],
            scalar_dtypes: ops::ScalarDTypes::from_elem(DType::I64, 1),
            variant: 0,
            float_default: None,
            matmul_precision: None,
        };
        let id = self.push_node(
            RegionOp::Append(Arc::new(AppendOp { dim, out_bucket })),
            &[],
            &[ScalarArg::int(a_len)],
            meta,
            node_inputs,
        );
        let storage = self.new_pending_storage(out_ty.nbytes(), out_ty.dtype, id.output(0));
        self.set_padding(
            storage,
            Padding {
                sizes: out_ty.shape.clone(),
                dims: smallvec::smallvec![dim],
                bucket: out_bucket,
            },
        );
        self.last_extent = Some((out_len, out_bucket));
        let mut outputs = CapturedOutputs::new();
        outputs.push((storage, out_ty));
        Captured { outputs }
    }

    /// Whether `op` (on exact inputs of `types`, with `params`) returns as many elements as
    /// its data selects and that count is to be padded (`count_padded`); records the count.
    /// The padded dimension of its result, and the count, when it is.
    pub(super) fn pads_count(
        &mut self,
        op: OpId,
        types: &[TensorType],
        params: &[i64],
    ) -> Option<(usize, i64)> {
        let dim = match op {
            // `[rank, count]` coordinates; `count` elements; `total` repeated positions.
            OpId::Nonzero => 1,
            OpId::MaskedSelect | OpId::RepeatInterleave => 0,
            _ => return None,
        };
        if !self.bounded {
            return None;
        }
        let count = layout::Count::decode(&Params::new(op, params)).ok()?.count;
        let site: SmallVec<[(DType, Shape); 2]> =
            types.iter().map(|t| (t.dtype, t.shape.clone())).collect();
        self.counts
            .note_count(op as u32, &site, count)
            .then_some((dim, count))
    }

    /// `nonzero`, `masked_select` or `repeat_interleave` on exact inputs at a site whose
    /// count has changed: run at the count's bucket (the elements a mask selects come first,
    /// repeated positions are written in order, so the first `count` of the bucket's result
    /// are the true ones) and kept padded, so the ops reading it (an index by the selected
    /// positions, the rows it picks, their products and the `index_add` back) compile once
    /// per bucket. `None`: capture it exact.
    pub(super) fn count_padded(
        &mut self,
        op: OpId,
        inputs: &[TensorRef],
        params: &[i64],
        types: &[TensorType],
        placements: &[Placement],
    ) -> Result<Option<Captured>, EngineError> {
        if placements.iter().any(|p| p.padded) {
            return Ok(None);
        }
        let Some((dim, count)) = self.pads_count(op, types, params) else {
            return Ok(None);
        };
        let bucket = padding::bucket(count);
        let exact = ops::meta(op, types, &[], params)?;
        let Some(counted) = TypedOp::<layout::of::Count>::of(op) else {
            return Ok(None);
        };
        let bucket_params = counted.encode(layout::Count { count: bucket }).params;
        // A bucket past the most the op can select (every element) stays exact.
        let Ok(meta) = ops::meta(op, types, &[], &bucket_params) else {
            return Ok(None);
        };
        let true_ty = exact.outputs[0].clone();
        if meta.outputs[0].shape.get(dim) != Some(&bucket) {
            return Ok(None);
        }
        let mut node_inputs: SmallVec<[NodeInput; 3]> = SmallVec::new();
        for (t, placement) in inputs.iter().zip(placements) {
            node_inputs.push(self.read_for_node(t, placement)?);
        }
        let id = self.push_node(RegionOp::Aten(op), &bucket_params, &[], meta, node_inputs);
        let dims = smallvec::smallvec![dim];
        Ok(Some(self.padded_result(
            None,
            true_ty,
            id.output(0),
            dims,
            bucket,
        )))
    }

    /// A node's output of true type `true_ty`, padded along `dims` to `bucket`, placed (in
    /// `out` when given) and counted as a padded op.
    fn padded_result(
        &mut self,
        out: Option<&TensorRef>,
        true_ty: TensorType,
        value: NodeOutput,
        dims: PaddedDims,
        bucket: i64,
    ) -> Captured {
        let padding = Padding {
            sizes: true_ty.shape.clone(),
            dims,
            bucket,
        };
        let storage = self.place_output(out, &true_ty, value, Some(padding));
        self.stats.captured_ops += 1;
        self.stats.padded_ops += 1;
        let mut outputs = CapturedOutputs::new();
        outputs.push((storage, true_ty));
        Captured { outputs }
    }

    /// Whether an op making a tensor from nothing, of result `meta`, has a size equal to the
    /// length of the sequence appended to last: `creation_padded` may make it padded, so the
    /// direct path leaves it to capture.
    pub(super) fn may_create_padded(&self, op: OpId, inputs: &[TensorRef], meta: &Meta) -> bool {
        let Some((len, _)) = self.last_extent else {
            return false;
        };
        inputs.is_empty()
            && self.bounded
            && matches!(op, OpId::Zeros | OpId::Ones | OpId::Full | OpId::Arange)
            && meta.outputs.first().is_some_and(|t| t.shape.contains(&len))
    }

    /// A tensor made from nothing (`zeros`, `ones`, `full`, `arange`) whose size along some
    /// dimensions is the length of the sequence appended to last: made padded along them, at
    /// the bucket's size, so the ops that combine it with the sequence's values stay padded
    /// (positions and masks built from the cache's length, as T5's relative position bias).
    /// `true_ty` is the op's exact result (its meta); `outs` at most one whole destination.
    pub(super) fn creation_padded(
        &mut self,
        op: OpId,
        true_ty: &TensorType,
        scalars: &[ScalarArg],
        params: &[i64],
        outs: &[TensorRef],
    ) -> Result<Option<Captured>, EngineError> {
        let Some((len, bucket)) = self.last_extent else {
            return Ok(None);
        };
        let true_ty = true_ty.clone();
        let out = outs.first();
        if let Some(out) = out {
            // `zero_`, `fill_` and `arange(out=)` write a whole fresh tensor.
            if out.dtype != true_ty.dtype
                || out.sizes != true_ty.shape
                || !self.is_whole_out(out)?
            {
                return Ok(None);
            }
        }
        let dims: PaddedDims = (0..true_ty.shape.len())
            .filter(|&d| true_ty.shape[d] == len)
            .collect();
        if dims.is_empty() {
            return Ok(None);
        }
        let p = Params::new(op, params);
        let padded = match op {
            OpId::Zeros | OpId::Ones | OpId::Full => {
                let Some(creation) = TypedOp::<layout::of::Creation>::of(op) else {
                    return Ok(None);
                };
                let layout::Creation { dtype, sizes } = layout::Creation::decode(&p)?;
                let mut sizes: SmallVec<[i64; 4]> = SmallVec::from_slice(sizes);
                for &d in &dims {
                    sizes[d] = bucket;
                }
                creation.encode(layout::Creation {
                    dtype,
                    sizes: &sizes,
                })
            }
            OpId::Arange => {
                let Ok(mut range) = layout::ArangeRange::decode(&p) else {
                    return Ok(None);
                };
                range.end = range.start + range.step * bucket as f64;
                typed::Arange.encode(range)
            }
            _ => return Ok(None),
        };
        let padded_params = padded.params;
        let meta = ops::meta(op, &[], scalars, &padded_params)?;
        let padded_ty = &meta.outputs[0];
        if dims.iter().any(|&d| padded_ty.shape[d] != bucket)
            || (0..true_ty.shape.len())
                .any(|d| !dims.contains(&d) && padded_ty.shape[d] != true_ty.shape[d])
        {
            return Ok(None);
        }
        let id = self.push_node(
            RegionOp::Aten(op),
            &padded_params,
            scalars,
            meta,
            SmallVec::new(),
        );
        Ok(Some(self.padded_result(
            out,
            true_ty.clone(),
            id.output(0),
            dims,
            bucket,
        )))
    }
}

impl<V: Clone> Graph<V> {
    /// How to upload whole tensor `t` (contiguous, from the host): padded along a dimension
    /// whose length keeps changing at its upload site, or marked by `mark_upload_site`; `None`
    /// uploads it exact. Records the upload either way.
    pub fn upload_padding(&mut self, t: &TensorRef) -> Option<Padding> {
        if !self.bounded || t.numel() == 0 {
            return None;
        }
        let (dim, bucket) = self.uploads.note_upload(t.dtype, &t.sizes)?;
        Some(Padding {
            sizes: t.sizes.clone(),
            dims: smallvec::smallvec![dim],
            bucket,
        })
    }

    /// The true length and bucket of the extent along which view `t` of a padded storage is
    /// padded, when it is (a plain padded dimension of the view, and no other dimension of that
    /// size): the size an index into `t` is checked against is then read at run time.
    pub fn padded_extent_of(&self, t: &TensorRef) -> Option<(i64, i64)> {
        let padding = self.padding_of(t.storage)?;
        let view = padding.translate(&t.sizes, &t.strides, t.offset)?;
        let len = padding.true_len();
        let unique = (0..t.sizes.len()).all(|d| view.dims.contains(&d) || t.sizes[d] != len);
        (!view.dims.is_empty() && !view.merged && unique).then_some((len, padding.bucket))
    }

    /// Whether storage `id`'s value is padded (bounded shapes).
    pub fn storage_is_padded(&self, id: StorageId) -> bool {
        self.is_padded(id)
    }

    /// A sequence growing in a buffer with room (RFC 0028) is now `length` long: windows of
    /// buffers read at that length by indexing ops, and tensors made from nothing at it, are
    /// padded to its bucket from now on (`window_padded`, `creation_padded`), as after an
    /// append into a padded value.
    pub fn note_sequence_length(&mut self, length: i64) {
        if self.bounded && length >= 2 {
            self.last_extent = Some((length, padding::bucket(length)));
        }
    }

    /// `torch_pjrt.mark_dynamic(t, dim, max)` on an inner dimension: uploads of `t`'s dtype and
    /// sizes, any length along `dim`, are padded to at least `bound` along it from now on.
    pub fn mark_upload_site(&mut self, t: &TensorRef, dim: usize, bound: i64) {
        if dim < t.sizes.len() {
            self.uploads
                .mark(t.dtype, &t.sizes, dim, bound.max(t.sizes[dim]));
        }
    }
}

/// The padding of an output of true sizes `sizes` and padded sizes `padded`, padded along
/// `dims`: a dimension holding `k > 1` runs of the bucket (the extent merged with `k`
/// positions outside it, as a linear layer's `[batch * length, features]`) is recorded split
/// in two, `[k, length]`, so that PyTorch's view of the result back to `[batch, length, ...]`
/// reads it as a padded dimension of its own.
fn output_padding(sizes: &[i64], padded: &[i64], dims: &[usize], bucket: i64) -> Padding {
    let mut split = Shape::new();
    let mut split_dims = PaddedDims::new();
    for (d, &size) in sizes.iter().enumerate() {
        if dims.contains(&d) {
            let runs = padded[d] / bucket;
            if runs > 1 {
                split.push(runs);
                split.push(size / runs);
            } else {
                split.push(size);
            }
            split_dims.push(split.len() - 1);
        } else {
            split.push(size);
        }
    }
    Padding {
        sizes: split,
        dims: split_dims,
        bucket,
    }
}

/// Ops that read positions given by indices (and the engine's check of them): a window of
/// a buffer read as their indices may be read at the bucket's size.
fn is_indexing(op: OpId) -> bool {
    matches!(
        op,
        OpId::Embedding
            | OpId::EmbeddingDenseBackward
            | OpId::Gather
            | OpId::Index
            | OpId::IndexSelect
            | OpId::IndexCheck
    )
}

/// `cat`'s dimension (negative from the end) as an index into operands of `rank` dimensions;
/// `None` when out of range or not `cat`'s params.
fn cat_dim(params: &[i64], rank: usize) -> Option<usize> {
    let dim = layout::Dim::decode(&Params::new(OpId::Cat, params))
        .ok()?
        .dim;
    let dim = if dim < 0 { dim + rank as i64 } else { dim };
    usize::try_from(dim).ok().filter(|&d| d < rank)
}

/// A padded device value that an append is about to outgrow: the engine gives its storage the
/// value at the next bucket (`Graph::install_regrown`) before the append is captured, so the
/// append reads and writes one bucket, as at the steps after it, and the step that crosses
/// into a bucket runs the programs of the steps that follow instead of programs of its own.
#[derive(Clone, Debug)]
pub struct Regrow<V> {
    pub storage: StorageId,
    /// The value held, of type `held`: the padded value at the old bucket.
    pub value: V,
    pub held: TensorType,
    /// The padded dimension, and the bucket it grows to.
    pub dim: usize,
    pub bucket: i64,
}

impl<V> Regrow<V> {
    /// The held value's sizes with the padded dimension at the new bucket.
    pub fn grown_sizes(&self) -> Shape {
        let mut sizes = self.held.shape.clone();
        sizes[self.dim] = self.bucket;
        sizes
    }
}

impl<V: Clone> Graph<V> {
    /// Whether `cat(inputs, dim)` appends to a materialized padded value past its bucket: the
    /// regrow the engine should make first. Only a whole padded device value padded along the
    /// append's dimension alone qualifies (a pending one grows inside its region).
    pub fn append_regrow(&self, inputs: &[TensorRef], params: &[i64]) -> Option<Regrow<V>> {
        if !self.bounded || inputs.len() != 2 || self.is_padded(inputs[1].storage) {
            return None;
        }
        let (a, b) = (&inputs[0], &inputs[1]);
        let padding = self.padding_of(a.storage)?;
        let rank = a.sizes.len();
        if padding.dims.len() != 1 || b.sizes.len() != rank || b.dtype != a.dtype {
            return None;
        }
        let dim = cat_dim(params, rank)?;
        let view = padding.translate(&a.sizes, &a.strides, a.offset)?;
        if view.dims.as_slice() != [dim] || padding.dims[0] != dim || view.offset != 0 {
            return None;
        }
        let bucket = padding::bucket(a.sizes[dim] + b.sizes[dim]);
        if bucket <= padding.bucket {
            return None;
        }
        let storage = self.storages.get(&a.storage)?;
        match &storage.value {
            StorageValue::Device { value, ty }
                if storage.native == Some(a.dtype)
                    && ty.dtype == a.dtype
                    && ty.shape == padding.padded_sizes() =>
            {
                Some(Regrow {
                    storage: a.storage,
                    value: value.clone(),
                    held: ty.clone(),
                    dim,
                    bucket,
                })
            }
            _ => None,
        }
    }

    /// The device value an append node reads whole as its padded `a`, when the append may
    /// write its result into that value's buffer: the result has its type (one bucket), and no
    /// storage holds the value any more (its storage was released, as a dynamic cache's is
    /// once the new cache replaces it). The flush still checks that no op left pending reads
    /// it. Such an append updates the cache in place instead of copying it at every step, and
    /// a memory plan gains nothing from cutting after it.
    pub(super) fn append_donor(&self, node: &Node) -> Option<ExternalId> {
        if !matches!(node.op, RegionOp::Append(_)) {
            return None;
        }
        let input = node.inputs.first()?;
        let ValueRef::External(e) = input.value else {
            return None;
        };
        if input.view.is_some() || input.offset.is_some() || input.reshape_to.is_some() {
            return None;
        }
        if self.externals.get(&e).map(|x| &x.ty) != node.meta.outputs.first() {
            return None;
        }
        // The one storage version it was read from, released, and its value held nowhere else.
        let mut sources = self.external_of.iter().filter(|&(_, &x)| x == e);
        match (sources.next(), sources.next()) {
            (Some((key, _)), None)
                if self.storages.get(&key.0).is_none() && !self.released_shared.contains(key) =>
            {
                Some(e)
            }
            _ => None,
        }
    }

    /// Installs `value`, the regrown value of `regrow`'s storage (its elements in place, the
    /// padded dimension at the new bucket): the storage stays padded, at the new bucket.
    pub fn install_regrown(&mut self, regrow: &Regrow<V>, value: V) -> Result<(), EngineError> {
        let padding = self.padding_of(regrow.storage).ok_or_else(|| {
            EngineError::runtime("internal error: a regrown storage is not padded")
        })?;
        let grown = Padding {
            sizes: padding.sizes.clone(),
            dims: padding.dims.clone(),
            bucket: regrow.bucket,
        };
        let ty = TensorType::new(regrow.held.dtype, &regrow.grown_sizes());
        let storage = self
            .storages
            .get_mut(&regrow.storage)
            .ok_or_else(|| unknown_storage(regrow.storage))?;
        // Pending ops that read the old value keep reading it (a new version, a new external).
        storage.value = StorageValue::Device { value, ty };
        storage.version += 1;
        storage.padding = Some(Arc::new(grown));
        self.overwritten.remove(&regrow.storage);
        self.shared_values.remove(&regrow.storage);
        self.stats.regrown_values += 1;
        Ok(())
    }
}
