"""The models and data the distributed tests train, shared by the workers and the single-process
reference (same seeds, so every process builds the same initial weights and batches)."""

import torch


class TinyGPT(torch.nn.Module):
    """Two pre-norm transformer blocks over a small vocabulary."""

    def __init__(self, vocab=64, width=32, heads=2, layers=2, length=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.randn(length, width) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)
        self.length = length

    def forward(self, ids):
        n = ids.shape[1]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(n, device=ids.device)
        h = self.embed(ids) + self.position[:n]
        h = self.blocks(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))


def build(name):
    torch.manual_seed(0)
    if name == "mlp":
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
            torch.nn.Linear(64, 4),
        )
        return model, torch.nn.functional.cross_entropy
    if name == "tinygpt":
        model = TinyGPT()

        def loss_fn(logits, targets):
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

        return model, loss_fn
    raise ValueError(f"unknown model {name!r}")


def global_batches(name, steps, batch=8):
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        if name == "mlp":
            yield torch.randn(batch, 16, generator=gen), torch.randint(0, 4, (batch,), generator=gen)
        else:
            ids = torch.randint(0, 64, (batch, 17), generator=gen)
            yield ids[:, :-1], ids[:, 1:]
