"""Batches whose length changes from step to step (a data loader padding each batch to its
longest sequence): integer uploads are padded to a bucket from the third length seen at their
site, or at once along a dimension given to `torch_pjrt.mark_dynamic`, and the model reading
them compiles once per bucket, not once per length (RFC 0029). Results equal the CPU's."""

import random

import pytest
import torch

import torch_pjrt

from conftest import seeded

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


def test_values_padded_to_different_lengths_meet_exactly(pjrt):
    # Two uploads of one marked site, of lengths 5 and 10 in one bucket: an outer product of
    # them has two extents, which no padded program covers; it runs on their exact values.
    a = torch.arange(5).reshape(1, 5)
    b = torch.arange(10).reshape(1, 10) * 3
    on_a = a.to(pjrt)
    torch_pjrt.mark_dynamic(on_a, 1, max=16)
    on_b = b.to(pjrt)
    assert torch_pjrt.metrics()["padded_uploads"] == 2
    for mode in ("strict", "defer_and_fuse"):
        with torch_pjrt.eager_mode(mode):
            assert torch.equal((on_a.T * on_b).cpu(), a.T * b)
            assert torch.equal(torch.outer(on_a[0], on_b[0]).cpu(), torch.outer(a[0], b[0]))


def tiny_bert():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.BertConfig(
        vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=3, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    on_pjrt = transformers.BertForSequenceClassification(config)
    on_pjrt.load_state_dict(model.state_dict())
    return model, on_pjrt.to("pjrt")


def padded_batch(step: int, length: int, batch: int = 4):
    """Token ids and an attention mask as a collator pads them: every row padded with zeros
    to the longest, whose length is `length`."""
    rng = random.Random(step)
    lens = [length] + [rng.randint(2, length) for _ in range(batch - 1)]
    ids = torch.randint(1, 200, (batch, length), generator=torch.Generator().manual_seed(step))
    mask = torch.zeros(batch, length, dtype=torch.long)
    for row, n in enumerate(lens):
        mask[row, :n] = 1
    return ids * mask, mask


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"], indirect=True)
def test_bert_on_batches_of_changing_length_compiles_once_per_bucket(mode):
    model, on_pjrt = tiny_bert()
    model.eval()
    on_pjrt.eval()
    seen_buckets = set()
    in_seen_buckets = []
    with torch.no_grad():
        for step, length in enumerate([62, 10, 58, 45, 16, 24, 27, 29, 35, 63, 43, 8, 31]):
            ids, mask = padded_batch(step, length)
            before = torch_pjrt.metrics()
            got = on_pjrt(input_ids=ids.to("pjrt"), attention_mask=mask.to("pjrt")).logits.cpu()
            after = torch_pjrt.metrics()
            expected = model(input_ids=ids, attention_mask=mask).logits
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
            if step < 3:
                continue  # the upload site learns that the length changes
            assert after["unpadded_values"] == before["unpadded_values"], length
            bucket = max(16, 1 << (length - 1).bit_length())
            if bucket in seen_buckets:
                in_seen_buckets.append((length, after["compilations"] - before["compilations"]))
            seen_buckets.add(bucket)
    assert len(in_seen_buckets) >= 7
    assert all(new == 0 for _, new in in_seen_buckets), in_seen_buckets


def test_bert_fine_tunes_on_padded_batches_like_the_cpu():
    model, on_pjrt = tiny_bert()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt_pjrt = torch.optim.SGD(on_pjrt.parameters(), lr=0.05)
    visits = {}
    compiles = []
    first = torch_pjrt.metrics()
    with torch_pjrt.eager_mode("defer_and_fuse"):
        for step, length in enumerate([62, 10, 58, 45, 16, 24, 27, 63, 8, 29, 20, 50]):
            ids, mask = padded_batch(step, length)
            labels = torch.randint(0, 3, (4,), generator=torch.Generator().manual_seed(step))
            before = torch_pjrt.metrics()
            losses = []
            for m, o, dev in ((model, opt, "cpu"), (on_pjrt, opt_pjrt, "pjrt")):
                o.zero_grad()
                out = m(input_ids=ids.to(dev), attention_mask=mask.to(dev), labels=labels.to(dev))
                out.loss.backward()
                o.step()
                losses.append(out.loss.item())
            after = torch_pjrt.metrics()
            assert losses[1] == pytest.approx(losses[0], rel=1e-5, abs=1e-6), (length, losses)
            if step < 3:
                continue
            # Forward and backward stay padded: nothing is cut back to the batch's length.
            assert after["unpadded_values"] == before["unpadded_values"], length
            bucket = max(16, 1 << (length - 1).bit_length())
            visits[bucket] = visits.get(bucket, 0) + 1
            compiles.append((length, visits[bucket], after["compilations"] - before["compilations"]))
    # From a bucket's second step on, a new length compiles nothing.
    revisits = [(n, new) for n, visit, new in compiles if visit >= 2]
    assert len(revisits) >= 5 and all(new == 0 for _, new in revisits), compiles
    # In all, the programs of one step (two regions: the model reads a mask on the host between
    # them) per bucket, and per exact length before the upload site pads (the first three).
    total = torch_pjrt.metrics()["compilations"] - first["compilations"]
    assert total <= 2 * (len(visits) + 3), (total, visits, compiles)


def test_a_fine_tune_without_a_read_per_step_settles_per_bucket():
    """No host read between steps (losses read once per pass): each padded batch's upload
    launches what the last step left pending, so a region never joins two steps' buckets and
    a new order of the same lengths compiles nothing. Before, regions were keyed by each pair of
    consecutive buckets and every pass in a new order compiled again."""
    import random

    model, on_pjrt = tiny_bert()
    opt = torch.optim.SGD(on_pjrt.parameters(), lr=0.05)
    lengths = [62, 10, 58, 45, 16, 24, 27, 63, 8, 29, 20, 50, 120, 100, 70]
    per_pass = []
    step = 0
    with torch_pjrt.eager_mode("defer_and_fuse"):
        for order in range(4):
            rng = random.Random(order)
            todo = lengths[:-1] if order else lengths[:]
            if order:
                rng.shuffle(todo)
                todo.append(lengths[-1])  # every pass ends on the same bucket
            before = torch_pjrt.metrics()["compilations"]
            losses = []
            for length in todo:
                ids, mask = padded_batch(step, length)
                labels = torch.randint(0, 3, (4,), generator=torch.Generator().manual_seed(step))
                step += 1
                opt.zero_grad()
                out = on_pjrt(input_ids=ids.to("pjrt"), attention_mask=mask.to("pjrt"),
                              labels=labels.to("pjrt"))
                out.loss.backward()
                opt.step()
                losses.append(out.loss.detach())
            assert torch.stack(losses).cpu().isfinite().all()
            per_pass.append(torch_pjrt.metrics()["compilations"] - before)
    # The first pass sees every bucket; the second may still meet a region of a bucket's own
    # that only a new neighbour shows (one cut where the last step of a bucket ran).
    assert per_pass[2] == 0 and per_pass[3] == 0, per_pass


def test_rows_of_a_padded_batch_picked_by_index_are_the_true_rows(mode):
    """A mixture of experts picks token rows of `[batch * length, width]` by index: true row
    `r` lies in run `r // length` of the padded value, so the table is read exact. Picking them
    as padded rows gave the second sequence's tokens from the first one's padding."""
    emb = torch.nn.Embedding(VOCAB, 8)
    on_pjrt = torch.nn.Embedding(VOCAB, 8).to("pjrt")
    on_pjrt.load_state_dict(emb.state_dict())
    ids = torch.randint(0, VOCAB, (2, 12), generator=seeded(7))
    dev_ids = ids.to("pjrt")
    torch_pjrt.mark_dynamic(dev_ids, 1, max=16)
    perm = torch.randperm(24, generator=seeded(8))
    with torch.no_grad():
        rows, dev_rows = emb(ids).reshape(-1, 8), on_pjrt(dev_ids).reshape(-1, 8)
        torch.testing.assert_close(dev_rows[perm.to("pjrt")].cpu(), rows[perm])
        torch.testing.assert_close(dev_rows.index_select(0, perm.to("pjrt")).cpu(), rows.index_select(0, perm))
        torch.testing.assert_close(
            torch.gather(dev_rows, 0, perm.to("pjrt")[:, None].expand(24, 8)).cpu(),
            torch.gather(rows, 0, perm[:, None].expand(24, 8)),
        )


def test_rows_merging_a_padded_extent_with_heads_read_back_run_by_run(mode):
    """A growing cache `[batch, heads, length, dim]` read as `[batch * heads * length, dim]`
    rows by a linear layer: each head's rows are a run of the bucket on the device, and the
    result read back on the host holds the true rows of each run, in order."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 8, generator=gen)
    cache = torch.randn(2, 4, 8, 16, generator=gen)
    on_pjrt = cache.to("pjrt")
    padded_before = torch_pjrt.metrics()["padded_ops"]
    for step in range(5):
        new = torch.randn(2, 4, 1, 16, generator=gen)
        cache = torch.cat([cache, new], dim=2)
        on_pjrt = torch.cat([on_pjrt, new.to("pjrt")], dim=2)
        got = (on_pjrt.reshape(-1, 16) @ weight.to("pjrt")).cpu()
        torch.testing.assert_close(got, cache.reshape(-1, 16) @ weight, rtol=1e-5, atol=1e-5)
    assert torch_pjrt.metrics()["padded_ops"] > padded_before, "the cache grew padded"


def test_features_joined_to_an_equal_width_are_not_a_growing_sequence(mode):
    """`cat([q_nope, q_rope], -1)` then another value of that width joined with more features
    (multi-head latent attention's query, key and padded value): equal widths at one site are
    no sequence growing, so nothing is padded, in every forward and backward."""
    gen = torch.Generator().manual_seed(1)
    parts = [torch.randn(2, 4, 8, 16, generator=gen, requires_grad=True) for _ in range(3)]
    wide = torch.randn(2, 4, 8, 32, generator=gen, requires_grad=True)

    def step(a, b, c, w):
        q = torch.cat([a, b], dim=-1)
        v = torch.cat([w, c], dim=-1)
        return (q.sum(-1, keepdim=True) * v).square().sum()

    expected = step(*parts, wide)
    expected.backward()
    want = [t.grad.clone() for t in (*parts, wide)]
    for _ in range(3):
        dev = [t.detach().to("pjrt").requires_grad_() for t in (*parts, wide)]
        before = torch_pjrt.metrics()["padded_ops"]
        loss = step(*dev)
        loss.backward()
        torch.testing.assert_close(loss.cpu(), expected.detach(), rtol=1e-5, atol=1e-4)
        for d, g in zip(dev, want):
            torch.testing.assert_close(d.grad.cpu(), g, rtol=1e-5, atol=1e-4)
        assert torch_pjrt.metrics()["padded_ops"] == before
