"""`torch.repeat_interleave` with a tensor of repeats on pjrt: `repeat_interleave.Tensor` runs on
the device (PyTorch's composite `repeat_interleave.self_Tensor` selects rows with its result), in
every mode, with no CPU fallback (the `mode` fixture checks). Without `output_size` the total is
read from the data (one host read, which also finds a negative repeat); with it nothing is read
and a check on the device raises PyTorch's error at the next read. A loop whose totals change
runs padded to the total's bucket, so it compiles once per bucket."""

import pytest
import torch

import torch_pjrt

from conftest import check_against_cpu, seeded


def both(fn, *tensors):
    """`fn` on the CPU tensors and on their pjrt copies: (expected, got on the CPU)."""
    expected = fn(*tensors)
    got = fn(*[t.to("pjrt") for t in tensors])
    assert got.device.type == "pjrt"
    return expected, got.cpu()


def assert_same(expected, got):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(
    "repeats",
    [[2, 0, 3, 1], [0, 0, 4], [1], [0], [5, 0], []],
    ids=["mixed", "leading_zeros", "one", "zero", "trailing_zero", "empty"],
)
def test_positions_match_the_cpu(mode, dtype, repeats):
    r = torch.tensor(repeats, dtype=dtype)
    assert_same(*both(torch.repeat_interleave, r))
    total = int(r.sum())
    assert_same(*both(lambda t: torch.repeat_interleave(t, output_size=total), r))


