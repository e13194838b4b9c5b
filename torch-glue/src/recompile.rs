//! Recompiles: which compiles rebuild a program structure already built, why (the changes
//! `defer::signature::explain` names), the recent reasons kept for `metrics()`, their log, and
//! the recompile budget that refuses (or warns about) one past its limit.

use defer::signature::{self, Change, RegionSignature};
use defer::{EngineError, ErrorKind, Mode};
use fuse::RegionOp;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

thread_local! {
    /// Recompiles recorded on this thread whose reasons still lack the user's Python line: the
    /// C ABI fills them in once the engine's locks are released (the line comes from Python,
    /// which needs the interpreter lock).
    static AWAITING_LOCATION: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Whether this thread recorded a recompile whose reason still lacks the user's line.
pub fn awaits_location_here() -> bool {
    AWAITING_LOCATION.with(|w| !w.borrow().is_empty())
}

/// How many recent reasons `metrics()["recompile_reasons"]` keeps.
pub const REASONS_KEPT: usize = 32;

/// Structures remembered to compare a compile against (cleared when full: a program whose
/// distinct structures outnumber this is not one a recompile budget would help).
const SIGNATURES_KEPT: usize = 1024;

/// Changes kept per reason (the first names the cause; the count says how many there were).
const CHANGES_KEPT: usize = 8;

/// A region is cut around its shape-changing ops (RFC 0027) only when it has at least this many
/// ops, at most one in `ISOLATE_MAX_SHARE` of them change, and it was rebuilt at least
/// `ISOLATE_AFTER` times with changes in ops alone.
pub const ISOLATE_MIN_OPS: usize = 16;
// One in three: a dynamic KV cache's decode step changes about a fifth of its ops (RFC 0027).
const ISOLATE_MAX_SHARE: usize = 3;
const ISOLATE_AFTER: u32 = 2;

/// What a recompile budget does past its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetAction {
    Raise,
    Warn,
}

/// A recompile budget: at most `limit` recompiles while it is active.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub limit: u64,
    pub action: BudgetAction,
}

impl Budget {
    /// `TORCH_PJRT_RECOMPILE_LIMIT`: `<n>` (raise past it) or `<n>:warn` / `<n>:raise`.
    pub fn parse_env(text: &str) -> Result<Budget, String> {
        let (count, action) = match text.trim().split_once(':') {
            Some((count, action)) => (count.trim(), action.trim()),
            None => (text.trim(), "raise"),
        };
        let limit = count.parse::<u64>().map_err(|_| {
            format!(
                "TORCH_PJRT_RECOMPILE_LIMIT={text}: expected a number of recompiles, \
                 optionally followed by ':warn' or ':raise' (e.g. 8 or 8:warn)"
            )
        })?;
        let action = match action {
            "raise" => BudgetAction::Raise,
            "warn" => BudgetAction::Warn,
            other => {
                return Err(format!(
                    "TORCH_PJRT_RECOMPILE_LIMIT={text}: unknown action '{other}': expected \
                     'raise' or 'warn'"
                ))
            }
        };
        Ok(Budget { limit, action })
    }
}

/// Why one compile rebuilt a structure already built.
#[derive(Clone, Debug, PartialEq)]
pub struct RecompileReason {
    /// 1 for the process's first recompile (not reset by `reset_metrics`).
    pub number: u64,
    /// The region's label (`add`, `region of 107 ops: clone, ...`).
    pub region: String,
    pub mode: Mode,
    /// The first changes, earliest op first.
    pub changes: Vec<Change>,
    pub total_changes: usize,
    /// The user's Python line that ran the op (op-by-op modes) or asked for the value
    /// (DeferAndFuse), when the Python package told the engine.
    pub location: Option<String>,
    pub shapeless_key: u64,
    pub dims_key: u64,
}

