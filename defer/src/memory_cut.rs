//! Where to cut a flush into several regions so that its late results are not allocated while
//! its early scratch is live: a memory model of an execution, and the search for the cuts it
//! favours.
//!
//! PJRT allocates every result of an execution before the execution starts. A training step
//! run as one region therefore holds every new gradient from its first op on, while the
//! forward pass's activations and the backward pass's scratch are live; op by op, the first
//! layer's weight gradient only exists once that scratch is gone. Running the ops before a
//! late, large result as a region of their own, and the rest after it, gives the step op by
//! op's peak where that is lower, and keeps everything else fused (RFC 0023).

/// What a value of the planned ops costs, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ValueLife {
    pub bytes: u64,
    /// Position of the producing op (0 for an argument).
    pub def: usize,
    /// Position of the last op of the planned ops that reads it.
    pub last_read: Option<usize>,
    pub role: Role,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Leaves the ops into a buffer of its own: a storage holds it, or a later op reads it.
    Output,
    /// Leaves the ops into the buffer of the value it replaces (donated): no new memory.
    DonatedOutput,
    /// Lives and dies inside the ops. `materialized`: XLA writes it to memory (its producer or
    /// one of its readers is not pointwise); otherwise it is fused into its readers.
    Temp { materialized: bool },
    /// A device value the ops read that nothing else holds: freed once the execution that
    /// reads it last has run.
    Argument,
    /// The scalars one op passes at run time: part of its execution's scalar buffer.
    Scalars,
}

/// A plan of several executions is taken only when it is estimated to peak lower than one by
/// at least this much (or a sixty-fourth of one's peak). Each extra execution costs a launch on
/// every run and a compile per shape bucket (a fine-tuning loop over padded batches compiled
/// three times the programs for cuts that saved kilobytes), so only a saving that could matter
/// to a device's memory is worth one.
pub(crate) const MIN_GAIN_BYTES: u64 = 1 << 20;

/// Only a value at least this large places a candidate cut (before a result, after a last
/// read): smaller ones cannot add up to [`MIN_GAIN_BYTES`] in the few cuts a plan makes.
const MIN_CUT_VALUE_BYTES: u64 = 64 << 10;

/// How many candidate cuts the plan chooses from (those of the largest values first).
const MAX_CANDIDATES: usize = 32;

/// The estimated peak of running ops `start..end` as one execution after ops `0..start` have
/// run, beyond what was live before any of them: the results of earlier executions that are
/// still held or read, the arguments still to be read, this execution's results (all allocated
/// when it starts), its scalars, and its materialized scratch at the worst position.
pub(crate) fn segment_peak(values: &[ValueLife], start: usize, end: usize) -> u64 {
    let mut held = 0;
    let mut delta = vec![0i64; end - start + 1];
    for v in values {
        let read_from = |at: usize| v.last_read.is_some_and(|r| r >= at);
        match v.role {
            Role::DonatedOutput => {}
            Role::Output => {
                if v.def < end {
                    held += v.bytes;
                }
            }
            Role::Argument => {
                if read_from(start) {
                    held += v.bytes;
                }
            }
            Role::Scalars => {
                if (start..end).contains(&v.def) {
                    held += v.bytes;
                }
            }
            Role::Temp { materialized } => {
                let Some(last) = v.last_read else { continue };
                if v.def < start {
                    // Made by an earlier execution: an argument of this one while read here.
                    if last >= start {
                        held += v.bytes;
                    }
                } else if v.def < end {
                    if last >= end {
                        held += v.bytes; // a result of this execution
                    } else if materialized {
                        delta[v.def - start] += v.bytes as i64;
                        delta[last + 1 - start] -= v.bytes as i64;
                    }
                }
            }
        }
    }
    let (mut live, mut scratch) = (0i64, 0i64);
    for d in &delta[..end - start] {
        live += d;
        scratch = scratch.max(live);
    }
    held + scratch as u64
}