@pytest.mark.parametrize("dim", [None, 0, 1, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_rows_match_the_cpu(mode, dim, dtype):
    x = (torch.randn(3, 4, generator=seeded(1)) * 4).to(dtype)
    size = x.numel() if dim is None else x.shape[dim]
    r = torch.randint(0, 4, (size,), generator=seeded(2))
    assert_same(*both(lambda t, k: torch.repeat_interleave(t, k, dim=dim), x, r))
    total = int(r.sum())
    assert_same(
        *both(lambda t, k: torch.repeat_interleave(t, k, dim=dim, output_size=total), x, r)
    )


def test_one_repeat_for_every_row_and_a_0d_repeat(mode):
    x = torch.randn(3, 2, generator=seeded(3))
    assert_same(*both(lambda t, k: torch.repeat_interleave(t, k, dim=0), x, torch.tensor([3])))
    assert_same(*both(lambda t, k: torch.repeat_interleave(t, k), x, torch.tensor(2)))
    assert_same(
        *both(lambda t, k: torch.repeat_interleave(t, k, dim=1, output_size=4), x, torch.tensor(2))
    )


def test_empty_inputs(mode):
    empty_rows = torch.zeros(0, 3)
    none = torch.tensor([], dtype=torch.int64)
    assert_same(*both(lambda t, k: torch.repeat_interleave(t, k, dim=0), empty_rows, none))
    # Zero repeats of every row: an empty result with the other dims kept.
    x = torch.randn(2, 3, generator=seeded(4))
    assert_same(*both(lambda t, k: torch.repeat_interleave(t, k, dim=0), x, torch.tensor([0, 0])))
    # No repeats make nothing, whatever size was asked for (as PyTorch's kernels).
    assert_same(*both(lambda k: torch.repeat_interleave(k, output_size=3), none))


@pytest.mark.parametrize("dim", [0, 1])
def test_gradients_match_the_cpu(mode, dim):
    x = torch.randn(3, 5, generator=seeded(5))
    r = torch.tensor([2, 0, 3] if dim == 0 else [1, 3, 0, 2, 1])
    check_against_cpu(lambda t, k: torch.repeat_interleave(t, k, dim=dim) * 1.5, [x, r])
    total = int(r.sum())
    check_against_cpu(
        lambda t, k: torch.repeat_interleave(t, k, dim=dim, output_size=total).tanh(), [x, r]
    )


def test_negative_repeats_raise_at_the_op_without_output_size(mode):
    with pytest.raises(RuntimeError, match="^repeats can not be negative$"):
        torch.repeat_interleave(torch.tensor([1, -1, 2]))
    with pytest.raises(RuntimeError, match="^repeats can not be negative$"):
        torch.repeat_interleave(torch.tensor([1, -1, 2], device="pjrt"))
    with pytest.raises(RuntimeError, match="^repeats can not be negative$"):
        torch.repeat_interleave(torch.ones(3, device="pjrt"), torch.tensor([1, -2, 1], device="pjrt"))
    # The engine stays usable.
    assert torch.repeat_interleave(torch.tensor([1, 2], device="pjrt")).tolist() == [0, 1, 1]


@pytest.mark.parametrize(
    "repeats, output_size, message",
    [
        ([1, -1, 2], 2, "repeats can not be negative"),
        ([1, 1, 2], 3, "allocated size does not match required size"),
        ([1, -1, 2], 5, "allocated size does not match required size"),
    ],
)
def test_a_wrong_output_size_raises_at_the_next_read(mode, repeats, output_size, message):
    with pytest.raises(RuntimeError, match=message):
        torch.repeat_interleave(torch.tensor(repeats), output_size=output_size)
    on_pjrt = torch.tensor(repeats, device="pjrt")
    if mode == "debug":
        # Debug waits for every op and its checks: the error names the op's line.
        with pytest.raises(RuntimeError, match=message):
            torch.repeat_interleave(on_pjrt, output_size=output_size)
    else:
        # The device reads nothing at the op: PyTorch's error comes with the next read.
        got = torch.repeat_interleave(on_pjrt, output_size=output_size)
        with pytest.raises(RuntimeError, match=message):
            got.cpu()
    torch_pjrt.sync()
    assert torch.repeat_interleave(torch.tensor([2, 1], device="pjrt"), output_size=3).tolist() == [0, 0, 1]


def test_pytorch_errors_for_bad_arguments(mode):
    on_pjrt = torch.tensor([[1, 2]], device="pjrt")
    with pytest.raises(RuntimeError, match="^repeat_interleave only accept 1D vector as repeat$"):
        torch.repeat_interleave(on_pjrt)
    with pytest.raises(NotImplementedError, match="\"repeat_interleave_pjrt\" not implemented for 'Float'"):
        torch.repeat_interleave(torch.tensor([1.0, 2.0], device="pjrt"))
    x = torch.ones(2, 3, device="pjrt")
    with pytest.raises(RuntimeError, match=r"repeats must have the same size as input along dim, but got "
                       r"repeats.size\(0\) = 3 and input.size\(0\) = 2"):
        torch.repeat_interleave(x, torch.tensor([1, 2, 3], device="pjrt"), dim=0)
    with pytest.raises(RuntimeError, match="repeats must be 0-dim or 1-dim tensor"):
        torch.repeat_interleave(x, on_pjrt, dim=0)
    with pytest.raises(RuntimeError, match=r"Trying to create tensor with negative dimension -1: \[-1\]"):
        torch.repeat_interleave(torch.tensor([1, 2], device="pjrt"), output_size=-1)


def regulate(hidden, durations, weight):
    """A length regulator (FastSpeech's): each token's row repeated for its duration in frames,
    then a layer over the frames and their sum."""
    frames = torch.repeat_interleave(hidden, durations, dim=0)
    return torch.relu(frames @ weight).sum(0), frames.shape[0]


def test_changing_totals_compile_once_per_bucket(mode):
    weight = torch.randn(8, 8, generator=seeded(6))
    on_pjrt = weight.to("pjrt")
    compiles, totals = [], []
    for step in range(10):
        gen = seeded(100 + step)
        hidden = torch.randn(6, 8, generator=gen)
        durations = torch.randint(0, 6, (6,), generator=gen)
        expected, frames = regulate(hidden, durations, weight)
        got, got_frames = regulate(hidden.to("pjrt"), durations.to("pjrt"), on_pjrt)
        assert got_frames == frames
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-4)
        compiles.append(torch_pjrt.metrics()["compilations"])
        totals.append(frames)
    metrics = torch_pjrt.metrics()
    assert metrics["padded_ops"] > 0
    assert metrics["unpadded_values"] == 0, "every reader of the repeated rows ran padded"
    # From the third step (the site's total has changed) a total in a bucket already seen
    # compiles nothing.
    buckets = [max(16, 1 << (n - 1).bit_length()) for n in totals]
    assert len(set(buckets[1:])) < len(buckets) - 1, f"the totals {totals} must repeat a bucket"
    for step in range(3, len(totals)):
        if buckets[step] in buckets[1:step]:
            assert compiles[step] == compiles[step - 1], (totals, compiles)
