"""Sequences grown by appends (RFC 0028): `torch.cat([seq, piece], dim)` along the sequence's
outermost non-unit dimension, step after step, writes into a buffer with room to grow, so a
decoding loop stops compiling once its appends reach a steady shape. Values equal the CPU's,
results never alias their inputs, and PyTorch sees true sizes."""

import warnings

import pytest
import torch

import torch_pjrt


def grow(seq: torch.Tensor, steps: int, piece: int = 1) -> list[torch.Tensor]:
    """Appends `piece` new elements per step, each computed from the sequence's end (as a
    generated token is), and returns every step's sequence."""
    seen = [seq]
    for _ in range(steps):
        nxt = (seq[:, -piece:] * 3 + 1) % 1000
        seq = torch.cat([seq, nxt], dim=-1)
        seen.append(seq)
    return seen


def test_a_growing_sequence_settles_on_one_set_of_programs(mode):
    start = torch.arange(8).reshape(1, 8)
    expected = grow(start, 40)
    with torch.no_grad():
        compiles = []
        seq = start.to("pjrt")
        for step in range(40):
            nxt = (seq[:, -1:] * 3 + 1) % 1000
            seq = torch.cat([seq, nxt], dim=-1)
            # A read each step, as a stopping check is: the loop is materialized step by step.
            assert seq[0, -1].item() == expected[step + 1][0, -1].item()
            compiles.append(torch_pjrt.metrics()["compilations"])
    assert torch.equal(seq.cpu(), expected[-1])
    assert seq.shape == (1, 48) and seq.is_contiguous() and seq.stride() == (48, 1)
    # The storage holds the capacity; the tensor only its true elements.
    assert seq.untyped_storage().nbytes() >= 256 * 8
    m = torch_pjrt.metrics()
    assert m["capacity_buffers"] == 1, m["capacity_buffers"]
    assert m["capacity_appends"] == 40
    # The first appends compile the loop's programs; every later one runs them again.
    assert compiles[-1] == compiles[2], compiles


def test_the_result_of_an_append_is_a_tensor_of_its_own(pjrt):
    with torch.no_grad():
        seq = torch.arange(6).reshape(1, 6).to(pjrt)
        grown = grow(seq, 3)
        longer = grown[-1]
        # Another branch from an earlier step (beam search keeps several).
        branch = torch.cat([grown[1], torch.full((1, 1), 77, device=pjrt)], dim=-1)
        longer[0, 0] = 99
        branch[0, 1] = 55
        expected = grow(torch.arange(6).reshape(1, 6), 3)
        for got, want in zip(grown[:-1], expected[:-1]):
            assert torch.equal(got.cpu(), want)
        want_longer = expected[-1].clone()
        want_longer[0, 0] = 99
        assert torch.equal(longer.cpu(), want_longer)
        want_branch = torch.cat([expected[1], torch.full((1, 1), 77)], dim=-1)
        want_branch[0, 1] = 55
        assert torch.equal(branch.cpu(), want_branch)


def test_a_sequence_that_outgrows_its_capacity_moves_to_a_larger_one(pjrt):
    start = torch.arange(10, dtype=torch.float32).reshape(1, 1, 10)
    with torch.no_grad():
        seq, cpu = start.to(pjrt), start
        for step in range(12):
            piece = torch.full((1, 1, 40), float(step))
            seq = torch.cat([seq, piece.to(pjrt)], dim=2)
            cpu = torch.cat([cpu, piece], dim=2)
            assert seq.untyped_storage().nbytes() >= seq.numel() * 4
    assert torch.equal(seq.cpu(), cpu)
    assert torch_pjrt.metrics()["capacity_buffers"] >= 2


def test_appends_that_autograd_records_or_that_do_not_grow_at_the_end_are_plain_cats(pjrt):
    # Autograd needs cat's own backward; a batch of sequences does not grow at the end of its
    # storage (row 0's end is row 1's start).
    a = torch.randn(1, 5, requires_grad=True)
    b = torch.randn(1, 1, requires_grad=True)
    pa, pb = a.detach().to(pjrt).requires_grad_(), b.detach().to(pjrt).requires_grad_()
    for _ in range(3):
        out = torch.cat([pa, pb], dim=1)
    (out * torch.arange(6.0, device=pjrt)).sum().backward()
    (torch.cat([a, b], dim=1) * torch.arange(6.0)).sum().backward()
    torch.testing.assert_close(pa.grad.cpu(), a.grad)
    torch.testing.assert_close(pb.grad.cpu(), b.grad)
    with torch.no_grad():
        batch = torch.arange(6).reshape(2, 3)
        seq = batch.to(pjrt)
        for _ in range(4):
            seq = torch.cat([seq, seq[:, -1:] + 1], dim=1)
            batch = torch.cat([batch, batch[:, -1:] + 1], dim=1)
        assert torch.equal(seq.cpu(), batch)
        assert seq.untyped_storage().nbytes() == seq.numel() * 8
    assert torch_pjrt.metrics()["capacity_appends"] == 0


def test_dynamic_off_turns_capacities_off(pjrt, monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_DYNAMIC", "off")
    with torch.no_grad():
        seen = grow(torch.arange(8).reshape(1, 8).to(pjrt), 5)
    assert torch.equal(seen[-1].cpu(), grow(torch.arange(8).reshape(1, 8), 5)[-1])
    assert seen[-1].untyped_storage().nbytes() == 13 * 8
    assert torch_pjrt.metrics()["capacity_appends"] == 0


def test_mark_dynamic_gives_the_first_append_its_bound(pjrt):
    # Appends of 4 elements under autograd's grad mode (not one step of a decoding loop): the
    # engine would only see the growth at the second; the mark says it at once.
    seq = torch.zeros(1, 4, device=pjrt)
    torch_pjrt.mark_dynamic(seq, 1, max=2000)
    compiles = []
    for step in range(30):
        seq = torch.cat([seq, torch.full((1, 4), float(step), device=pjrt)], dim=1)
        assert seq.untyped_storage().nbytes() >= 2000 * 4
        compiles.append(torch_pjrt.metrics()["compilations"])
        seq[0, -1].item()
    assert torch_pjrt.metrics()["capacity_buffers"] == 1
    assert compiles[-1] == compiles[2], compiles
    expected = torch.cat([torch.zeros(1, 4)] + [torch.full((1, 4), float(s)) for s in range(30)], 1)
    assert torch.equal(seq.cpu(), expected)


def test_mark_dynamic_says_what_it_cannot_take(pjrt):
    with pytest.raises(ValueError, match="pjrt device"):
        torch_pjrt.mark_dynamic(torch.zeros(1, 4), 1)
    with pytest.raises(ValueError, match="below dimension 1's size 4"):
        torch_pjrt.mark_dynamic(torch.zeros(1, 4, device=pjrt), 1, max=2)
    with pytest.raises(IndexError, match="out of range"):
        torch_pjrt.mark_dynamic(torch.zeros(1, 4, device=pjrt), 2)
    # An inner dimension is taken without a warning: the tensor is padded (test_padded_batches).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch_pjrt.mark_dynamic(torch.zeros(3, 4, 5, dtype=torch.float16, device=pjrt), 1, max=64)
    assert not caught, [str(w.message) for w in caught]
