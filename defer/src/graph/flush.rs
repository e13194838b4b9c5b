//! Flush planning: the region `liveness` picks, its arguments, lifted scalars, outputs and
//! donations, its key, and the values it installs in the storages that hold them.

use super::*;
use crate::fail_point::FailPoint;

impl<V: Clone> Graph<V> {
    /// What `liveness` is asked for a flush request; a request for storages fills `requested`
    /// with their pending values. `None`: none of the requested storages is pending.
    pub(super) fn liveness_request<'a>(
        &self,
        request: FlushRequest<'_>,
        requested: &'a mut Vec<ValueRef>,
    ) -> Option<Request<'a>> {
        Some(match request {
            FlushRequest::All => Request::All,
            FlushRequest::Prefix(len) => Request::Prefix(len),
            FlushRequest::Storages(storages) => {
                requested.extend(storages.iter().filter_map(|s| {
                    match self.storages.get(s).map(|st| &st.value) {
                        Some(StorageValue::Pending { out, .. }) => Some(ValueRef::Pending(*out)),
                        _ => None,
                    }
                }));
                if requested.is_empty() {
                    return None;
                }
                Request::Values(requested)
            }
        })
    }

    /// Plans a materialization: chooses the region (ordered materialization), builds it, and
    /// installs a new output value (from `make_output`) into every storage holding an output.
    /// Returns `None` when nothing needs to run.
    pub fn flush(
        &mut self,
        request: FlushRequest<'_>,
        make_output: impl FnMut(&TensorType) -> V,
    ) -> Result<Option<Flush<V>>, EngineError> {
        self.flush_with(request, make_output, |_, _, _| false)
    }

    /// [`Graph::flush`], asking `has_program(shapeless, dims, size)` once the key is known: when it
    /// answers yes, the region's source is not assembled (a warm flush needs only the key, the
    /// arguments and the outputs).
    pub fn flush_with(
        &mut self,
        request: FlushRequest<'_>,
        mut make_output: impl FnMut(&TensorType) -> V,
        has_program: impl FnOnce(u64, u64, RegionSize) -> bool,
    ) -> Result<Option<Flush<V>>, EngineError> {
        if self.pending.is_empty() {
            return Ok(None);
        }
        let mut requested = Vec::new();
        let Some(liveness_request) = self.liveness_request(request, &mut requested) else {
            return Ok(None);
        };
        let holders = &self.holders;
        let plan = match (liveness_request, self.pending.front()) {
            // One pending op, flushed whole (every op in the op-by-op modes): the plan is that
            // op and its held outputs, which is what `liveness::plan` would compute for it.
            (Request::All, Some(node)) if self.pending.len() == 1 => {
                let plan = single_node_plan(node, |out| holders.contains_key(&out));
                debug_assert_eq!(
                    Some(&plan),
                    liveness::plan(&self.pending, Request::All, |out| holders
                        .contains_key(&out))
                    .ok()
                    .map(RegionPlan::from)
                    .as_ref()
                );
                plan
            }
            _ => liveness::plan(&self.pending, liveness_request, |out| {
                holders.contains_key(&out)
            })
            .map(RegionPlan::from)
            .map_err(|e| EngineError::runtime(format!("internal error planning a region: {e}")))?,
        };
        if plan.region_len() == 0 {
            return Ok(None);
        }
        crate::fail_point::reach(FailPoint::FlushPlanned)?;
        if plan.kept.is_empty() {
            // Every op of the region is dead: drop them; nothing runs.
            self.pending.drain(..plan.region_len());
            self.stats.dropped_ops += plan.dropped as u64;
            self.forget_unread_externals();
            return Ok(None);
        }
        let base = self.pending.front().unwrap().id.seq();
        let position = |id: NodeId| (id.seq() - base) as usize;

        // Externals numbered by first use, operands resolved, scalars gathered; the nodes
        // themselves become the region source below, untouched.
        let mut arg_types: SmallVec<[TensorType; 2]> = SmallVec::new();
        let mut args: SmallVec<[V; 4]> = SmallVec::new();
        let mut arg_index = SmallMap::default();
        // By pending position (the region is a prefix of the pending list, ids contiguous).
        let mut region_index: SmallVec<[u32; 8]> = SmallVec::from_elem(u32::MAX, plan.region_len());
        let mut operands: SmallVec<[Operand; 4]> = SmallVec::new();
        let mut scalars: SmallVec<[(ScalarArg, DType); 4]> = SmallVec::new();
        for (k, &id) in plan.kept.iter().enumerate() {
            let node = &self.pending[position(id)];
            for input in &node.inputs {
                operands.push(match input.value {
                    ValueRef::Pending(out) => Operand::Node {
                        node: region_index[position(out.node)],
                        output: out.index,
                    },
                    ValueRef::External(e) => Operand::Arg(arg_index.number(e, || {
                        let ext = &self.externals[&e];
                        arg_types.push(ext.ty.clone());
                        args.push(ext.value.clone());
                    })),
                });
                if let Some(offset) = input.offset {
                    scalars.push((ScalarArg::int(offset), DType::I64));
                }
            }
            for (scalar, dtype) in node.scalars.iter().zip(&node.meta.scalar_dtypes) {
                scalars.push((*scalar, *dtype));
            }
            region_index[position(id)] = k as u32;
        }
        let (slots, packs) = fuse::pack_scalars(&scalars);

        // Outputs and the key (prefix digest of the region, then the outputs).
        let last = self.pending[plan.region_len() - 1].clone_digests();
        let mut key = RegionKey::new(last, plan.outputs.len());
        let mut region_outputs: SmallVec<[Operand; 2]> =
            SmallVec::with_capacity(plan.outputs.len());
        let mut output_types: SmallVec<[TensorType; 2]> =
            SmallVec::with_capacity(plan.outputs.len());
        let pending = &self.pending;
        // Makes `out` a region output: keyed by its position, typed by its producer's meta.
        let mut add_output = |out: NodeOutput, key: &mut RegionKey| {
            let at = position(out.node);
            key.output(at, out.index);
            region_outputs.push(Operand::Node {
                node: region_index[at],
                output: out.index,
            });
            output_types.push(pending[at].meta.outputs[out.index as usize].clone());
        };
        for output in &plan.outputs {
            add_output(output.value, &mut key);
        }
        // Side-effecting ops are kept even when nothing reads them; their results (check
        // verdicts) leave the region so the engine can act on them.
        let mut check_outputs: Vec<(NodeOutput, CheckSite)> = Vec::new();
        let mut checks_in_outputs: Vec<(usize, CheckSite)> = Vec::new();
        for &id in &plan.kept {
            let node = &pending[position(id)];
            if !node.is_side_effecting() {
                continue;
            }
            for k in 0..node.meta.outputs.len() as u32 {
                let out = id.output(k);
                let site = CheckSite {
                    op: node.op.name(),
                    location: node.location.clone(),
                };
                match plan.output_position(out) {
                    Some(i) => checks_in_outputs.push((i, site)),
                    None => check_outputs.push((out, site)),
                }
            }
        }
        key.checks(check_outputs.len());
        for (out, _) in &check_outputs {
            add_output(*out, &mut key);
        }

        // Install the new values.
        let outputs: SmallVec<[V; 2]> = output_types.iter().map(&mut make_output).collect();
        let checks: Vec<(V, CheckSite)> = checks_in_outputs
            .into_iter()
            .map(|(i, label)| (outputs[i].clone(), label))
            .chain(
                check_outputs
                    .into_iter()
                    .enumerate()
                    .map(|(i, (_, label))| (outputs[plan.outputs.len() + i].clone(), label)),
            )
            .collect();
        let mut replacement: HashMap<NodeOutput, ExternalId> = HashMap::default();
        // (external the storage held before, output index) for the donation decision below.
        let mut successors: SmallVec<[(ExternalId, u32); 4]> = SmallVec::new();
        if self.donate {
            // Appends into a padded value nothing else holds write in its buffer.
            for &id in &plan.kept {
                let node = &self.pending[position(id)];
                if let Some(e) = self.append_donor(node) {
                    if let Some(j) = plan.output_position(id.output(0)) {
                        successors.push((e, j as u32));
                    }
                }
            }
        }
        for (j, ((output, value), ty)) in plan
            .outputs
            .iter()
            .zip(&outputs)
            .zip(&output_types)
            .enumerate()
        {
            if let Some(list) = self.holders.remove(&output.value) {
                let shared = list.len() > 1;
                if output.read_by_pending {
                    self.read_elsewhere.extend(list.iter().copied());
                }
                for storage in list {
                    if let Some(e) = self.overwritten.remove(&storage) {
                        if !shared {
                            successors.push((e, j as u32));
                        }
                    }
                    if shared && self.donate {
                        self.shared_values.insert(storage);
                    }
                    if let Some(st) = self.storages.get_mut(&storage) {
                        st.value = StorageValue::Device {
                            value: value.clone(),
                            ty: ty.clone(),
                        };
                    }
                }
            }
            if output.read_by_pending {
                let e = ExternalId(self.next_external);
                self.next_external += 1;
                self.externals.insert(
                    e,
                    External {
                        value: value.clone(),
                        ty: ty.clone(),
                    },
                );
                replacement.insert(output.value, e);
            }
        }
        crate::fail_point::reach(FailPoint::FlushInstalled)?;
        let region_len = plan.region_len();
        let nodes: SmallVec<[Node; 1]> = if region_len == 1 && plan.kept.len() == 1 {
            // One kept op: moved once, not through a draining filter (a node is large).
            let mut one = SmallVec::new();
            one.push(self.pending.pop_front().expect("a region of one op"));
            one
        } else {
            let mut kept = plan.kept.iter().peekable();
            self.pending
                .drain(..region_len)
                .filter(|node| kept.next_if(|&&id| id == node.id).is_some())
                .collect()
        };
        for node in self.pending.iter_mut() {
            for input in node.inputs.iter_mut() {
                if let ValueRef::Pending(out) = input.value {
                    if let Some(e) = replacement.get(&out) {
                        input.value = ValueRef::External(*e);
                    }
                }
            }
        }
        self.forget_unread_externals();
        crate::fail_point::reach(FailPoint::FlushDrained)?;

        // Donation is decided last: only now have the pending ops let go of what they no longer
        // read. An argument is paired with the output that replaced it in its storage (same
        // type): naming the pair, rather than letting the compiler match donors to outputs by
        // shape, keeps it from giving a parameter's buffer to, say, its gradient and copying the
        // parameter aside.
        let mut aliases: SmallVec<[(u32, u32); 2]> = SmallVec::new();
        for &(e, j) in &successors {
            let Some(i) = arg_index.get(e) else { continue };
            if output_types[j as usize] == arg_types[i as usize]
                && !self.externals.contains_key(&e)
                && !aliases.iter().any(|&(a, o)| a == i || o == j)
            {
                aliases.push((i, j));
            }
        }
        aliases.sort_unstable();
        let (shapeless, dims) = key.finish(&aliases);
        #[cfg(debug_assertions)]
        if let Some(expected) = self.direct_key_check.take() {
            debug_assert_eq!(
                expected,
                (shapeless, dims),
                "the direct path keyed {} differently from its flush",
                region_label(&nodes)
            );
        }

        let label = match nodes.as_slice() {
            [node] => {
                let name = node.op.name();
                self.op_labels
                    .entry(name)
                    .or_insert_with(|| Arc::from(name))
                    .clone()
            }
            nodes => Arc::from(region_label(nodes)),
        };
        let ops = nodes.len();
        let work = nodes
            .iter()
            .flat_map(|node| node.meta.outputs.iter())
            .map(|t| t.numel() as u64)
            .sum();
        let region = (!has_program(shapeless, dims, RegionSize { ops, work })).then(|| {
            Box::new(RegionSource {
                nodes,
                operands,
                arg_types,
                slots,
                scalar_packs: packs.iter().map(|p| (p.dtype, p.count)).collect(),
                outputs: region_outputs,
                aliases: aliases.clone(),
            })
        });
        self.stats.materializations += 1;
        self.stats.regions += 1;
        self.stats.region_ops += plan.kept.len() as u64;
        self.stats.dropped_ops += plan.dropped as u64;
        self.stats.largest_region = self.stats.largest_region.max(plan.kept.len() as u64);
        Ok(Some(Flush {
            shapeless,
            dims,
            region,
            ops,
            work,
            aliases,
            args,
            scalar_packs: packs,
            outputs,
            label,
            prefix: last,
            dropped_ops: plan.dropped,
            checks,
            device: self.device,
        }))
    }

    /// Drops the device values no pending op reads any more, and re-keys what stays pending
    /// (its positions moved).
    pub(super) fn forget_unread_externals(&mut self) {
        if self.pending.is_empty() {
            self.repeat_anchor = 0;
            // `clear` sweeps a map's whole capacity: skip the empty ones, as after every op
            // in the op-by-op modes.
            clear_if_any(&mut self.externals);
            clear_if_any(&mut self.external_of);
            clear_if_any(&mut self.arg_numbers);
            if !self.released_shared.is_empty() {
                self.released_shared.clear();
            }
            if !self.read_elsewhere.is_empty() {
                self.read_elsewhere.clear();
            }
            return;
        }
        let mut used = rustc_hash::FxHashSet::default();
        for node in &self.pending {
            for input in &node.inputs {
                if let ValueRef::External(e) = input.value {
                    used.insert(e);
                }
            }
        }
        self.externals.retain(|e, _| used.contains(e));
        self.external_of.retain(|_, e| used.contains(e));
        self.rehash_pending();
    }
}

