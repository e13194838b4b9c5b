//! Memory cuts of a whole flush: where one region would allocate a late, large result while
//! earlier scratch is live, the flush runs as the executions estimated to peak lowest (RFC 0023).

use super::*;

impl<V: Clone> Graph<V> {
    /// Where to cut the pending list before flushing all of it (ascending lengths of prefixes
    /// to run first), so that a late, large result (a first layer's weight gradient) is not
    /// allocated while the scratch before it is live, and a value only the pending ops read is
    /// not held past its last reader (see `memory_cut`). Empty when one region is estimated to
    /// need no more memory.
    pub fn memory_cuts(&mut self) -> Vec<usize> {
        let ops = self.pending.len();
        let (Some(front), Some(back)) = (self.pending.front(), self.pending.back()) else {
            return Vec::new();
        };
        if ops < MEMORY_CUT_MIN_OPS {
            return Vec::new();
        }
        // A loop flushes the same ops with the same values held at every step: its plan is
        // remembered by the ops' digest and the positions of the held values. (A stale plan
        // would cost memory or launches, never correctness: any prefix may run first.)
        let base = front.id.seq();
        let held = self.holders.keys().fold(0u64, |acc, out| {
            let position = out.node.seq() - base;
            acc.wrapping_add(
                StableHasher::new()
                    .u64(position)
                    .u32(out.index)
                    .finish()
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15),
            )
        });
        let key = (back.prefix_shapeless, back.prefix_dims, held);
        if let Some(cuts) = self.memory_plans.get(&key) {
            return cuts.clone();
        }
        let cuts = self.plan_memory_cuts();
        if self.memory_plans.len() >= MEMORY_PLANS_KEPT {
            self.memory_plans.clear();
        }
        self.memory_plans.insert(key, cuts.clone());
        cuts
    }

    /// [`Graph::memory_cuts`], planned afresh.
    pub(super) fn plan_memory_cuts(&self) -> Vec<usize> {
        let ops = self.pending.len();
        let base = self.pending.front().map_or(0, |n| n.id.seq());
        // Values numbered in capture order: node `p`'s outputs start at `first[p]`.
        let mut first = Vec::with_capacity(ops + 1);
        let mut count = 0;
        for node in &self.pending {
            first.push(count);
            count += node.meta.outputs.len();
        }
        first.push(count);
        let slot = |out: NodeOutput| first[(out.node.seq() - base) as usize] + out.index as usize;
        let pointwise = |node: &Node| matches!(node.op, RegionOp::Aten(op) if op.is_pointwise());
        let mut last_read: Vec<Option<usize>> = vec![None; count];
        let mut read_by_other = vec![false; count];
        let mut external_last_read: HashMap<ExternalId, usize> = HashMap::default();
        let mut values = Vec::with_capacity(count + ops);
        for (p, node) in self.pending.iter().enumerate() {
            let reader_pointwise = pointwise(node);
            let mut scalar_bytes = 0;
            for input in &node.inputs {
                match input.value {
                    ValueRef::Pending(out) => {
                        let s = slot(out);
                        last_read[s] = Some(p);
                        read_by_other[s] |= !reader_pointwise || input.view.is_some();
                    }
                    ValueRef::External(e) => {
                        external_last_read.insert(e, p);
                    }
                }
                if input.offset.is_some() {
                    scalar_bytes += DType::I64.size_bytes() as u64;
                }
            }
            scalar_bytes += node
                .meta
                .scalar_dtypes
                .iter()
                .take(node.scalars.len())
                .map(|d| d.size_bytes() as u64)
                .sum::<u64>();
            if scalar_bytes > 0 {
                values.push(ValueLife {
                    bytes: scalar_bytes,
                    def: p,
                    last_read: Some(p),
                    role: MemoryRole::Scalars,
                });
            }
        }
        // Externals a storage holds (or whose buffer an in-place result takes over) outlive
        // the pending ops; the others die once their last reader has run.
        let mut held_externals: HashSet<ExternalId> = HashSet::default();
        for (&(storage, version), &e) in &self.external_of {
            if let Some(st) = self.storages.get(&storage) {
                if st.version == version || self.overwritten.get(&storage) == Some(&e) {
                    held_externals.insert(e);
                }
            }
        }
        // An append that takes over the buffer of the value it extends (`append_donor`, last
        // read there) costs nothing new: the value lives on as its result.
        let mut donated_appends: HashSet<NodeOutput> = HashSet::default();
        let mut donor_externals: HashSet<ExternalId> = HashSet::default();
        if self.donate {
            for (p, node) in self.pending.iter().enumerate() {
                let out = node.id.output(0);
                if let Some(e) = self.append_donor(node) {
                    if external_last_read.get(&e) == Some(&p) && self.holders.contains_key(&out) {
                        donated_appends.insert(out);
                        donor_externals.insert(e);
                    }
                }
            }
        }
        for (e, &last) in &external_last_read {
            if held_externals.contains(e) || donor_externals.contains(e) {
                continue;
            }
            if let Some(ext) = self.externals.get(e) {
                values.push(ValueLife {
                    bytes: ext.ty.nbytes(),
                    def: 0,
                    last_read: Some(last),
                    role: MemoryRole::Argument,
                });
            }
        }
        for (p, node) in self.pending.iter().enumerate() {
            for (k, ty) in node.meta.outputs.iter().enumerate() {
                let out = node.id.output(k as u32);
                let s = first[p] + k;
                let role = match self.holders.get(&out) {
                    Some(_) if donated_appends.contains(&out) => MemoryRole::DonatedOutput,
                    Some(list)
                        if self.donate
                            && list.len() == 1
                            && self.overwritten.contains_key(&list[0]) =>
                    {
                        MemoryRole::DonatedOutput
                    }
                    Some(_) => MemoryRole::Output,
                    None if node.is_side_effecting() => MemoryRole::Output,
                    None => MemoryRole::Temp {
                        materialized: !pointwise(node) || read_by_other[s],
                    },
                };
                values.push(ValueLife {
                    bytes: ty.nbytes(),
                    def: p,
                    last_read: last_read[s],
                    role,
                });
            }
        }
        plan_cuts(&values, ops)
    }
}
