"""OpInfo parity: every sample of every op the engine supports, on pjrt against the CPU.

PyTorch's own op database (`torch.testing._internal.common_methods_invocations.op_db`) describes
~700 ops with sample inputs for each dtype. For every OpInfo this test runs each sample on pjrt
and on the CPU and compares the results:
- structure, dtypes and shapes exactly;
- strides by PyTorch's output layout rules: a result PyTorch makes contiguous must be
  contiguous, a non-contiguous one must have the same strides in every dimension longer than
  one (`opinfo_harness.KNOWN_LAYOUT_GAPS` lists, with the reason, the ops whose stride
  mismatches are expected failures);
- values with per-dtype tolerances (`opinfo_harness.VALUE_TOL`: the engine computes bf16/f16 in
  f32 and rounds once, as PyTorch does, but XLA's transcendental approximations and fusion's FMA
  contraction move f32 results by a few ulps). A value outside them still passes when it is at
  least as accurate as the CPU's own result, against the same sample run in float64 (within
  twice the CPU's largest error): a bf16 convolution or a float32 reduction rounds differently
  in every summation order. The summary lists the samples that passed that way;
- where the OpInfo supports autograd for a floating dtype, the gradients of the sample's inputs,
  for the same random output gradient on both devices.
Where PyTorch itself chooses an algorithm by the input's device type, the CPU reference is run
with the choice PyTorch makes for a pjrt tensor: `linear_cross_entropy`'s "auto" options
accumulate float16/bfloat16 in float32 on the CPU but in the input dtype on devices PyTorch does
not list (`opinfo_harness._device_choices`).
Random outputs (the CPU run dispatches an ATen op tagged `nondeterministic_seeded`: pjrt's
generator is not the CPU's) and uninitialized ones (`empty*`, `resize_`) are compared without
values, and random ones without gradients.

What "supported" means: a sample counts as supported when it runs on pjrt without any CPU
fallback. The test runs with `TORCH_PJRT_FALLBACK=error`, so the first ATen op without a pjrt
kernel raises a `NotImplementedError` naming it; that sample is skipped with the reason
"falls back to CPU: aten::X". A sample that needs a feature the engine refuses (a
`NotImplementedError`, or a `TypeError` for a dtype pjrt does not store) is skipped with the
engine's message. This is the set of registered kernels plus everything PyTorch composes from
them, decided per sample rather than per op (an OpInfo often mixes natively supported samples
with samples that take another overload). An OpInfo none of whose samples runs natively is
skipped as a whole and listed under its most common reason. Any other difference, including an
error raised on pjrt where the CPU succeeds, is a mismatch and fails the test.

Scope of a run:
- CI (default): float32, int64, bool, bfloat16 and complex64 (those the OpInfo supports on the
  CPU; complex values without gradients), in
  strict and defer_and_fuse, at most `CI_SAMPLE_CAP` samples per op and dtype, spread over the
  OpInfo's list (and shifted per dtype); gradients in defer_and_fuse;
- `TORCH_PJRT_OPINFO_FULL=1`: every dtype the OpInfo supports on the CPU (those pjrt does not
  store are listed as skips) in strict, debug and defer_and_fuse, every sample, gradients in
  every mode.

The summary (samples passed/run per dtype and mode, skips by reason, unsupported OpInfos) is
printed at the end of the session and written to `tests/python/.opinfo_summary.md`.

`TORCH_PJRT_OPINFO_SHARD=k/n` checks every n-th OpInfo from the k-th, and saves the tally to
`tests/python/.opinfo_shards/{full,ci}-k-of-n.json`; the full sweep takes hours on two cores, so
it runs in shards, and `python tests/python/opinfo_harness.py merge <the n files>` prints the
summary of them all.
"""

import pytest

import opinfo_harness as harness


@pytest.mark.parametrize("op", harness.OPS, ids=harness.op_id)
def test_opinfo(op, monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_FALLBACK", "error")
    result = harness.check_op(op)
    if result.mismatches:
        shown = "\n".join(result.mismatches[:20])
        more = len(result.mismatches) - 20
        pytest.fail(f"{len(result.mismatches)} mismatch(es):\n{shown}"
                    + (f"\n... and {more} more" if more > 0 else ""), pytrace=False)
    if result.ran == 0:
        reason = result.skip_reasons.most_common(1)[0][0] if result.skip_reasons else "no samples"
        pytest.skip(reason)