/// Numbers externals by first use. Regions read few of them, and most flushes run one op: a
/// short list searched in order beats hashing, and spills to a map for large regions.
#[derive(Default)]
pub(super) struct SmallMap {
    pub(super) list: SmallVec<[(ExternalId, u32); 8]>,
    pub(super) map: HashMap<ExternalId, u32>,
}

impl SmallMap {
    /// `e`'s number, if it has one.
    pub(super) fn get(&self, e: ExternalId) -> Option<u32> {
        if self.map.is_empty() {
            self.list.iter().find(|(x, _)| *x == e).map(|&(_, n)| n)
        } else {
            self.map.get(&e).copied()
        }
    }

    /// `e`'s number, assigning the next one (and calling `on_new`) the first time.
    pub(super) fn number(&mut self, e: ExternalId, on_new: impl FnOnce()) -> u32 {
        let next = (self.list.len() + self.map.len()) as u32;
        if self.map.is_empty() {
            if let Some(&(_, n)) = self.list.iter().find(|(x, _)| *x == e) {
                return n;
            }
            if self.list.len() < 8 {
                self.list.push((e, next));
                on_new();
                return next;
            }
            self.map.extend(self.list.drain(..));
        }
        match self.map.entry(e) {
            std::collections::hash_map::Entry::Occupied(o) => *o.get(),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(next);
                on_new();
                next
            }
        }
    }
}

