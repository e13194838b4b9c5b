//! Repeat cuts: a loop that never syncs is found from each node's repeat digest and KMP border
//! (kept as ops arrive), and cut between repetitions of its body (RFC 0018).

use super::*;

impl<V: Clone> Graph<V> {
    /// Extends the repetition bookkeeping to the node at `position` (every node before it is
    /// up to date): amortized constant time per node.
    pub(super) fn track_repeats(&mut self, position: usize) {
        let node = &self.pending[position];
        let digest = repeat_digest(node);
        let work: u64 = node.meta.outputs.iter().map(|t| t.numel() as u64).sum();
        let work_prefix = match position.checked_sub(1) {
            Some(previous) => self.pending[previous].work_prefix + work,
            None => work,
        };
        let anchor = self.repeat_anchor;
        let mut border = 0;
        if position > anchor {
            let previous_border = self.pending[position - 1].border as usize;
            let mut j = previous_border;
            border = loop {
                if self.pending[anchor + j].repeat_digest == digest {
                    break j + 1;
                }
                if j == 0 {
                    break 0;
                }
                j = self.pending[anchor + j - 1].border as usize;
            };
            if border == 0 && previous_border > 0 {
                // A partial match broke off: what came before does not repeat. Track from
                // here, so a loop whose first step differs still finds its period.
                self.repeat_anchor = position;
            }
        }
        let node = &mut self.pending[position];
        node.repeat_digest = digest;
        node.border = border as u32;
        node.work_prefix = work_prefix;
    }

    /// Where to cut the pending list so the device runs one stretch of a loop while the host
    /// captures the next, with every cut alike (one program). A loop is found when the ops since
    /// the tracking anchor are exactly two repetitions of a block (the fewest whole periods that
    /// make at least `min_ops` ops and `min_work` result elements): the cut takes everything up
    /// to the end of the first, and the block is remembered. From then on, ops since the anchor
    /// that repeat the remembered block are cut as soon as they are all captured, the
    /// remaining block of the two included. After a cut the list starts at a block boundary,
    /// so later cuts fall at the same place in the loop. Repetitions too small are left to grow
    /// into one region.
    pub fn repeat_cut(&mut self, min_ops: usize, min_work: u64) -> Option<usize> {
        let anchor = self.repeat_anchor;
        let n = self.pending.len().checked_sub(anchor)?;
        if let Some(cut) = self.known_block_cut(anchor) {
            return Some(cut);
        }
        let last = self.pending.back()?;
        if last.border == 0 {
            return None;
        }
        let period = n - last.border as usize;
        let before = match anchor {
            0 => 0,
            _ => self.pending[anchor - 1].work_prefix,
        };
        let period_work = (self.pending[anchor + period - 1].work_prefix - before).max(1);
        let repeats = min_ops
            .div_ceil(period)
            .max(min_work.div_ceil(period_work) as usize)
            .max(1);
        let block = period.checked_mul(repeats)?;
        if n != 2 * block {
            return None;
        }
        self.known_block.clear();
        self.known_block.extend(
            self.pending
                .range(anchor..anchor + block)
                .map(|node| node.repeat_digest),
        );
        Some(anchor + block)
    }

    /// A cut after the pending ops that repeat the known block: those from `anchor` on, or,
    /// when the whole list is as long as the block, the whole list repeating it from another of
    /// its ops. That is a loop starting anew (after a sync) that was found mid-body: the block
    /// is re-aligned to where the user's loop starts, so its cuts match the syncs (one program
    /// whether or not the loop syncs) and a sync leaves no partial block behind.
    pub(super) fn known_block_cut(&mut self, anchor: usize) -> Option<usize> {
        let len = self.known_block.len();
        let total = self.pending.len();
        if len == 0 || total < len {
            return None;
        }
        let known = &self.known_block;
        let at = |i: usize| self.pending[i].repeat_digest;
        if total - anchor == len && (0..len).all(|i| at(anchor + i) == known[i]) {
            return Some(total);
        }
        if total != len {
            return None;
        }
        // The block, or a rotation of it, that starts with this list's first op; a handful are
        // tried at most.
        let first = at(0);
        let rotation = (0..len)
            .filter(|&r| known[r] == first)
            .take(8)
            .find(|&r| (0..len).all(|i| at(i) == known[(i + r) % len]))?;
        self.known_block.rotate_left(rotation);
        Some(total)
    }
}

/// What a node computes (op, lowering variant, params, scalar count, result types), blind to
/// where its inputs come from: the same op of every repetition of a loop body has the same
/// digest whether the repetition before it is still pending or already materialized. It only
/// picks cut points (a collision costs a cut that does not repeat, never a wrong result), so
/// it is a quick multiply-rotate mix rather than the key's hash.
pub(super) fn repeat_digest(node: &Node) -> u64 {
    fn mix(h: u64, x: u64) -> u64 {
        (h.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95)
    }
    let mut h = match &node.op {
        RegionOp::Aten(op) => mix(op.id() as u64, node.meta.variant as u64),
        RegionOp::WriteView(w) => mix(0xffff, w.base_len as u64),
        RegionOp::Padded(p) => mix(0xfffe ^ p.op.id() as u64, node.meta.variant as u64),
        RegionOp::Append(a) => mix(0xfffd, a.out_bucket as u64),
    };
    for &p in &node.params {
        h = mix(h, p as u64);
    }
    h = mix(h, node.scalars.len() as u64);
    for out in &node.meta.outputs {
        h = mix(h, out.dtype.code() as u64);
        for &size in &out.shape {
            h = mix(h, size as u64);
        }
    }
    h
}