/// Where the ops could be cut: before the producer of a large result (so that it is not
/// allocated while earlier scratch is live), and after the last read of a large value that
/// would be held by a later execution (an argument, or a temporary crossing one of those cuts).
fn candidates(values: &[ValueLife], ops: usize) -> Vec<usize> {
    let large = |v: &&ValueLife| v.bytes >= MIN_CUT_VALUE_BYTES;
    let mut places: Vec<(u64, usize)> = values
        .iter()
        .filter(large)
        .filter(|v| v.role == Role::Output)
        .map(|v| (v.bytes, v.def))
        .collect();
    let before_results: Vec<usize> = places.iter().map(|&(_, at)| at).collect();
    for v in values.iter().filter(large) {
        let Some(last) = v.last_read else { continue };
        let crosses = |cut: &usize| v.def < *cut && last >= *cut;
        let released = match v.role {
            Role::Argument => true,
            Role::Temp { materialized: true } => before_results.iter().any(crosses),
            _ => false,
        };
        if released {
            places.push((v.bytes, last + 1));
        }
    }
    places.retain(|&(_, at)| at > 0 && at < ops);
    // Largest first, then earliest, so the choice is deterministic.
    places.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut cuts: Vec<usize> = Vec::with_capacity(MAX_CANDIDATES);
    for (_, at) in places {
        if cuts.len() == MAX_CANDIDATES {
            break;
        }
        if !cuts.contains(&at) {
            cuts.push(at);
        }
    }
    cuts.sort_unstable();
    cuts
}