impl RecompileReason {
    /// One line: the region, the first change, how many more, where.
    pub fn message(&self) -> String {
        let mut out = format!(
            "recompile {} in {} mode of {}: ",
            self.number,
            mode_name(self.mode),
            self.region
        );
        match self.changes.first() {
            Some(first) => out.push_str(&first.to_string()),
            None => out.push_str("no change recorded"),
        }
        let more = self.total_changes.saturating_sub(1);
        if more > 0 {
            out.push_str(&format!(
                " (and {more} more change{})",
                if more == 1 { "" } else { "s" }
            ));
        }
        let op_line = self.changes.first().and_then(|c| c.location.as_deref());
        if let Some(at) = op_line {
            out.push_str(&format!(", op at {at}"));
        }
        if let Some(at) = &self.location {
            if self.mode == Mode::DeferAndFuse {
                out.push_str(&format!(", materialized at {at}"));
            } else if op_line.is_none() {
                out.push_str(&format!(", at {at}"));
            }
        }
        out
    }

    /// The user's line to name: the changed op's, where it was recorded, else the line that
    /// ran the region (the op's own in the op-by-op modes).
    pub fn user_line(&self) -> Option<&str> {
        self.changes
            .first()
            .and_then(|c| c.location.as_deref())
            .or(self.location.as_deref())
    }
}

pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Strict => "strict",
        Mode::Debug => "debug",
        Mode::DeferAndFuse => "defer_and_fuse",
    }
}

/// What the engine does with a compile the tracker was told of.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Compile it.
    Compile,
    /// Compile it, after warning with this text.
    Warn(String),
    /// Do not compile: fail the region with this error.
    Refuse(EngineError),
}

/// The engine's recompile bookkeeping (behind one lock; touched only on a compile).
#[derive(Debug, Default)]
pub struct RecompileTracker {
    signatures: HashMap<u64, RegionSignature>,
    /// Per op sequence: how many times it was rebuilt with changes confined to a few ops, and
    /// those ops' indices in the region (the union over the rebuilds).
    varying: HashMap<u64, (u32, Vec<usize>)>,
    /// Recompiles since the process started (reasons are numbered by it).
    total: u64,
    /// Recompiles since the metrics were last reset.
    counted: u64,
    reasons: VecDeque<RecompileReason>,
    /// The environment's budget: counts every recompile of the process.
    env_budget: Option<Budget>,
    /// Budgets pushed by `torch_pjrt.recompile_limit` (innermost last), each with the
    /// recompiles seen since it was pushed.
    budgets: Vec<(Budget, u64)>,
}

impl RecompileTracker {
    pub fn new(env_budget: Option<Budget>) -> Self {
        RecompileTracker {
            env_budget,
            ..Default::default()
        }
    }

