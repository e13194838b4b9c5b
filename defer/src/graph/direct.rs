//! Strict's direct path: a warm op on whole device values runs without a node, externals or a
//! plan, keyed exactly as the one-op flush of it would be (the key comes from [`super::key`]).

use super::*;

impl<V: Clone> Graph<V> {
    /// Strict's direct path, for an op that reads whole device values and writes new storages
    /// or one whole `out` tensor, while nothing is pending: keys the one-op region a capture
    /// and flush of it would build (aliases included), and when `has_program(shapeless, dims, size)`
    /// knows that key, installs the results and returns the region ready to launch, without a
    /// node, externals or a liveness plan, with the storages that hold its results. `None`:
    /// capture and flush it instead (no program for its key yet, or not an op this path
    /// takes). Errors are the ones capture would raise.
    pub fn run_if_compiled(
        &mut self,
        call: OpCall<'_>,
        mut make_output: impl FnMut(&TensorType) -> V,
        has_program: impl FnOnce(u64, u64, RegionSize) -> bool,
    ) -> Result<Option<(Captured, Flush<V>)>, EngineError> {
        let OpCall {
            op,
            inputs,
            scalars,
            params,
            outs,
        } = call;
        if !self.pending.is_empty() || op.is_side_effecting() || outs.len() > 1 {
            return Ok(None);
        }
        // Read before any write: a write through a view keeps the rest of the old value.
        let known = self.known_write(op, inputs, scalars, params, outs);
        let mut types: SmallVec<[TensorType; 3]> = SmallVec::new();
        let mut placements: SmallVec<[Placement; 3]> = SmallVec::new();
        for (i, t) in inputs.iter().enumerate() {
            let placement = self.placement(&OperandName(op, "input", i), t)?;
            if placement.padded {
                // Read through its padding: capture's.
                return Ok(None);
            }
            placements.push(placement);
            types.push(t.ty());
        }
        if !placements.iter().all(|p| p.whole) && self.may_read_windows_at_bucket(op) {
            // A window of a growing value may be read at its bucket (`window_padded`).
            return Ok(None);
        }
        let meta = ops::meta(op, &types, scalars, params)?;
        super::check_out_dtypes(op, outs, &meta)?;
        if self.may_create_padded(op, inputs, &meta) {
            // It may be made padded (`creation_padded`): capture decides.
            return Ok(None);
        }
        if op == OpId::Cat
            && inputs.len() == 2
            && outs.is_empty()
            && self.bounded
            && placements[0].whole
            && self
                .continues_growth(inputs[0].storage, &types, params)
                .is_some()
        {
            // An append that continues a growing sequence: capture pads it (RFC 0029).
            return Ok(None);
        }
        if self
            .first_entry_dim(op, inputs, outs, &types, params)
            .is_some()
        {
            // A sequence's first entry: capture pads it.
            return Ok(None);
        }
        if outs.is_empty() && self.pads_count(op, &types, params).is_some() {
            // A data-dependent count at a site whose count changes: capture pads it.
            return Ok(None);
        }
        let outputs_len = meta.outputs.len();
        if outputs_len == 0 {
            return Ok(None);
        }
        if let Some(out) = outs.first() {
            // One whole destination of the result's own type and shape, which no input reads
            // except as that same tensor (an in-place op); anything else is capture's to
            // check, cast or refuse.
            if !self.placement(&OperandName(op, "output", 0), out)?.whole
                || outputs_len != 1
                || meta.outputs[0].dtype != out.dtype
                || meta.outputs[0].shape != out.sizes
                || inputs.iter().any(|t| t.storage == out.storage && t != out)
            {
                return Ok(None);
            }
        }
        // Arguments numbered by first use of their storage, as capture numbers externals.
        let mut args: SmallVec<[V; 4]> = SmallVec::new();
        let mut arg_storages: SmallVec<[StorageId; 4]> = SmallVec::new();
        let mut aliases: SmallVec<[(u32, u32); 2]> = SmallVec::new();
        // Views read their storage's value through a chain of movements, as capture reads
        // them (`read_for_node`); a window's offset is a runtime scalar, ahead of the op's.
        let mut views_read: SmallVec<[Option<Arc<InputView>>; 3]> = SmallVec::new();
        let mut scalars_typed: SmallVec<[(ScalarArg, DType); 4]> = SmallVec::new();
        for (t, placement) in inputs.iter().zip(&placements) {
            if placement.whole {
                views_read.push(None);
                continue;
            }
            let (view, offset) = input_view(t, placement)?;
            views_read.push(Some(view));
            if let Some(offset) = offset {
                scalars_typed.push((ScalarArg::int(offset), DType::I64));
            }
        }
        let mut digest_inputs: SmallVec<[InputDigest<'_>; 3]> = SmallVec::new();
        for (t, view) in inputs.iter().zip(&views_read) {
            let Some(StorageValue::Device { value, ty }) =
                self.storages.get(&t.storage).map(|s| &s.value)
            else {
                return Ok(None);
            };
            let number = match arg_storages.iter().position(|&s| s == t.storage) {
                Some(k) => k,
                None => {
                    arg_storages.push(t.storage);
                    args.push(value.clone());
                    // An in-place op donates the value it overwrites, as a flush decides:
                    // when donation is on, the value is this storage's alone, and its type is
                    // the result's.
                    if outs.first().is_some_and(|out| out.storage == t.storage)
                        && self.donate
                        && !self.shared_values.contains(&t.storage)
                        && *ty == meta.outputs[0]
                    {
                        aliases.push((arg_storages.len() as u32 - 1, 0));
                    }
                    arg_storages.len() - 1
                }
            };
            digest_inputs.push(InputDigest {
                source: InputSource::Argument {
                    number: number as u32,
                    stored: Some(ty),
                },
                reshape_to: (view.is_none() && ty.shape != t.sizes).then_some(t.sizes.as_slice()),
                view: view.as_deref(),
            });
        }
        let (s, d) = op_digests(
            &RegionOp::Aten(op),
            params,
            scalars,
            digest_inputs.drain(..),
            &meta,
        );
        drop(digest_inputs);
        // The one-op region's key as `flush_with` forms it: the op's prefix digests (it would
        // be alone in the pending list), each output by position, no checks, then the aliases.
        let prefix = (fuse::combine(0, s), fuse::combine(0, d));
        let mut key = RegionKey::new(prefix, outputs_len);
        for index in 0..outputs_len {
            key.output(0, index as u32);
        }
        key.checks(0);
        let (shapeless, dims) = key.finish(&aliases);
        let work = meta.outputs.iter().map(|t| t.numel() as u64).sum();
        if !has_program(shapeless, dims, RegionSize { ops: 1, work }) {
            #[cfg(debug_assertions)]
            {
                self.direct_key_check = Some((shapeless, dims));
            }
            return Ok(None);
        }

        scalars_typed.extend(
            scalars
                .iter()
                .copied()
                .zip(meta.scalar_dtypes.iter().copied()),
        );
        let (_, packs) = fuse::pack_scalars(&scalars_typed);
        let mut outputs: SmallVec<[V; 2]> = SmallVec::new();
        let mut captured = CapturedOutputs::new();
        for ty in meta.outputs {
            let value = make_output(&ty);
            let installed = StorageValue::Device {
                value: value.clone(),
                ty: ty.clone(),
            };
            // What a capture's write and its flush leave: one more version.
            let storage = match outs.first() {
                Some(out) => {
                    // No donation bookkeeping for the value it replaced.
                    self.overwritten.remove(&out.storage);
                    self.shared_values.remove(&out.storage);
                    let entry = self
                        .storages
                        .get_mut(&out.storage)
                        .expect("checked storage");
                    entry.version += 1;
                    entry.value = installed;
                    out.storage
                }
                None => {
                    let nbytes = ty.nbytes();
                    self.insert_storage(nbytes, Some(ty.dtype), installed, 1)
                }
            };
            outputs.push(value);
            captured.push((storage, ty));
        }
        let name = op.name();
        let label = self
            .op_labels
            .entry(name)
            .or_insert_with(|| Arc::from(name))
            .clone();
        if op == OpId::Cat && inputs.len() == 2 && outs.is_empty() {
            let first = inputs[0].sizes.as_slice() == [0];
            self.growth.note_result(captured[0].0, first);
        }
        self.stats.captured_ops += 1;
        self.stats.direct_ops += 1;
        self.stats.materializations += 1;
        self.stats.regions += 1;
        self.stats.region_ops += 1;
        self.stats.largest_region = self.stats.largest_region.max(1);
        let captured = Captured { outputs: captured };
        if let Some(write) = known {
            self.remember_known(write, &captured);
        }
        Ok(Some((
            captured,
            Flush {
                shapeless,
                dims,
                region: None,
                ops: 1,
                work,
                aliases,
                args,
                scalar_packs: packs,
                outputs,
                label,
                prefix,
                dropped_ops: 0,
                checks: Vec::new(),
                device: self.device,
            },
        )))
    }
}
