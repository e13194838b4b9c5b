//! Value tests of sorting and advanced indexing on the XLA CPU PJRT plugin against hand-worked
//! results: NaN and tie order in sort/topk, nonzero and masked_select, index and index_put with
//! adjacent and separated index dims, masked_scatter, and repeat_interleave's positions and
//! the check of a given `output_size`.

mod common;

use common::*;
use ops::{DType, OpId, ScalarArg, TensorType};

fn iota(dtype: DType, shape: &[i64]) -> Host {
    let n = shape.iter().product::<i64>();
    Host::new(dtype, shape, &(0..n).map(|i| i as f64).collect::<Vec<_>>())
}

/// Each output's expected shape and values.
type Wants = Vec<(Vec<i64>, Vec<f64>)>;

#[test]
fn sorting_and_indexing_values() {
    use OpId::*;
    let nan = f64::NAN;
    let row = Host::new(DType::F32, &[1, 6], &[3.0, nan, 1.0, 3.0, -0.0, 0.0]);
    let ints = Host::new(DType::I32, &[1, 4], &[5.0, 1.0, 5.0, 2.0]);
    let x23 = Host::new(DType::F32, &[2, 3], &[0.0, 1.0, 0.0, nan, 0.0, -2.0]);
    let seq23 = Host::new(DType::F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let i64s = |v: &[f64]| Host::new(DType::I64, &[v.len() as i64], v);
    let cases: Vec<(Case, Wants)> = vec![
        // NaN sorts above every number; equal values (3, 3 and -0, 0) keep their order.
        (
            Case::new(Sort, vec![row.clone()], vec![], vec![1, 0]),
            vec![
                (vec![1, 6], vec![-0.0, 0.0, 1.0, 3.0, 3.0, nan]),
                (vec![1, 6], vec![4.0, 5.0, 2.0, 0.0, 3.0, 1.0]),
            ],
        ),
        (
            Case::new(Sort, vec![row], vec![], vec![-1, 1]),
            vec![
                (vec![1, 6], vec![nan, 3.0, 3.0, 1.0, -0.0, 0.0]),
                (vec![1, 6], vec![1.0, 0.0, 3.0, 2.0, 4.0, 5.0]),
            ],
        ),
        (
            Case::new(TopK, vec![ints.clone()], vec![], vec![2, 1, 1, 1]),
            vec![(vec![1, 2], vec![5.0, 5.0]), (vec![1, 2], vec![0.0, 2.0])],
        ),
        (
            Case::new(TopK, vec![ints], vec![], vec![2, 1, 0, 1]),
            vec![(vec![1, 2], vec![1.0, 2.0]), (vec![1, 2], vec![1.0, 3.0])],
        ),
        // NaN is nonzero; the result is [rank, count].
        (
            Case::new(Nonzero, vec![x23], vec![], vec![3]),
            vec![(vec![2, 3], vec![0.0, 1.0, 1.0, 1.0, 0.0, 2.0])],
        ),
        (
            Case::new(
                MaskedSelect,
                vec![
                    seq23.clone(),
                    Host::new(DType::Bool, &[3], &[1.0, 0.0, 1.0]),
                ],
                vec![],
                vec![4],
            ),
            vec![(vec![4], vec![1.0, 3.0, 4.0, 6.0])],
        ),
        (
            Case::new(
                MaskedScatter,
                vec![
                    seq23,
                    Host::new(DType::Bool, &[2, 3], &[1.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
                    Host::new(DType::F32, &[4], &[10.0, 20.0, 30.0, 40.0]),
                ],
                vec![],
                vec![],
            ),
            vec![(vec![2, 3], vec![10.0, 2.0, 20.0, 4.0, 5.0, 30.0])],
        ),
        // One index: in place of its dim; negative indices count from the end.
        (
            Case::new(
                Index,
                vec![iota(DType::F32, &[3, 4]), i64s(&[2.0, -1.0])],
                vec![],
                vec![1],
            ),
            vec![(vec![3, 2], vec![2.0, 3.0, 6.0, 7.0, 10.0, 11.0])],
        ),
        // Separated indices: the batch dim goes first.
        (
            Case::new(
                Index,
                vec![
                    iota(DType::F32, &[2, 3, 4]),
                    i64s(&[1.0, 0.0]),
                    i64s(&[3.0, 1.0]),
                ],
                vec![],
                vec![0, 2],
            ),
            vec![(vec![2, 3], vec![15.0, 19.0, 23.0, 1.0, 5.0, 9.0])],
        ),
        (
            Case::new(
                IndexPut,
                vec![
                    Host::new(DType::F32, &[3], &[0.0, 0.0, 0.0]),
                    Host::new(DType::F32, &[4], &[1.0, 2.0, 3.0, 4.0]),
                    i64s(&[0.0, 2.0, 0.0, 2.0]),
                ],
                vec![],
                vec![1, 0],
            ),
            vec![(vec![3], vec![4.0, 0.0, 6.0])],
        ),
        (
            Case::new(
                IndexPut,
                vec![
                    iota(DType::I32, &[2, 3]),
                    Host::new(DType::I32, &[], &[-1.0]),
                    i64s(&[2.0]),
                ],
                vec![],
                vec![0, 1],
            ),
            vec![(vec![2, 3], vec![0.0, 1.0, -1.0, 3.0, 4.0, -1.0])],
        ),
        // Zero repeats (positions 1 and 3) write nothing, also at the ends.
        (
            Case::new(
                RepeatInterleave,
                vec![Host::new(DType::I32, &[5], &[2.0, 0.0, 3.0, 0.0, 1.0])],
                vec![],
                vec![6],
            ),
            vec![(vec![6], vec![0.0, 0.0, 2.0, 2.0, 2.0, 4.0])],
        ),
        (
            Case::new(
                RepeatInterleave,
                vec![i64s(&[0.0, 2.0, 0.0])],
                vec![],
                vec![2],
            ),
            vec![(vec![2], vec![1.0, 1.0])],
        ),
        // Past the true total (a padded bucket) every position is the last one.
        (
            Case::new(RepeatInterleave, vec![i64s(&[1.0, 1.0])], vec![], vec![4]),
            vec![(vec![4], vec![0.0, 1.0, 1.0, 1.0])],
        ),
        // Verdicts `[bad, sum, total, 0, style]`: a right total, a wrong one (style 6), a
        // negative repeat whose sum is right (style 5), no repeats at all.
        (
            Case::new(
                RepeatsCheck,
                vec![i64s(&[2.0, 0.0, 3.0])],
                vec![ScalarArg::int(5)],
                vec![],
            ),
            vec![(vec![5], vec![0.0, 5.0, 5.0, 0.0, 5.0])],
        ),
        (
            Case::new(
                RepeatsCheck,
                vec![i64s(&[2.0, 0.0, 3.0])],
                vec![ScalarArg::int(4)],
                vec![],
            ),
            vec![(vec![5], vec![1.0, 5.0, 4.0, 0.0, 6.0])],
        ),
        (
            Case::new(
                RepeatsCheck,
                vec![Host::new(DType::I32, &[3], &[1.0, -1.0, 2.0])],
                vec![ScalarArg::int(2)],
                vec![],
            ),
            vec![(vec![5], vec![1.0, 2.0, 2.0, 0.0, 5.0])],
        ),
        (
            Case::new(
                RepeatsCheck,
                vec![i64s(&[])],
                vec![ScalarArg::int(0)],
                vec![],
            ),
            vec![(vec![5], vec![0.0, 0.0, 0.0, 0.0, 5.0])],
        ),
    ];
    let batch: Vec<Case> = cases.iter().map(|(c, _)| c.clone()).collect();
    let results = run_batch(&batch);
    let mut failures = Vec::new();
    for ((case, wants), got) in cases.iter().zip(results) {
        for (k, ((shape, want), out)) in wants.iter().zip(&got).enumerate() {
            let ty = TensorType::new(out.ty.dtype, shape);
            let label = format!("{} output {k}", case.op);
            if let Err(e) = compare(&label, out, &ty, want, 1.0) {
                failures.push(e);
            }
            // -0.0 and 0.0 compare equal: check the sign of sorted zeros too.
            let sign = |v: &f64| (!v.is_nan()).then_some(v.is_sign_negative());
            let signs: Vec<Option<bool>> = out.data.iter().map(sign).collect();
            let want_signs: Vec<Option<bool>> = want.iter().map(sign).collect();
            if out.ty.dtype.is_float() && signs != want_signs {
                failures.push(format!("{label}: signs {signs:?} != {want_signs:?}"));
            }
        }
    }
    report(failures);
}
