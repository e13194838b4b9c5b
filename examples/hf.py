"""Runs Hugging Face architectures, built from tiny configs with random weights, on pjrt.

For each architecture: the eval() forward on the CPU and on pjrt in every eager mode (time per
forward, largest error against the CPU), one backward pass of the model's own loss (timed with
its forward; largest error over the loss and the gradients), a bfloat16 forward for the decoder
language models, and the ops that fell back to the CPU. Times are the best of `--repeats` calls,
after a first call that compiles.

    python examples/hf.py gpt2 llama          # some architectures
    python examples/hf.py --all               # all of them, and a markdown table
    python examples/hf.py --list

The architectures (`ARCHS`) are also what tests/python/test_hf_models.py runs.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import time
from typing import Callable

import torch

import torch_pjrt

BATCH, SEQ, VOCAB, IMAGE = 2, 8, 96, 32
MODES = ("strict", "debug", "defer_and_fuse")


def _text_inputs(pad_last: int = 2, vocab: int = VOCAB, low: int = 3) -> dict:
    """Token ids and an attention mask whose second row is padded at the end."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(low, vocab, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ - pad_last :] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _lm_inputs() -> dict:
    inputs = _text_inputs()
    labels = inputs["input_ids"].clone()
    labels[inputs["attention_mask"] == 0] = -100
    return {**inputs, "labels": labels}


def _seq2seq_inputs() -> dict:
    inputs = _text_inputs()
    g = torch.Generator().manual_seed(2)
    return {**inputs, "labels": torch.randint(3, VOCAB, (BATCH, 5), generator=g)}