    /// Told of every compile (a tier-1 miss) with its region's signature: a recompile when the
    /// same op sequence was compiled before. The verdict says whether it may compile.
    pub fn on_compile(
        &mut self,
        signature: RegionSignature,
        region: &str,
        mode: Mode,
        keys: (u64, u64),
    ) -> Verdict {
        if self.signatures.len() >= SIGNATURES_KEPT
            && !self.signatures.contains_key(&signature.skeleton)
        {
            self.signatures.clear();
        }
        let Some(previous) = self.signatures.insert(signature.skeleton, signature) else {
            return Verdict::Compile;
        };
        let current = &self.signatures[&previous.skeleton];
        let region_ops = current.ops.len();
        let mut changes = signature::explain(&previous, current);
        if changes.is_empty() {
            // The very program again: a request while its twin was still compiling, or one
            // evicted from tier 1. Not a new build of the structure.
            return Verdict::Compile;
        }
        let padded: Vec<bool> = current
            .ops
            .iter()
            .map(|op| matches!(op.op, RegionOp::Padded(_) | RegionOp::Append(_)))
            .collect();
        self.note_varying_ops(previous.skeleton, region_ops, &changes, &padded);
        let total_changes = changes.len();
        changes.truncate(CHANGES_KEPT);
        self.total += 1;
        self.counted += 1;
        let reason = RecompileReason {
            number: self.total,
            region: region.to_string(),
            mode,
            changes,
            total_changes,
            location: None,
            shapeless_key: keys.0,
            dims_key: keys.1,
        };
        let message = reason.message();
        if self.reasons.len() == REASONS_KEPT {
            self.reasons.pop_front();
        }
        self.reasons.push_back(reason);
        AWAITING_LOCATION.with(|w| w.borrow_mut().push(self.total));
        for (_, used) in self.budgets.iter_mut() {
            *used += 1;
        }
        // The innermost exceeded budget decides; the environment's counts every recompile.
        let exceeded = self
            .budgets
            .iter()
            .rev()
            .find(|(budget, used)| *used > budget.limit)
            .map(|(budget, _)| *budget)
            .or(self.env_budget.filter(|b| self.total > b.limit));
        match exceeded {
            None => Verdict::Compile,
            Some(budget) => {
                let text = format!(
                    "recompile limit of {} exceeded: {message}. Programs that change shape every \
                     step recompile every step: keep shapes fixed (pad to a few sizes, a static \
                     KV cache), mark a growing dimension with torch_pjrt.mark_dynamic, or raise \
                     the limit (torch_pjrt.recompile_limit, TORCH_PJRT_RECOMPILE_LIMIT).",
                    budget.limit
                );
                match budget.action {
                    BudgetAction::Raise => {
                        Verdict::Refuse(EngineError::new(ErrorKind::Runtime, text))
                    }
                    BudgetAction::Warn => Verdict::Warn(text),
                }
            }
        }
    }

    /// Gives the reasons recorded on this thread since its last call the user's line (or
    /// none); returns their messages, for the log.
    pub fn locate(&mut self, location: Option<String>) -> Vec<String> {
        let waiting = AWAITING_LOCATION.with(|w| std::mem::take(&mut *w.borrow_mut()));
        let mut messages = Vec::new();
        for reason in self.reasons.iter_mut() {
            if waiting.contains(&reason.number) {
                if reason.location.is_none() {
                    reason.location = location.clone();
                }
                messages.push(reason.message());
            }
        }
        messages
    }

    /// `padded[i]`: op `i` runs on padded values, whose programs change only when a bucket
    /// fills (a few times in a sequence's life), so it is never cut out; a recompile in which
    /// one of them changed is a new bucket, which changes the ops made at the bucket's size
    /// beside them too (`arange` of the bucket's length, windows read at it), and cuts nothing.
    fn note_varying_ops(
        &mut self,
        skeleton: u64,
        region_ops: usize,
        changes: &[Change],
        padded: &[bool],
    ) {
        let mut ops: Vec<usize> = Vec::new();
        for change in changes {
            match change.op_index {
                Some(i) if padded.get(i).copied().unwrap_or(false) => return,
                Some(i) => ops.push(i),
                None => return, // what the region materializes changed: not a few ops' shapes
            }
        }
        ops.sort_unstable();
        ops.dedup();
        if region_ops < ISOLATE_MIN_OPS {
            return;
        }
        let entry = self.varying.entry(skeleton).or_default();
        entry.0 += 1;
        entry.1.extend(ops);
        entry.1.sort_unstable();
        entry.1.dedup();
        if entry.1.len() * ISOLATE_MAX_SHARE > region_ops {
            // Too much of the region changes: cutting it would not leave a stable program.
            entry.1.clear();
            entry.0 = 0;
        }
    }

    /// Whether some op sequence has ops to isolate (a cheap test before planning a flush twice).
    pub fn has_isolations(&self) -> bool {
        self.varying
            .values()
            .any(|(count, ops)| *count >= ISOLATE_AFTER && !ops.is_empty())
    }

    /// The region indices of the ops to run on their own when `skeleton` is flushed: the ops
    /// whose shapes kept changing while the rest of the region stayed the same.
    pub fn isolated_ops(&self, skeleton: u64) -> Option<&[usize]> {
        match self.varying.get(&skeleton) {
            Some((count, ops)) if *count >= ISOLATE_AFTER && !ops.is_empty() => Some(ops),
            _ => None,
        }
    }

