//! Isolation cuts: where a recurring region recompiles only because a few of its ops change
//! shape (bookkeeping tensors that grow by a token per step beside a fixed-shape model step),
//! the flush runs those ops as regions of their own, so the rest keeps one cached program
//! (RFC 0027). This module answers what a flush would run, without planning it.

use super::*;

/// What a flush would run, as [`Graph::planned_region`] finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedRegion {
    /// [`crate::signature::skeleton`] of its kept ops.
    pub skeleton: u64,
    /// Each kept op's position in the pending list, in order.
    pub positions: Vec<usize>,
    /// Its [`Flush::prefix`] digests.
    pub prefix: (u64, u64),
}

impl<V: Clone> Graph<V> {
    /// The op sequence a flush of `request` would run; `None` when it would run nothing. Plans without side effects (the flush plans
    /// again), so the engine asks only when it has isolation cuts to apply.
    pub fn planned_region(
        &self,
        request: FlushRequest<'_>,
    ) -> Result<Option<PlannedRegion>, EngineError> {
        let Some(base) = self.pending.front().map(|n| n.id.seq()) else {
            return Ok(None);
        };
        let mut requested = Vec::new();
        let Some(liveness_request) = self.liveness_request(request, &mut requested) else {
            return Ok(None);
        };
        let plan = liveness::plan(&self.pending, liveness_request, |out| {
            self.holders.contains_key(&out)
        })
        .map_err(|e| EngineError::runtime(format!("internal error planning a region: {e}")))?;
        if plan.kept.is_empty() {
            return Ok(None);
        }
        let positions: Vec<usize> = plan
            .kept
            .iter()
            .map(|id| (id.seq() - base) as usize)
            .collect();
        let skeleton = crate::signature::skeleton(positions.iter().map(|&p| &self.pending[p].op));
        let prefix = self.pending[plan.region_len() - 1].clone_digests();
        Ok(Some(PlannedRegion {
            skeleton,
            positions,
            prefix,
        }))
    }
}

/// The prefix lengths to flush, in order, so that each op at one of the region's `isolated`
/// indices (into `positions`, the kept ops' pending positions) runs in a region of its own; the
/// rest of the region then runs as the flush asked. Cuts at the region's start are skipped.
pub fn isolation_cuts(positions: &[usize], isolated: &[usize]) -> Vec<usize> {
    let mut cuts: Vec<usize> = Vec::new();
    for &k in isolated {
        let Some(&p) = positions.get(k) else { continue };
        // Before the op, and after it (up to the next kept op, so dropped ops stay with it).
        cuts.push(p);
        if let Some(&next) = positions.get(k + 1) {
            cuts.push(next);
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    cuts.retain(|&c| c > 0);
    cuts
}
