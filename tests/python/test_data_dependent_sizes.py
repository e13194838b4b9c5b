"""Results whose size depends on the data: `nonzero` (and `torch.where(mask)`, boolean
indexing) and `masked_select`. Once a site's count has changed, its results are padded to the
count's bucket, so what reads them (rows picked by the selected positions, their products, the
`index_add_` back into a dense tensor, as a mixture of experts routes tokens) compiles once per
bucket, not once per count. Values equal the CPU's in every mode."""

import pytest
import torch

import torch_pjrt

from conftest import seeded


def route(x, mask, weight, acc):
    """A mixture-of-experts step for one expert: the rows the mask selects, transformed, added
    back at their positions; plus the selected rows' sum and a masked_select."""
    idx = torch.where(mask)[0]
    picked = torch.relu(x[idx] @ weight) * 2
    acc.index_add_(0, idx, picked)
    return acc, x[mask].sum(0), torch.masked_select(x, mask[:, None]).sum()


@pytest.mark.parametrize("rows", [40])
def test_selections_of_changing_counts_compile_once_per_bucket(mode, rows):
    weight = torch.randn(16, 8, generator=seeded(0))
    on_pjrt = weight.to("pjrt")
    compiles = []
    counts = []
    for step in range(10):
        gen = seeded(step + 1)
        x = torch.randn(rows, 16, generator=gen)
        mask = torch.rand(rows, generator=gen) > 0.5
        expected = route(x, mask, weight, torch.zeros(rows, 8))
        got = route(x.to("pjrt"), mask.to("pjrt"), on_pjrt, torch.zeros(rows, 8, device="pjrt"))
        for g, e in zip(got, expected):
            torch.testing.assert_close(g.cpu(), e, rtol=1e-5, atol=1e-4)
        compiles.append(torch_pjrt.metrics()["compilations"])
        counts.append(int(mask.sum()))
    metrics = torch_pjrt.metrics()
    assert metrics["padded_ops"] > 0
    assert metrics["unpadded_values"] == 0, "every reader of the selections ran padded"
    # From the third step (the site has changed, buckets 16 and 32 seen) a count in a bucket
    # already seen compiles nothing.
    buckets = [max(16, 1 << (n - 1).bit_length()) for n in counts]
    for step in range(3, len(counts)):
        if buckets[step] in buckets[1:step]:
            assert compiles[step] == compiles[step - 1], (counts, compiles)


def test_a_count_that_never_changes_stays_exact(mode):
    x = torch.randn(24, 5, generator=seeded(3))
    mask = torch.arange(24) % 3 == 0
    before = torch_pjrt.metrics()["padded_ops"]
    for _ in range(4):
        got = x.to("pjrt")[mask.to("pjrt")]
        torch.testing.assert_close(got.cpu(), x[mask])
    assert torch_pjrt.metrics()["padded_ops"] == before


def test_writes_through_a_selection_stay_exact(mode):
    """`x[mask] = v` without accumulating would write the padded positions at index 0: it runs
    on the exact selection."""
    for step in range(4):
        gen = seeded(10 + step)
        x = torch.randn(30, 3, generator=gen)
        mask = torch.rand(30, generator=gen) > 0.4
        idx = mask.nonzero().squeeze(1)
        expected = x.clone()
        expected[idx] = -1.0
        expected.index_put_((idx,), torch.ones(len(idx), 3), accumulate=True)
        got = x.to("pjrt")
        idx_d = mask.to("pjrt").nonzero().squeeze(1)
        got[idx_d] = -1.0
        got.index_put_((idx_d,), torch.ones(len(idx), 3, device="pjrt"), accumulate=True)
        torch.testing.assert_close(got.cpu(), expected)


def test_dynamic_off_keeps_selections_exact(pjrt, monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_DYNAMIC", "off")
    x = torch.randn(36, 2, generator=seeded(5))
    for step in range(4):
        mask = torch.rand(36, generator=seeded(20 + step)) > 0.5
        torch.testing.assert_close(x.to(pjrt)[mask.to(pjrt)].cpu(), x[mask])
    assert torch_pjrt.metrics()["padded_ops"] == 0