/// The plan of flushing a pending list of exactly one node whole: no request, no pending
/// reader, so its outputs are the held ones and it is kept when one is held or it has side
/// effects.
pub(super) fn single_node_plan(
    node: &Node,
    mut is_held: impl FnMut(NodeOutput) -> bool,
) -> RegionPlan {
    let outputs: SmallVec<[liveness::Output; 2]> = (0..node.num_outputs())
        .map(|index| node.id.output(index))
        .filter(|&value| is_held(value))
        .map(|value| liveness::Output {
            value,
            requested: false,
            held_by_storage: true,
            read_by_pending: false,
        })
        .collect();
    let keep = node.is_side_effecting() || !outputs.is_empty();
    RegionPlan {
        kept: if keep {
            SmallVec::from_elem(node.id, 1)
        } else {
            SmallVec::new()
        },
        outputs,
        dropped: usize::from(!keep),
    }
}

pub(super) fn clear_if_any<K, T>(map: &mut HashMap<K, T>) {
    if !map.is_empty() {
        map.clear();
    }
}

/// A [`liveness::Plan`] in inline lists: a one-op region, planned for every op in the op-by-op
/// modes, then needs no allocation.
#[derive(Debug, PartialEq)]
pub(super) struct RegionPlan {
    pub(super) kept: SmallVec<[NodeId; 1]>,
    pub(super) outputs: SmallVec<[liveness::Output; 2]>,
    /// How many ops of the region are dropped (the region is `kept` and these, in a prefix).
    pub(super) dropped: usize,
}

impl RegionPlan {
    pub(super) fn region_len(&self) -> usize {
        self.kept.len() + self.dropped
    }

    pub(super) fn output_position(&self, value: NodeOutput) -> Option<usize> {
        self.outputs.iter().position(|output| output.value == value)
    }
}

impl From<liveness::Plan> for RegionPlan {
    fn from(plan: liveness::Plan) -> Self {
        RegionPlan {
            kept: plan.kept.into(),
            outputs: plan.outputs.into(),
            dropped: plan.dropped.len(),
        }
    }
}
