//! Which values of a region are computed twice instead of held: a cheap value (a pointwise op,
//! a layer or group norm) read early and again much later — an activation the backward pass
//! reads — is recomputed just before its late readers, from inputs that are alive there anyway.
//!
//! Op by op, autograd holds such values between the forward and the backward pass too; a fused
//! region holds them as XLA scratch, and on top of that every result of an execution (the new
//! gradients) is allocated when it starts. Recomputing what costs a few pointwise operations
//! pays for those results (RFC 0022).

use crate::module::{Operand, Region, RegionOp};

/// Values smaller than this are held: recomputing them saves too little.
const MIN_BYTES: usize = 1024;

/// How many ops apart (in emission order) two reads of a value must be for the later ones to
/// read a recomputed copy: closer reads are the same phase of the step.
const MIN_SPAN: usize = 16;

/// For each node, the emission position from which its readers read a recomputed copy.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct RematPlan {
    late_from: Vec<Option<usize>>,
}

impl RematPlan {
    /// `emission` lists node indices in the order the module emits them.
    pub(crate) fn plan(region: &Region, emission: &[u32]) -> RematPlan {
        let n = region.nodes.len();
        let mut position = vec![0usize; n];
        for (p, &node) in emission.iter().enumerate() {
            position[node as usize] = p;
        }
        // Every emission position at which each node's value is read.
        let mut reads: Vec<Vec<usize>> = vec![Vec::new(); n];
        // The last emission position at which each argument is read.
        let mut last_arg_read: Vec<Option<usize>> = vec![None; region.args.len()];
        for (i, node) in region.nodes.iter().enumerate() {
            for input in &node.inputs {
                match input.operand {
                    Operand::Node { node: j, .. } => reads[j as usize].push(position[i]),
                    Operand::Arg(a) => {
                        let last = &mut last_arg_read[a as usize];
                        *last = Some(last.map_or(position[i], |p| p.max(position[i])));
                    }
                }
            }
        }
        for r in &mut reads {
            r.sort_unstable();
            r.dedup();
        }
        let mut is_output = vec![false; n];
        for &o in &region.outputs {
            if let Operand::Node { node, .. } = o {
                is_output[node as usize] = true;
            }
        }
        let donated = |a: u32| region.aliases.iter().any(|&(arg, _)| arg == a);
        let mut late_from: Vec<Option<usize>> = vec![None; n];
        for &i in emission {
            let i = i as usize;
            let node = &region.nodes[i];
            if is_output[i] || !recomputable(&node.op) || node.inputs.is_empty() {
                continue;
            }
            let bytes: usize = node
                .meta
                .outputs
                .iter()
                .map(|t| t.numel() as usize * t.dtype.size_bytes())
                .sum();
            if bytes < MIN_BYTES {
                continue;
            }
            // The widest gap between the value's production and its reads.
            let mut points = Vec::with_capacity(reads[i].len() + 1);
            points.push(position[i]);
            points.extend(reads[i].iter().copied());
            let Some((_, late)) = points
                .windows(2)
                .map(|w| (w[1] - w[0], w[1]))
                .max_by_key(|&(gap, _)| gap)
                .filter(|&(gap, _)| gap >= MIN_SPAN)
            else {
                continue;
            };
            // Recomputing must not keep anything alive longer: every input is an argument that
            // no write replaces, a result of the region, or read at or after the late read
            // anyway (a donated argument too: its write waits for that read already).
            let alive_then = node.inputs.iter().all(|input| match input.operand {
                Operand::Arg(a) => {
                    !donated(a) || last_arg_read[a as usize].is_some_and(|r| r >= late)
                }
                Operand::Node { node: j, .. } => {
                    let j = j as usize;
                    late_from[j].is_none()
                        && (is_output[j] || reads[j].last().is_some_and(|&r| r >= late))
                }
            });
            if alive_then {
                late_from[i] = Some(late);
            }
        }
        RematPlan { late_from }
    }

    /// Whether the reader at emission `position` reads a recomputed copy of `node`.
    pub(crate) fn reads_copy(&self, node: u32, position: usize) -> bool {
        self.late_from
            .get(node as usize)
            .copied()
            .flatten()
            .is_some_and(|late| position >= late)
    }