def _image_inputs(labels: bool = True) -> dict:
    g = torch.Generator().manual_seed(3)
    out = {"pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g)}
    if labels:
        out["labels"] = torch.tensor([0, 2])
    return out


def _whisper_inputs() -> dict:
    g = torch.Generator().manual_seed(4)
    return {
        "input_features": torch.randn(BATCH, 16, 24, generator=g),
        "labels": torch.randint(3, VOCAB, (BATCH, 5), generator=g),
    }


def _clip_inputs() -> dict:
    return {**_text_inputs(), **_image_inputs(labels=False), "return_loss": True}


_TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
)
_DECODER = dict(_TEXT, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
_SEQ2SEQ = dict(
    vocab_size=VOCAB,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=48,
    decoder_ffn_dim=48,
    max_position_embeddings=64,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    decoder_start_token_id=2,
)


# Config keys that count transformer layers (`build` can change them all at once).
LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layers", "n_layer", "encoder_layers", "decoder_layers")


def _with_layers(config: dict, layers: int | None) -> dict:
    if layers is None:
        return config
    return {
        k: layers if k in LAYER_KEYS else _with_layers(v, layers) if isinstance(v, dict) else v
        for k, v in config.items()
    }


@dataclasses.dataclass
class Arch:
    name: str
    model: Callable[..., torch.nn.Module]  # model(layers=None): fresh random weights (caller seeds)
    inputs: Callable[[], dict]  # CPU inputs, labels included, so the output has a loss
    decoder_lm: bool = False  # also checked in bfloat16


def _arch(name, cls, config_cls, config, inputs, decoder_lm=False) -> Arch:
    import transformers

    def model(layers=None):
        return getattr(transformers, cls)(getattr(transformers, config_cls)(**_with_layers(config, layers)))

    return Arch(name, model, inputs, decoder_lm)


def _archs() -> dict[str, Arch]:
    vision = dict(image_size=IMAGE, num_channels=3, num_labels=3)
    clip_text = dict(_TEXT, max_position_embeddings=SEQ, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    clip_vision = dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        image_size=IMAGE, patch_size=8,
    )
    archs = [
        _arch("bert", "BertForMaskedLM", "BertConfig", dict(_TEXT, max_position_embeddings=64), _lm_inputs),
        _arch(
            "roberta", "RobertaForMaskedLM", "RobertaConfig",
            dict(_TEXT, max_position_embeddings=64, pad_token_id=1), _lm_inputs,
        ),
        _arch(
            "distilbert", "DistilBertForMaskedLM", "DistilBertConfig",
            dict(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=48, max_position_embeddings=64),
            _lm_inputs,
        ),
        _arch(
            "gpt2", "GPT2LMHeadModel", "GPT2Config",
            dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=2,
                 use_cache=False),
            _lm_inputs, decoder_lm=True,
        ),
        _arch(
            "opt", "OPTForCausalLM", "OPTConfig",
            dict(
                vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=48,
                word_embed_proj_dim=32, max_position_embeddings=64, pad_token_id=1, use_cache=False,
            ),
            _lm_inputs, decoder_lm=True,
        ),
        _arch("llama", "LlamaForCausalLM", "LlamaConfig", dict(_DECODER, use_cache=False), _lm_inputs, True),
        _arch("mistral", "MistralForCausalLM", "MistralConfig", dict(_DECODER, use_cache=False), _lm_inputs, True),
        _arch("qwen2", "Qwen2ForCausalLM", "Qwen2Config", dict(_DECODER, use_cache=False), _lm_inputs, True),
        _arch(
            "t5", "T5ForConditionalGeneration", "T5Config",
            dict(
                vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                relative_attention_num_buckets=8, relative_attention_max_distance=16,
                pad_token_id=0, decoder_start_token_id=0, use_cache=False,
            ),
            _seq2seq_inputs,
        ),
        _arch("bart", "BartForConditionalGeneration", "BartConfig", dict(_SEQ2SEQ, use_cache=False), _seq2seq_inputs),
        _arch(
            "vit", "ViTForImageClassification", "ViTConfig",
            dict(vision, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                 patch_size=8),
            _image_inputs,
        ),
        _arch(
            "clip", "CLIPModel", "CLIPConfig",
            dict(text_config=clip_text, vision_config=clip_vision, projection_dim=16),
            _clip_inputs,
        ),
        _arch(
            "whisper", "WhisperForConditionalGeneration", "WhisperConfig",
            dict(
                _SEQ2SEQ, num_mel_bins=16, max_source_positions=12, max_target_positions=16,
                decoder_start_token_id=2, suppress_tokens=None, begin_suppress_tokens=None, use_cache=False,
            ),
            _whisper_inputs,
        ),
        _arch(
            "convnext", "ConvNextForImageClassification", "ConvNextConfig",
            dict(vision, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], patch_size=4),
            _image_inputs,
        ),
        _arch(
            "resnet", "ResNetForImageClassification", "ResNetConfig",
            dict(vision, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"),
            _image_inputs,
        ),
        _arch(
            "swin", "SwinForImageClassification", "SwinConfig",
            dict(vision, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4),
            _image_inputs,
        ),
    ]
    return {a.name: a for a in archs}


ARCHS = _archs()


def build(name: str, seed: int = 0, layers: int | None = None) -> tuple[torch.nn.Module, dict]:
    """A fresh eval() model on the CPU, with the weights `seed` gives (and `layers` transformer
    layers instead of the config's), and its CPU inputs."""
    arch = ARCHS[name]
    torch.manual_seed(seed)
    model = arch.model(layers).eval()
    return model, arch.inputs()


def to_device(inputs: dict, device, dtype: torch.dtype | None = None) -> dict:
    def move(v):
        if not isinstance(v, torch.Tensor):
            return v
        v = v.to(device)
        return v.to(dtype) if dtype is not None and v.is_floating_point() else v

    return {k: move(v) for k, v in inputs.items()}


def tensors(out) -> dict[str, torch.Tensor]:
    """Every tensor in a model output (ModelOutputs nest), by a dotted name."""
    found: dict[str, torch.Tensor] = {}

    def walk(prefix, value):
        if isinstance(value, torch.Tensor):
            found[prefix] = value
        elif isinstance(value, dict):  # ModelOutput is an OrderedDict
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                walk(f"{prefix}.{i}", v)

    walk("", out)
    return found


def forward(model, inputs) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return tensors(model(**inputs))