/// The cuts (ascending positions in `1..ops`) that split ops `0..ops` into executions whose
/// highest estimated peak is lowest, or none when one execution is estimated to peak as low
/// or within the margin. Among plans with the same peak, the one with fewer executions wins.
pub(crate) fn plan_cuts(values: &[ValueLife], ops: usize) -> Vec<usize> {
    let whole = segment_peak(values, 0, ops);
    let points: Vec<usize> = std::iter::once(0)
        .chain(candidates(values, ops))
        .chain(std::iter::once(ops))
        .collect();
    let n = points.len();
    // peaks[i][k]: ops `points[i]..points[k]` as one execution.
    let mut peaks = vec![vec![0u64; n]; n];
    for i in 0..n {
        for k in i + 1..n {
            peaks[i][k] = segment_peak(values, points[i], points[k]);
        }
    }
    // The lowest plan peak for ops `0..points[k]`, then the fewest executions reaching it.
    let mut lowest = vec![u64::MAX; n];
    lowest[0] = 0;
    for k in 1..n {
        lowest[k] = (0..k)
            .map(|i| lowest[i].max(peaks[i][k]))
            .min()
            .expect("a first point");
    }
    let peak = lowest[n - 1];
    if whole.saturating_sub(peak) < MIN_GAIN_BYTES.max(whole / 64) {
        return Vec::new();
    }
    let mut fewest: Vec<(usize, usize)> = vec![(usize::MAX, 0); n];
    fewest[0] = (0, 0);
    for k in 1..n {
        for i in 0..k {
            if fewest[i].0 != usize::MAX && peaks[i][k] <= peak && fewest[i].0 + 1 < fewest[k].0 {
                fewest[k] = (fewest[i].0 + 1, i);
            }
        }
    }
    let mut cuts = Vec::new();
    let mut k = n - 1;
    while fewest[k].1 != 0 {
        k = fewest[k].1;
        cuts.push(points[k]);
    }
    cuts.reverse();
    cuts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unit of the sizes below: large enough that the cuts they plan save what a cut must.
    const MIB: u64 = 1 << 20;
    const KIB: u64 = 1 << 10;

    fn temp(bytes: u64, def: usize, last_read: usize) -> ValueLife {
        ValueLife {
            bytes,
            def,
            last_read: Some(last_read),
            role: Role::Temp { materialized: true },
        }
    }

    fn output(bytes: u64, def: usize) -> ValueLife {
        ValueLife {
            bytes,
            def,
            last_read: None,
            role: Role::Output,
        }
    }

    fn scalars(bytes: u64, def: usize) -> ValueLife {
        ValueLife {
            bytes,
            def,
            last_read: Some(def),
            role: Role::Scalars,
        }
    }

    /// A two-layer MLP's step: hidden pre-activation h, activation r, logits, their gradient,
    /// the hidden gradient before and after the activation's mask, the weight gradients, then
    /// an optimizer update (in place) with its scalars.
    fn mlp_step() -> (Vec<ValueLife>, usize) {
        let values = vec![
            temp(32 * MIB, 0, 1), // 0: h = x @ w1 + b1
            temp(32 * MIB, 1, 6), // 1: r = relu(h), read by dW2 and the mask
            temp(MIB, 2, 3),      // 2: logits
            temp(MIB, 3, 5),      // 3: dlogits
            output(10 * MIB, 4),  // 4: dW2 = dlogits^T @ r
            temp(32 * MIB, 5, 6), // 5: dr = dlogits @ w2
            temp(32 * MIB, 6, 7), // 6: dh = dr * (r > 0)
            output(128 * MIB, 7), // 7: dW1 = dh^T @ x
            scalars(32, 8),       // 8: the update's learning rate
        ];
        (values, 9)
    }

    #[test]
    fn a_late_large_gradient_runs_apart_from_the_scratch_before_it() {
        let (values, ops) = mlp_step();
        // One execution: both gradients and the scalars, plus r, dr and dh live at once.
        assert_eq!(segment_peak(&values, 0, ops), 138 * MIB + 32 + 96 * MIB);
        // Cut before dW1 (dh crosses) and after its last read: the first part allocates only
        // dW2 and dh, and peaks at r, dlogits and dr; the second holds dh and both gradients;
        // the update runs once dh is gone.
        assert_eq!(segment_peak(&values, 0, 7), 10 * MIB + 32 * MIB + 65 * MIB);
        assert_eq!(segment_peak(&values, 7, 8), 138 * MIB + 32 * MIB);
        assert_eq!(segment_peak(&values, 8, 9), 138 * MIB + 32);
        assert_eq!(plan_cuts(&values, ops), vec![7, 8]);
    }

    #[test]
    fn no_cut_for_a_saving_under_a_mebibyte() {
        // The same step a thousand times smaller: the same cuts would save 64 KiB, not worth
        // two more launches per step and two more compiles per shape.
        let (values, ops) = mlp_step();
        let small: Vec<ValueLife> = values
            .into_iter()
            .map(|v| ValueLife {
                bytes: if v.role == Role::Scalars {
                    v.bytes
                } else {
                    v.bytes / MIB * KIB
                },
                ..v
            })
            .collect();
        assert!(segment_peak(&small, 0, ops) - segment_peak(&small, 7, 8) < MIN_GAIN_BYTES);
        assert_eq!(plan_cuts(&small, ops), Vec::<usize>::new());
    }

    #[test]
    fn no_cut_when_the_results_come_first_or_are_small() {
        let (mut values, ops) = mlp_step();
        // dW1 produced before the scratch: cutting before it frees nothing.
        values[7].def = 0;
        values[6].last_read = Some(6);
        assert_eq!(plan_cuts(&values, ops), Vec::<usize>::new());
        // Only small results and temporaries: no candidates.
        let small = vec![temp(2 * KIB, 0, 2), output(KIB, 1), output(KIB, 2)];
        assert_eq!(plan_cuts(&small, 3), Vec::<usize>::new());
    }

    #[test]
    fn no_cut_when_what_crosses_it_costs_what_it_saves() {
        // Everything live before the late result is read by its producer: it all crosses any
        // cut before it, and the second part holds it beside the result, as one execution does.
        let values = vec![
            temp(64 * MIB, 0, 2),
            temp(8 * MIB, 1, 2),
            output(64 * MIB, 2),
        ];
        assert_eq!(segment_peak(&values, 0, 3), 64 * MIB + 72 * MIB);
        assert_eq!(segment_peak(&values, 2, 3), 64 * MIB + 72 * MIB);
        assert_eq!(plan_cuts(&values, 3), Vec::<usize>::new());
    }

    #[test]
    fn an_argument_is_held_until_the_execution_that_reads_it_last_ends() {
        let argument = ValueLife {
            bytes: 64 * MIB,
            def: 0,
            last_read: Some(0),
            role: Role::Argument,
        };
        let values = vec![argument, temp(64 * MIB, 1, 2), output(8 * MIB, 2)];
        assert_eq!(segment_peak(&values, 0, 3), 8 * MIB + 128 * MIB);
        assert_eq!(segment_peak(&values, 1, 3), 8 * MIB + 64 * MIB);
        assert_eq!(plan_cuts(&values, 3), vec![1]);
    }

    #[test]
    fn donated_results_and_unmaterialized_temporaries_cost_nothing() {
        let values = vec![
            ValueLife {
                bytes: 512 * MIB,
                def: 0,
                last_read: None,
                role: Role::DonatedOutput,
            },
            ValueLife {
                bytes: 512 * MIB,
                def: 0,
                last_read: Some(1),
                role: Role::Temp {
                    materialized: false,
                },
            },
            output(4 * MIB, 1),
        ];
        assert_eq!(segment_peak(&values, 0, 2), 4 * MIB);
    }
}