    #[cfg(test)]
    pub(crate) fn recomputed(&self) -> Vec<u32> {
        (0..self.late_from.len() as u32)
            .filter(|&i| self.late_from[i as usize].is_some())
            .collect()
    }
}

/// Ops whose results are cheap to compute again and the same every time (no random numbers).
fn recomputable(op: &RegionOp) -> bool {
    match op {
        RegionOp::Aten(op) => op.is_recomputable(),
        RegionOp::WriteView(_) | RegionOp::Padded(_) | RegionOp::Append(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::module::{build_module, InputRef, RegionNode};
    use ops::OpId;
    use ops::{DType, TensorType};
    use smallvec::smallvec;

    fn node(op: OpId, inputs: &[Operand]) -> RegionNode {
        let ty = TensorType::new(DType::F32, &[64, 64]);
        let types: Vec<TensorType> = inputs.iter().map(|_| ty.clone()).collect();
        RegionNode {
            op: RegionOp::Aten(op),
            params: smallvec![],
            inputs: inputs.iter().map(|&o| InputRef::plain(o)).collect(),
            scalars: smallvec![],
            meta: ops::meta(op, &types, &[], &[]).unwrap(),
        }
    }

    fn at(node: u32) -> Operand {
        Operand::Node { node, output: 0 }
    }

    /// `exp(a)`, read right away and again `gap` ops later, after a chain of negations.
    fn read_early_and_late(gap: u32) -> Region {
        let mut nodes = vec![
            node(OpId::Exp, &[Operand::Arg(0)]),
            node(OpId::Neg, &[at(0)]),
        ];
        for k in 2..gap {
            nodes.push(node(OpId::Neg, &[at(k - 1)]));
        }
        nodes.push(node(OpId::Mul, &[at(gap - 1), at(0)]));
        Region {
            args: vec![TensorType::new(DType::F32, &[64, 64])],
            outputs: vec![at(gap)],
            nodes,
            ..Region::default()
        }
    }

    fn emission(region: &Region) -> Vec<u32> {
        (0..region.nodes.len() as u32).collect()
    }

    #[test]
    fn a_value_read_again_much_later_is_recomputed_there() {
        let region = read_early_and_late(20);
        let plan = RematPlan::plan(&region, &emission(&region));
        assert_eq!(plan.recomputed(), vec![0]);
        assert!(!plan.reads_copy(0, 1) && plan.reads_copy(0, 20));
        let module = build_module(&region).unwrap();
        assert_eq!(
            module.matches("stablehlo.exponential").count(),
            2,
            "{module}"
        );
    }

    #[test]
    fn close_reads_small_values_outputs_and_replaced_inputs_are_held() {
        let near = read_early_and_late(10);
        assert!(RematPlan::plan(&near, &emission(&near))
            .recomputed()
            .is_empty());
        let module = build_module(&near).unwrap();
        assert_eq!(
            module.matches("stablehlo.exponential").count(),
            1,
            "{module}"
        );

        let mut output = read_early_and_late(20);
        output.outputs.push(at(0));
        assert!(RematPlan::plan(&output, &emission(&output))
            .recomputed()
            .is_empty());

        // The argument's buffer becomes a result: reading it late would need it kept.
        let mut donated = read_early_and_late(20);
        donated.aliases.push((0, 0));
        assert!(RematPlan::plan(&donated, &emission(&donated))
            .recomputed()
            .is_empty());

        let mut small = read_early_and_late(20);
        small.args[0] = TensorType::new(DType::F32, &[4, 4]);
        for n in &mut small.nodes {
            n.meta.outputs[0] = TensorType::new(DType::F32, &[4, 4]);
        }
        assert!(RematPlan::plan(&small, &emission(&small))
            .recomputed()
            .is_empty());
    }

    #[test]
    fn random_numbers_are_never_drawn_twice() {
        assert!(!recomputable(&RegionOp::Aten(OpId::NativeDropout)));
        assert!(!recomputable(&RegionOp::Aten(OpId::Uniform)));
        assert!(recomputable(&RegionOp::Aten(OpId::NativeLayerNorm)));
    }
}