def backward(model, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One backward pass of the model's own loss: (loss, gradient of every parameter)."""
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def max_error(actual: dict, expected: dict) -> float:
    """Largest absolute difference over matching tensors (floating point compared in f32)."""
    assert actual.keys() == expected.keys(), (sorted(actual), sorted(expected))
    worst = 0.0
    for k, e in expected.items():
        a = actual[k].cpu()
        assert a.shape == e.shape and a.dtype == e.dtype, (k, a.shape, e.shape, a.dtype, e.dtype)
        if e.numel():
            worst = max(worst, (a.double() - e.double()).abs().max().item())
    return worst


def _timed(fn, sync, repeats: int) -> float:
    """Best seconds per call of `repeats`, after one warm-up call (which compiles); the best
    rather than the median, because the CPU kernels' thread pool makes single calls slow on a
    busy host."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return min(times)


def run(name: str, modes=MODES, repeats: int = 10, layers: int | None = None) -> list[dict]:
    """Rows of the report for one architecture: one per (check, mode)."""
    arch = ARCHS[name]
    cpu_model, inputs = build(name, layers=layers)
    rows = []
    checks = [("forward", torch.float32), ("backward", torch.float32)]
    if arch.decoder_lm:
        checks.append(("bf16 forward", torch.bfloat16))
    for check, dtype in checks:
        model = copy.deepcopy(cpu_model).to(dtype)
        cpu_inputs = to_device(inputs, "cpu", dtype)
        step = forward if check != "backward" else backward
        expected = step(model, cpu_inputs)
        cpu_time = _timed(lambda: step(model, cpu_inputs), lambda: None, repeats)
        for mode in modes:
            pjrt_model = copy.deepcopy(model).to("pjrt")
            pjrt_inputs = to_device(inputs, "pjrt", dtype)
            with torch_pjrt.eager_mode(mode):
                torch_pjrt.sync()
                torch_pjrt.reset_metrics()
                actual = step(pjrt_model, pjrt_inputs)
                if check == "backward":
                    error = max(max_error({"loss": actual[0]}, {"loss": expected[0]}), max_error(actual[1], expected[1]))
                else:
                    error = max_error(actual, expected)
                seconds = _timed(lambda: step(pjrt_model, pjrt_inputs), torch_pjrt.sync, repeats)
                fallbacks = torch_pjrt.metrics()["fallback_ops"]
            rows.append(
                dict(arch=name, check=check, mode=mode, max_error=error, ms=seconds * 1e3,
                     cpu_ms=cpu_time * 1e3, fallbacks=fallbacks)
            )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| architecture | check | mode | max error | ms per call | CPU ms | pjrt / CPU time | fallbacks |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        fb = sum(r["fallbacks"].values())
        fb_text = str(fb) if not fb else f"{fb} ({', '.join(sorted(r['fallbacks']))})"
        lines.append(
            f"| {r['arch']} | {r['check']} | {r['mode']} | {r['max_error']:.2e} | {r['ms']:.2f} | "
            f"{r['cpu_ms']:.2f} | {r['ms'] / r['cpu_ms']:.1f}x | {fb_text} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="architectures (see --list)")
    parser.add_argument("--all", action="store_true", help="run every architecture, print a markdown table")
    parser.add_argument("--list", action="store_true", help="list the architectures")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated eager modes")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per measurement (the best is reported)")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch intra-op threads for the CPU runs (default: torch's; 1 is steadier on a busy host)",
    )
    parser.add_argument("--layers", type=int, default=None, help="layers per stack (default: the config's, 2)")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(ARCHS))
        return 0
    names = list(ARCHS) if args.all else args.names
    unknown = [n for n in names if n not in ARCHS]
    if not names or unknown:
        parser.error(f"unknown architectures {unknown}; choose from {', '.join(ARCHS)}" if unknown else "no architecture")
    modes = [m for m in args.modes.split(",") if m]
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for name in names:
        arch_rows = run(name, modes, args.repeats, args.layers)
        rows += arch_rows
        if not args.all:
            for r in arch_rows:
                fb = r["fallbacks"] or "none"
                print(
                    f"{r['arch']:<10} {r['check']:<13} {r['mode']:<15} max error {r['max_error']:.2e}  "
                    f"{r['ms']:8.2f} ms (CPU {r['cpu_ms']:.2f} ms, {r['ms'] / r['cpu_ms']:.1f}x)  fallbacks: {fb}"
                )
        else:
            print(f"{name}: done", file=sys.stderr, flush=True)
    if args.all:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
