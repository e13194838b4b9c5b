"""Batches whose length changes from step to step (a data loader padding each batch to its
longest sequence): integer uploads are padded to a bucket from the third length seen at their
site, or at once along a dimension given to `torch_pjrt.mark_dynamic`, and the model reading
them compiles once per bucket, not once per length (RFC 0029). Results equal the CPU's."""

import random

import pytest
import torch

import torch_pjrt

VOCAB, WIDTH = 50, 16


class TokenModel(torch.nn.Module):
    """Embedding, layer norm and a linear layer over `[batch, length]` ids, then a softmax,
    a sum and a max over the length."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.proj = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, ids):
        h = self.proj(self.norm(self.embed(ids)))
        weights = torch.softmax(h, dim=1)
        return (weights * h).sum(dim=1) + h.sum(dim=1) + torch.amax(h, dim=1)


def lengths(seed: int, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(5, 60) for _ in range(count)]


@pytest.mark.parametrize("batch", [1, 4])
def test_a_batch_of_changing_length_compiles_once_per_bucket(mode, batch):
    model = TokenModel()
    on_pjrt = TokenModel().to("pjrt")
    on_pjrt.load_state_dict(model.state_dict())
    # Three lengths to tell the site, then lengths across the buckets 16, 32 and 64.
    warm = [9, 23, 40]
    seen_buckets = set()
    compiles_after_warm_up = []
    with torch.no_grad():
        for step, n in enumerate(warm + lengths(batch, 12) + [16, 17, 32, 33, 64]):
            ids = torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(step))
            before = torch_pjrt.metrics()
            got = on_pjrt(ids.to("pjrt")).cpu()
            after = torch_pjrt.metrics()
            torch.testing.assert_close(got, model(ids), rtol=1e-5, atol=1e-5)
            if step < len(warm):
                continue
            bucket = max(16, 1 << (n - 1).bit_length())
            assert after["padded_uploads"] - before["padded_uploads"] == 1
            assert after["unpadded_values"] == before["unpadded_values"], n
            new = after["compilations"] - before["compilations"]
            if bucket in seen_buckets:
                compiles_after_warm_up.append((n, new))
            seen_buckets.add(bucket)
    # A length in a bucket already run compiles nothing.
    assert all(new == 0 for _, new in compiles_after_warm_up), compiles_after_warm_up
    assert len(compiles_after_warm_up) >= 10


def test_float_uploads_are_padded_only_when_marked(pjrt):
    torch_pjrt.reset_metrics()
    for n in (9, 23, 40, 31):
        torch.randn(2, n).to(pjrt)
    assert torch_pjrt.metrics()["padded_uploads"] == 0
    x = torch.randn(2, 7, 3)
    on_pjrt = x.to(pjrt)
    torch_pjrt.mark_dynamic(on_pjrt, 1, max=100)
    assert torch_pjrt.metrics()["padded_uploads"] == 1
    # PyTorch still sees the true tensor; a read gives its elements.
    assert on_pjrt.shape == (2, 7, 3) and on_pjrt.is_contiguous()
    assert torch.equal(on_pjrt.cpu(), x)
    # Later uploads like it (any length along dim 1) are padded to the mark's bucket at once.
    before = torch_pjrt.metrics()
    outs = []
    for n in (5, 77, 100, 12):
        y = torch.randn(2, n, 3)
        s = y.to(pjrt).softmax(dim=1).sum(dim=1)
        outs.append((s.cpu(), y.softmax(dim=1).sum(dim=1)))
    after = torch_pjrt.metrics()
    assert after["padded_uploads"] - before["padded_uploads"] == 4
    for got, expected in outs:
        torch.testing.assert_close(got, expected)
    # One bucket (128): the first of the four compiled, the other three reused its programs.
    assert after["compilations"] - before["compilations"] <= 3


def test_padded_batches_train_a_linear_layer_like_the_cpu(mode):
    torch.manual_seed(0)
    model = TokenModel()
    on_pjrt = TokenModel().to("pjrt")
    on_pjrt.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt_pjrt = torch.optim.SGD(on_pjrt.parameters(), lr=0.01)
    for step, n in enumerate([9, 23, 40, 17, 33, 12, 47]):
        ids = torch.randint(0, VOCAB, (3, n), generator=torch.Generator().manual_seed(step))
        losses = []
        for m, o, x in ((model, opt, ids), (on_pjrt, opt_pjrt, ids.to("pjrt"))):
            o.zero_grad()
            loss = m(x).square().mean()
            loss.backward()
            o.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-5), (n, losses)
    for p, q in zip(model.parameters(), on_pjrt.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5)
    assert torch_pjrt.metrics()["padded_ops"] > 0


def test_dynamic_off_leaves_uploads_exact(pjrt, monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_DYNAMIC", "off")
    torch_pjrt.reset_metrics()
    for n in (9, 23, 40, 31, 50):
        x = torch.randint(0, VOCAB, (2, n))
        assert torch.equal(x.to(pjrt).cpu(), x)
    assert torch_pjrt.metrics()["padded_uploads"] == 0