    pub fn push_budget(&mut self, budget: Budget) {
        self.budgets.push((budget, 0));
    }

    pub fn pop_budget(&mut self) -> Result<(), EngineError> {
        self.budgets.pop().map(|_| ()).ok_or_else(|| {
            EngineError::new(
                ErrorKind::Runtime,
                "recompile_limit: no recompile limit is active to leave",
            )
        })
    }

    pub fn count(&self) -> u64 {
        self.counted
    }

    pub fn reasons(&self) -> impl Iterator<Item = &RecompileReason> {
        self.reasons.iter()
    }

    /// Zeroes the count and forgets the reasons; the structures stay known (they are what a
    /// later compile is compared with, like the caches `reset_metrics` keeps).
    pub fn reset(&mut self) {
        self.counted = 0;
        self.reasons.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use defer::signature::{InputOrigin, InputSignature, OpSignature};
    use fuse::RegionOp;
    use ops::{DType, OpId, TensorType};

    fn neg(n: i64) -> RegionSignature {
        let ty = TensorType::new(DType::F32, &[n]);
        let ops = vec![OpSignature {
            op: RegionOp::Aten(OpId::Neg),
            params: Default::default(),
            scalar_kinds: Default::default(),
            variant: 0,
            inputs: smallvec::smallvec![InputSignature {
                ty: ty.clone(),
                stored: None,
                source: InputOrigin::Argument(0),
                view: None,
            }],
            outputs: smallvec::smallvec![ty],
            location: None,
        }];
        RegionSignature {
            skeleton: signature::skeleton(ops.iter().map(|o| &o.op)),
            ops,
            outputs: vec![(0, 0)],
            aliases: vec![],
        }
    }

    #[test]
    fn a_second_build_is_a_recompile_with_its_reason() {
        let mut t = RecompileTracker::new(None);
        assert_eq!(
            t.on_compile(neg(4), "neg", Mode::Strict, (1, 2)),
            Verdict::Compile
        );
        assert_eq!(t.count(), 0);
        assert_eq!(
            t.on_compile(neg(5), "neg", Mode::Strict, (1, 3)),
            Verdict::Compile
        );
        assert_eq!(t.count(), 1);
        let reason = t.reasons().last().unwrap().clone();
        assert_eq!(reason.changes[0].what, "input 0 (self) dim 0");
        assert_eq!(reason.total_changes, 2);
        assert!(awaits_location_here());
        let messages = t.locate(Some("train.py:12".into()));
        assert_eq!(
            messages,
            [
                "recompile 1 in strict mode of neg: op 0 (aten::neg): input 0 (self) dim 0 \
              changed 4 -> 5 (and 1 more change), at train.py:12"
            ]
        );
        assert!(!awaits_location_here());
    }

    #[test]
    fn a_budget_refuses_past_its_limit_and_stops_counting_when_left() {
        let mut t = RecompileTracker::new(None);
        t.on_compile(neg(1), "neg", Mode::DeferAndFuse, (0, 0));
        t.push_budget(Budget {
            limit: 1,
            action: BudgetAction::Raise,
        });
        assert_eq!(
            t.on_compile(neg(2), "neg", Mode::DeferAndFuse, (0, 0)),
            Verdict::Compile
        );
        let Verdict::Refuse(e) = t.on_compile(neg(3), "neg", Mode::DeferAndFuse, (0, 0)) else {
            panic!("the second recompile under a limit of 1 must be refused")
        };
        assert!(e.message.contains("recompile limit of 1 exceeded"), "{e}");
        assert!(
            e.message.contains("input 0 (self) dim 0 changed 2 -> 3"),
            "{e}"
        );
        t.pop_budget().unwrap();
        assert_eq!(
            t.on_compile(neg(4), "neg", Mode::DeferAndFuse, (0, 0)),
            Verdict::Compile
        );
        assert!(t.pop_budget().is_err());
    }

    /// A region of `n` negations of `[len]` whose op `varying` reads `[len + extra]` instead.
    fn chain(n: usize, varying: usize, extra: i64) -> RegionSignature {
        let mut region = neg(4);
        let op = region.ops[0].clone();
        region.ops = vec![op; n];
        region.ops[varying].inputs[0].ty = TensorType::new(DType::F32, &[4 + extra]);
        region.skeleton = signature::skeleton(region.ops.iter().map(|o| &o.op));
        region
    }

    #[test]
    fn a_few_ops_that_keep_changing_are_isolated_after_two_rebuilds() {
        let mut t = RecompileTracker::new(None);
        let skeleton = chain(20, 5, 0).skeleton;
        t.on_compile(chain(20, 5, 0), "r", Mode::DeferAndFuse, (0, 0));
        t.on_compile(chain(20, 5, 1), "r", Mode::DeferAndFuse, (0, 1));
        assert!(!t.has_isolations(), "one rebuild may be a one-off");
        t.on_compile(chain(20, 5, 2), "r", Mode::DeferAndFuse, (0, 2));
        assert!(t.has_isolations());
        assert_eq!(t.isolated_ops(skeleton), Some(&[5][..]));
        // Small regions are never cut.
        let mut t = RecompileTracker::new(None);
        for extra in 0..4 {
            t.on_compile(
                chain(8, 1, extra),
                "r",
                Mode::DeferAndFuse,
                (0, extra as u64),
            );
        }
        assert!(!t.has_isolations());
    }

    #[test]
    fn a_new_bucket_isolates_nothing() {
        // A region with an append into a padded value (op 3) and an op made at the bucket's
        // size beside it (op 5, an `arange` of the bucket's length): a new bucket changes both,
        // which is the region's program for that bucket, not a few ops to cut out.
        let mut t = RecompileTracker::new(None);
        for (n, bucket) in [16i64, 32, 64, 128].into_iter().enumerate() {
            let mut region = chain(20, 5, bucket);
            region.ops[3].op = RegionOp::Append(std::sync::Arc::new(fuse::AppendOp {
                dim: 0,
                out_bucket: bucket,
            }));
            region.skeleton = signature::skeleton(region.ops.iter().map(|o| &o.op));
            t.on_compile(region, "r", Mode::DeferAndFuse, (0, n as u64));
        }
        assert!(!t.has_isolations());
    }

    #[test]
    fn a_region_that_changes_throughout_is_not_cut() {
        let mut t = RecompileTracker::new(None);
        for n in 4..8 {
            // Every op's input and output change.
            let mut region = chain(20, 0, 0);
            for op in region.ops.iter_mut() {
                op.inputs[0].ty = TensorType::new(DType::F32, &[n]);
                op.outputs[0] = TensorType::new(DType::F32, &[n]);
            }
            t.on_compile(region, "r", Mode::DeferAndFuse, (0, n as u64));
        }
        assert!(!t.has_isolations());
    }

    #[test]
    fn the_environment_budget_counts_the_whole_process_and_can_warn() {
        let budget = Budget::parse_env("1:warn").unwrap();
        assert_eq!(budget.action, BudgetAction::Warn);
        let mut t = RecompileTracker::new(Some(budget));
        t.on_compile(neg(1), "neg", Mode::Strict, (0, 0));
        assert_eq!(
            t.on_compile(neg(2), "neg", Mode::Strict, (0, 0)),
            Verdict::Compile
        );
        t.reset();
        assert!(matches!(
            t.on_compile(neg(3), "neg", Mode::Strict, (0, 0)),
            Verdict::Warn(_)
        ));
        assert_eq!(Budget::parse_env("3").unwrap().action, BudgetAction::Raise);
        assert!(Budget::parse_env("many")
            .unwrap_err()
            .contains("expected a number"));
        assert!(Budget::parse_env("2:loud")
            .unwrap_err()
            .contains("unknown action"));
    }
}
