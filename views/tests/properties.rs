//! Property tests: decompose and invert against the strided-memory reference model.

mod common;

use common::{base_array, bytes, config, strided_case, view_case, ViewCall};
use proptest::prelude::*;
use views::eval::{eval_chain, eval_write, HostArray};
use views::reference::StridedMemory;
use views::{decompose, has_internal_overlap, invert, Layout, MemOverlap, ViewError, WriteStep};

fn check_read(base_len: i64, base_elem_size: usize, view: &Layout, seed: u64) -> views::Chain {
    let base = base_array(base_len, base_elem_size, seed);
    let chain = decompose(base_len, base_elem_size, view)
        .unwrap_or_else(|e| panic!("decompose {view:?} on {base_len}: {e}"));
    assert_eq!(chain.output_shape().unwrap(), view.sizes, "{chain}");
    let got = eval_chain(&chain, &base).unwrap_or_else(|e| panic!("{chain}: {e}"));
    let expected = StridedMemory::new(base.bytes.clone()).read(view);
    assert_eq!(got, expected, "chain {chain} for {view:?} on {base_len}");
    chain
}

/// Writes through the view and compares with the reference; `None` when the write is refused.
fn check_write(
    base_len: i64,
    base_elem_size: usize,
    view: &Layout,
    seed: u64,
) -> Option<views::WriteProgram> {
    let base = base_array(base_len, base_elem_size, seed);
    let update = HostArray::new(
        view.elem_size,
        &view.sizes,
        bytes(seed ^ 0xABCD, view.numel() as usize * view.elem_size),
    );
    match invert(base_len, base_elem_size, view) {
        Err(ViewError::InternalOverlap) => {
            assert_eq!(has_internal_overlap(view), MemOverlap::Yes, "{view:?}");
            None
        }
        Err(e) => panic!("invert {view:?} on {base_len}: {e}"),
        Ok(program) => {
            assert_ne!(has_internal_overlap(view), MemOverlap::Yes);
            let got =
                eval_write(&program, &base, &update).unwrap_or_else(|e| panic!("{program}: {e}"));
            let mut memory = StridedMemory::new(base.bytes.clone());
            memory.write(view, &update);
            assert_eq!(got.shape.as_slice(), [base_len]);
            assert_eq!(got.elem_size, base_elem_size);
            assert_eq!(
                got.bytes, memory.bytes,
                "program {program} for {view:?} on {base_len}"
            );
            Some(program)
        }
    }
}

proptest! {
    #![proptest_config(config(3000))]

    /// Reads of tensors reached by PyTorch view calls; without diagonals (which add strides)
    /// such views are strided sub-boxes, so no gather is ever needed.
    #[test]
    fn view_calls_read_like_strided_memory(case in view_case()) {
        let chain = check_read(case.base_len, case.base_elem_size, &case.view, case.seed);
        let diagonal = case.calls.iter().any(|c| matches!(c, ViewCall::Diagonal { .. }));
        if !diagonal {
            prop_assert!(!chain.has_gather(), "{chain} for {:?}", case.view);
        }
        prop_assert!(chain.len() <= 8, "{chain}");
    }

    /// Writes through tensors reached by PyTorch view calls; expanded ones are refused.
    #[test]
    fn view_calls_write_like_strided_memory(case in view_case()) {
        let program = check_write(case.base_len, case.base_elem_size, &case.view, case.seed);
        let expanded = case.calls.iter().any(ViewCall::is_expand)
            && has_internal_overlap(&case.view) == MemOverlap::Yes;
        prop_assert_eq!(program.is_none(), expanded);
        let diagonal = case.calls.iter().any(|c| matches!(c, ViewCall::Diagonal { .. }));
        if let (Some(program), false) = (program, diagonal) {
            prop_assert!(!program.has_scatter(), "{}", program);
        }
    }
}

proptest! {
    #![proptest_config(config(2000))]

    /// Arbitrary `as_strided` reads, overlapping ones included.
    #[test]
    fn as_strided_reads_like_strided_memory(case in strided_case()) {
        check_read(case.base_len, case.base_elem_size, &case.view, case.seed);
    }

    /// Arbitrary `as_strided` writes: last writer in row-major order wins.
    #[test]
    fn as_strided_writes_like_strided_memory(case in strided_case()) {
        let program = check_write(case.base_len, case.base_elem_size, &case.view, case.seed);
        if let Some(program) = program {
            if let WriteStep::Scatter { indices } = &program.step {
                let mut sorted = indices.to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                prop_assert_eq!(sorted.len(), indices.len(), "scatter indices must be unique");
            }
        }
    }
}
