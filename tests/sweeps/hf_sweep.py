#!/usr/bin/env python
"""Sweep of Hugging Face `transformers` architectures on pjrt against the CPU.

One row per model type of transformers' auto mappings: its base model class (or, for the few
types without one, its first task head) built from a tiny config (the config class's defaults with
the layer counts, widths, heads, experts, vocabulary and image sizes shrunk), random weights from a
fixed seed, no downloads. The model runs forward and backward on the CPU first; a type that does
not build or run there is recorded as unsupported on CPU. Then, in each eager mode, a copy on
"pjrt" runs the same step; its outputs and every parameter gradient are compared with the CPU's
and the ops that fell back to the CPU are recorded.

Each architecture runs in a subprocess with a wall-clock limit, so a crash or a hang costs one row
(the modes not reached yet are retried in a fresh process). Rows are appended to a JSONL file and
a rerun skips the model types already there.

    python tests/sweeps/hf_sweep.py                      # everything not yet in the results
    python tests/sweeps/hf_sweep.py --only gpt2,bert --out /tmp/r.jsonl
    python tests/sweeps/hf_sweep.py --shard 0/4 --budget-min 60
    python tests/sweeps/hf_sweep.py --list
    python tests/sweeps/hf_sweep.py --table               # the markdown tables of a results file
    python tests/sweeps/hf_sweep.py --summary             # counts and failures by cause
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import time

from sweep_common import (
    OUT_TOL,
    add_common_options,
    errors_by_name,
    escape_cell,
    exception_reason,
    failure_note,
    fallback_ops_cell,
    format_error,
    grade,
    largest_error,
    load_results,
    mode_records,
    mode_summary,
    only_names,
    parse_child_call,
    run_device_modes,
    run_in_child,
    run_sweep,
    stage_writer,
    take_shard,
    tensor_error,
)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "results", "hf_sweep.jsonl")
BATCH, SEQ, DEC_SEQ = 2, 8, 5
# Token ids of the inputs stay below the vocabulary's last ids, where special tokens are moved.
VOCAB, RESERVED = 256, 16


# --------------------------------------------------------------------------------------------
# Which architectures


def architectures() -> list[tuple[str, str]]:
    """(model type, class name): the base model where there is one, else the first task head."""
    from transformers.models.auto import modeling_auto as m

    base = m.MODEL_MAPPING_NAMES
    heads = [
        getattr(m, n)
        for n in sorted(dir(m))
        if n.startswith("MODEL_FOR_") and n.endswith("_MAPPING_NAMES")
    ]
    out = {}
    for mapping in [base, m.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, *heads]:
        for model_type, cls in mapping.items():
            if model_type not in out:
                out[model_type] = cls[0] if isinstance(cls, (tuple, list)) else cls
    return sorted(out.items())


# --------------------------------------------------------------------------------------------
# Tiny configs

LAYERS = 2  # two, so per-layer patterns (sliding/full attention, dense/MoE) keep both kinds
LAYER_KEYS = {
    "num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
    "decoder_layers", "num_encoder_layers", "num_decoder_layers", "depth",
    "num_text_layers", "num_vision_layers", "num_audio_layers",
}  # fmt: skip
WIDTH_KEYS = {
    "hidden_size", "d_model", "n_embd", "dim", "embed_dim", "model_dim", "d_embed",
    "word_embed_proj_dim", "projection_dim", "text_embed_dim", "vision_embed_dim",
    "embedding_size", "hidden_dim", "encoder_hidden_size", "projection_hidden_size",
}  # fmt: skip
HEAD_DIM_KEYS = {"head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "attention_head_dim"}
LORA_KEYS = {"kv_lora_rank", "q_lora_rank"}
HEAD_KEYS = {
    "num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
    "decoder_attention_heads",
}  # fmt: skip
KV_HEAD_KEYS = {"num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"}
FFN_KEYS = {
    "intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "d_ff",
    "d_inner", "mlp_dim", "ffn_hidden_size", "moe_intermediate_size",
    "shared_expert_intermediate_size", "expert_intermediate_size", "dense_intermediate_size",
}  # fmt: skip
EXPERT_KEYS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"}
TOPK_KEYS = {"num_experts_per_tok", "moe_topk", "num_experts_per_token", "moe_k"}
# Audio front ends and codebooks: their default widths dominate the size of a tiny speech model.
AUDIO_SMALL = {
    "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2, "xvector_output_dim": 32,
    "proj_codevector_dim": 32, "codevector_dim": 32, "num_codevectors_per_group": 8,
    "classifier_proj_size": 32, "max_source_positions": 32, "adapter_attn_dim": 16,
}  # fmt: skip
AUDIO_LISTS = {"conv_dim": 32, "tdnn_dim": 32}


def _heads(n: int) -> int:
    return 4 if n >= 4 else (2 if n >= 2 else 1)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


STAGE_KEYS = {"out_features", "out_indices", "stage_names"}


def _layer_pick(d: dict, n_orig: int, minimum: int = 0) -> list[int]:
    """Which of `n_orig` layers to keep: the first layer of each kind that per-layer lists name
    (sliding and full attention, dense and MoE, ...), then the earliest others, up to LAYERS
    (or one of each kind, at most 4)."""
    lists = [v for k, v in d.items() if isinstance(v, list) and len(v) == n_orig and k not in STAGE_KEYS]
    keep: list[int] = []
    for v in lists:
        seen = set()
        for i, x in enumerate(v):
            key = json.dumps(x, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                if i not in keep:
                    keep.append(i)
    plc = d.get("per_layer_config")
    if isinstance(plc, dict) and plc:  # layers with their own settings are a kind of their own
        first = min(int(i) for i in plc)
        if first < n_orig and first not in keep:
            keep.append(first)
    n = min(n_orig, max(LAYERS, min(len(keep), 4), minimum))
    keep = keep[:n]
    keep += [i for i in range(n_orig) if i not in keep][: n - len(keep)]
    return sorted(keep)


def shrink(d: dict, vision: bool = True) -> dict:
    """A copy of a config's dict (nested sub-configs included) with its sizes made tiny."""
    d = dict(d)
    heads = d.get("num_attention_heads", d.get("n_head", d.get("num_heads")))
    hierarchical = isinstance(d.get("depths"), list)  # num_layers there counts stages
    for key, v in list(d.items()):
        if isinstance(v, dict):
            if "model_type" in v or any(k in v for k in LAYER_KEYS | WIDTH_KEYS):
                d[key] = shrink(v, vision)
            continue
        if key in LAYER_KEYS and _is_int(v) and v > LAYERS and not (hierarchical and key == "num_layers"):
            # A backbone's chosen outputs name layers: keep as many layers as there are outputs
            # and take the last ones of the new stack.
            outs = d.get("out_features") or d.get("out_indices")
            n_outs = len(outs) if isinstance(outs, list) else 0
            keep = _layer_pick(d, v, n_outs)
            d[key] = len(keep)
            # Per-layer lists (layer_types, block types, window sizes) follow the layer count.
            for k2, v2 in list(d.items()):
                if isinstance(v2, list) and len(v2) == v and k2 not in STAGE_KEYS:
                    d[k2] = [v2[i] for i in keep]
            plc = d.get("per_layer_config")
            if isinstance(plc, dict):
                d["per_layer_config"] = {
                    new: plc[old] for new, i in enumerate(keep) for old in plc if int(old) == i
                }
            if n_outs:
                idx = list(range(len(keep) - n_outs + 1, len(keep) + 1))
                if d.get("out_features"):
                    d["out_features"] = [f"stage{i}" for i in idx]
                if d.get("out_indices"):
                    d["out_indices"] = idx
                d.pop("stage_names", None)  # derived from the layer count again
        elif (key in WIDTH_KEYS or key.endswith("_hidden_size")) and _is_int(v):
            d[key] = min(v, 64)
        elif key in HEAD_DIM_KEYS and _is_int(v):
            d[key] = min(v, 16)
        elif key in LORA_KEYS and _is_int(v):
            d[key] = min(v, 32)
        elif key in HEAD_KEYS:
            if _is_int(v):
                d[key] = _heads(v)
            elif isinstance(v, list) and all(_is_int(x) for x in v):
                d[key] = [min(x, 2) for x in v]
        elif key in KV_HEAD_KEYS and _is_int(v):
            d[key] = _heads(v) if _is_int(heads) and v >= heads else min(_heads(v), 2)
        elif key in FFN_KEYS:
            if _is_int(v):
                d[key] = min(v, 128)
            elif isinstance(v, list) and all(_is_int(x) for x in v):
                d[key] = [min(x, 128) for x in v]
        elif key in EXPERT_KEYS and _is_int(v):
            d[key] = min(v, 4)
        elif key in TOPK_KEYS and (_is_int(v) or (v is None and any(_is_int(d.get(k)) for k in EXPERT_KEYS))):
            d[key] = 2 if v is None else min(v, 2)
        elif key == "max_length" and _is_int(v) and "num_mel_bins" in d:  # spectrogram frames
            d[key] = min(v, 64)
        elif key in ("n_group", "topk_group", "n_shared_experts", "first_k_dense_replace") and _is_int(v):
            d[key] = min(v, 1)
        elif key in ("vocab_size", "n_vocab") and (_is_int(v) or v is None):
            d[key] = VOCAB if v is None else min(v, VOCAB)
        elif key == "rotary_dim" and _is_int(v):
            d[key] = min(v, 8)
        elif key == "num_kv_shared_layers" and _is_int(v):
            d[key] = 0
        elif key in ("max_position_embeddings", "n_positions") and _is_int(v):
            d[key] = min(v, 512)
        elif key in AUDIO_SMALL and _is_int(v):
            d[key] = min(v, AUDIO_SMALL[key])
        elif key in AUDIO_LISTS and isinstance(v, list):
            d[key] = [min(x, AUDIO_LISTS[key]) for x in v]
        elif key == "use_pretrained_backbone":
            d[key] = False
        elif vision and key == "image_size":
            d[key] = [32, 32] if isinstance(v, list) else (32 if _is_int(v) else v)
        elif vision and key == "patch_size" and _is_int(v):
            d[key] = min(v, 8)
        elif vision and key == "depths" and isinstance(v, list):
            d[key] = [1] * len(v)
        elif vision and key in ("hidden_sizes", "embed_dims") and isinstance(v, list):
            d[key] = [16 * 2 ** min(i, 3) for i in range(len(v))]
    # state-space heads cover the expanded width (Mamba-2)
    if all(_is_int(d.get(k)) for k in ("expand", "num_heads", "head_dim", "hidden_size")):
        d["num_heads"] = max(1, d["expand"] * d["hidden_size"] // d["head_dim"])
        if _is_int(d.get("n_groups")):
            d["n_groups"] = min(d["n_groups"], 2)
    # rotary sections of multimodal rotary embeddings must add up to half the new head size (16)
    for key, v in list(d.items()):
        if isinstance(v, dict) and isinstance(v.get("mrope_section"), list):
            n = len(v["mrope_section"])
            sec = [8 // n] * n
            sec[0] += 8 - sum(sec)
            d[key] = {**v, "mrope_section": sec}
    # special tokens inside the new vocabulary, apart from the ids the inputs use
    vocab = d.get("vocab_size")
    if _is_int(vocab):
        fixed = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}
        spare = vocab - 1
        for key, v in list(d.items()):
            if not (key.endswith("token_id") or key.endswith("token_index")):
                continue
            ids = v if isinstance(v, list) else [v]
            if not all(_is_int(i) for i in ids) or all(i < vocab - RESERVED for i in ids):
                continue
            if key in fixed:
                d[key] = fixed[key]
            else:
                d[key] = spare
                spare -= 1
    return d


def tiny_config(model_type: str, vision: bool = True):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type)
    d = shrink(cfg.to_dict(), vision)
    d.pop("model_type", None)
    for k in ("transformers_version", "architectures", "_name_or_path"):
        d.pop(k, None)
    return type(cfg).from_dict(d)


# --------------------------------------------------------------------------------------------
# Inputs


def _ids(n: int, vocab: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, max(4, vocab - RESERVED), (BATCH, n), generator=g)


def _vocab(cfg) -> int:
    for c in (cfg, getattr(cfg, "text_config", None), getattr(cfg, "decoder", None)):
        v = getattr(c, "vocab_size", None)
        if _is_int(v):
            return v
    return VOCAB


def _image_size(cfg) -> int:
    for c in (cfg, getattr(cfg, "vision_config", None), getattr(cfg, "backbone_config", None)):
        v = getattr(c, "image_size", None)
        if _is_int(v):
            return v
        if isinstance(v, (list, tuple)) and v and _is_int(v[0]):
            return v[0]
    return 32


def _channels(cfg) -> int:
    for c in (cfg, getattr(cfg, "vision_config", None), getattr(cfg, "backbone_config", None)):
        v = getattr(c, "num_channels", None)
        if _is_int(v):
            return v
    return 3


def _feature_bins(cfg) -> int:
    for key in ("num_mel_bins", "feature_size", "input_feat_per_channel", "n_mels", "num_mel_filters"):
        v = getattr(cfg, key, None)
        if _is_int(v) and v > 1:
            return v * (getattr(cfg, "input_channels", 1) if key == "input_feat_per_channel" else 1)
    return 80


def candidate_inputs(model, cfg) -> list[dict]:
    """Input sets to try in order; the first that runs forward and backward on the CPU is used."""
    import inspect

    import torch

    params = inspect.signature(model.forward).parameters
    g = torch.Generator().manual_seed(3)
    vocab = _vocab(cfg)
    main = getattr(model, "main_input_name", "input_ids")
    if isinstance(main, (list, tuple)):
        main = main[0]
    size, ch = _image_size(cfg), _channels(cfg)
    bins = _feature_bins(cfg)
    options: dict[str, list] = {
        "input_ids": [_ids(SEQ, vocab, 1)],
        "pixel_values": [torch.randn(BATCH, ch, size, size, generator=g)]
        + ([torch.randn(BATCH, ch, 64, 64, generator=g)] if size < 64 else []),
        "input_values": [torch.randn(BATCH, 4000, generator=g), torch.randn(BATCH, 1, 4000, generator=g)]
        + (
            [torch.randn(BATCH, cfg.max_length, bins, generator=g)]
            if _is_int(getattr(cfg, "max_length", None)) and hasattr(cfg, "num_mel_bins")
            else []
        ),
        "input_features": [
            torch.randn(BATCH, bins, 2 * getattr(cfg, "max_source_positions", 32), generator=g),
            torch.randn(BATCH, 32, bins, generator=g),
            torch.randn(BATCH, bins, 32, generator=g),
        ],
    }
    extras = {}
    if "attention_mask" in params and main == "input_ids":
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        mask[1, SEQ - 2 :] = 0  # the second row padded at the end
        extras["attention_mask"] = mask
    if "decoder_input_ids" in params and getattr(cfg, "is_encoder_decoder", False):
        extras["decoder_input_ids"] = _ids(DEC_SEQ, vocab, 2)
    if "use_cache" in params:
        extras["use_cache"] = False
    cands = []
    for value in options.get(main, [None]):
        base = {main: value} if value is not None else {}
        cands.append({**base, **extras})
        if "attention_mask" in extras:
            cands.append({**base, **{k: v for k, v in extras.items() if k != "attention_mask"}})
        # multimodal base models that need every modality they have
        others = {k: vs[0] for k, vs in options.items() if k != main and k in params}
        if others:
            cands.append({**base, **others, **extras})
    return cands


# --------------------------------------------------------------------------------------------
# One architecture (runs in the child process)


def _tensors(out) -> dict:
    """Every tensor in a model output, by a dotted name."""
    import torch

    found = {}

    def walk(prefix, value):
        if isinstance(value, torch.Tensor):
            found[prefix] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                walk(f"{prefix}.{i}", v)

    walk("", out)
    return found


def _loss_of(outs: dict, weights: dict):
    """A weighted sum of the first floating output that needs a gradient (weights fixed random, so
    a final normalization does not make the gradient vanish)."""
    for name, t in outs.items():
        if t.is_floating_point() and t.requires_grad:
            import torch

            w = weights.get(name)
            if w is None or w.shape != t.shape:  # another shape only where the model is random
                w = torch.randn(t.shape, generator=torch.Generator().manual_seed(4))
                weights.setdefault(name, w)
            return name, (t.float() * w.to(t.device)).sum()
    raise RuntimeError("no floating output needs a gradient")


def _run(model, inputs: dict, weights: dict):
    outs = _tensors(model(**inputs))
    name, loss = _loss_of(outs, weights)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in outs.items()}, grads, name


def child(model_type: str, class_name: str, modes: list[str], stage_file: str) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import copy
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    emit = stage_writer(stage_file)

    # CPU: build and find inputs that run forward and backward
    t0 = time.time()
    cls = getattr(transformers, class_name, None)
    reasons = []
    found = None
    # Shrunk image sizes first; then the config's own, for vision stacks whose stages need them.
    for vision in (True, False):
        if cls is None:
            reasons.append(f"ImportError: transformers has no {class_name}")
            break
        try:
            cfg = tiny_config(model_type, vision)
            torch.manual_seed(0)
            model = cls(cfg).float().eval()
        except Exception as e:  # noqa: BLE001 - the reason is the result
            reasons.append("build: " + exception_reason(e))
            continue
        try:
            cands = candidate_inputs(model, cfg)
        except Exception as e:  # noqa: BLE001
            reasons.append("inputs: " + exception_reason(e))
            continue
        for inputs in cands:
            weights = {}
            try:
                # The device copies start from the model as built: a forward may leave
                # tensors on it that deepcopy refuses (states kept from a recurrent step).
                pristine = copy.deepcopy(model)
                model.zero_grad(set_to_none=True)
                outs, grads, loss_name = _run(model, inputs, weights)
            except Exception as e:  # noqa: BLE001
                reasons.append("cpu: " + exception_reason(e))
                continue
            if not grads:
                reasons.append("cpu: no parameter gets a gradient")
                continue
            found = (model, inputs, weights, outs, grads, loss_name, pristine)
            break
        if found:
            break
    if not found:
        # the first build failure, or else the last input set's failure, says most
        builds = [r for r in reasons if r.startswith("build")]
        reason = builds[0] if builds else (reasons[-1] if reasons else "cpu: no input set to try")
        emit({"stage": "cpu", "ok": False, "reason": reason})
        return
    model, inputs, weights, cpu_outs, cpu_grads, loss_name, pristine = found
    # A second CPU run from another seed finds models that draw random numbers in eval mode
    # (sampled latents, random masks): the device's generator differs, so their values are not
    # compared.
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1234)
    try:
        again, _, _ = _run(model, inputs, weights)
        random_outs = sorted(k for k, v in cpu_outs.items() if not tensor_error(again.get(k, v), v) <= OUT_TOL)
    except Exception:  # noqa: BLE001 - the first run succeeded; treat as deterministic
        random_outs = []
    model.zero_grad(set_to_none=True)
    emit(
        {
            "stage": "cpu",
            "ok": True,
            "inputs": {k: list(v.shape) for k, v in inputs.items() if isinstance(v, torch.Tensor)},
            "loss_of": loss_name,
            "params": sum(p.numel() for p in model.parameters()),
            "random_outputs": random_outs[:5],
            "seconds": round(time.time() - t0, 1),
        }
    )

    def run_step():
        dev_model = copy.deepcopy(pristine).to("pjrt")
        dev_inputs = {k: v.to("pjrt") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        outs, grads, _ = _run(dev_model, dev_inputs, weights)
        results = {k: v.cpu() for k, v in outs.items()}, {k: v.cpu() for k, v in grads.items()}
        return results, (dev_model, dev_inputs)

    def judge(results, fallback_ops):
        outs, grads = results
        out_errors = errors_by_name(outs, cpu_outs)
        grad_errors = errors_by_name(grads, cpu_grads)
        errors = {
            "out_err": max(out_errors.values(), default=0.0),
            "grad_err": max(grad_errors.values(), default=0.0),
        }
        if random_outs:
            findings = {
                "result": "fallback" if fallback_ops else "unchecked",
                "reason": "random in eval mode: " + ", ".join(random_outs[:3]),
            }
        else:
            findings = grade(out_errors, grad_errors, sorted(set(grads) - set(cpu_grads)), fallback_ops)
        return errors, findings

    run_device_modes(modes, emit, run_step, judge)


# --------------------------------------------------------------------------------------------
# The sweep (parent)


def run_one(model_type: str, class_name: str, timeout: float) -> dict:
    return run_in_child(__file__, [model_type, class_name], {"model_type": model_type, "class": class_name}, timeout)


def main() -> None:
    child_call = parse_child_call(sys.argv)
    if child_call:
        (model_type, class_name), modes, stage_file = child_call
        child(model_type, class_name, modes, stage_file)
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_options(p, names="model types", unit="architecture", default_out=DEFAULT_OUT, default_timeout=180)
    p.add_argument("--shard", help="i/n: every n-th architecture from the i-th")
    p.add_argument("--jobs", type=int, default=1, help="architectures run at once")
    p.add_argument("--order", choices=["shuffled", "sorted"], default="shuffled",
                   help="shuffled (fixed seed) so that a partial run samples every kind of model")  # fmt: skip
    args = p.parse_args()

    if args.table:
        print(table(load_results(args.out)))
        return
    if args.summary:
        print(summary(load_results(args.out)))
        return
    archs = architectures()
    if args.order == "shuffled":
        random.Random(0).shuffle(archs)
    classes = dict(archs)
    names = only_names([t for t, _ in archs], args.only)
    if args.shard:
        names = take_shard(names, args.shard)
    if args.list:
        for t in names:
            print(t, classes[t])
        return
    run_sweep(
        names,
        lambda t: run_one(t, classes[t], args.timeout),
        out_path=args.out,
        name_key="model_type",
        name_width=32,
        unit="architecture",
        limit=args.limit,
        budget_min=args.budget_min,
        jobs=args.jobs,
    )


# --------------------------------------------------------------------------------------------
# The coverage table


def table(rows: list[dict]) -> str:
    rows = sorted(rows, key=lambda r: r["model_type"])
    lines = [
        "| model type | class | strict | defer_and_fuse | max output err | max grad err | fallback ops | failure |",
        "| --- | --- | --- | --- | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        if not r["cpu"].get("ok"):
            continue
        records = mode_records(r)
        results = " | ".join(rec.get("result", "-") for rec in records)
        out_err, grad_err = largest_error(records, "out_err"), largest_error(records, "grad_err")
        lines.append(
            f"| {r['model_type']} | {r['class']} | {results} | {format_error(out_err)} | {format_error(grad_err)} "
            f"| {fallback_ops_cell(records)} | {escape_cell(failure_note(r))} |"
        )
    lines += ["", "Unsupported on CPU (not counted):", "", "| model type | class | reason |", "| --- | --- | --- |"]
    for r in rows:
        if not r["cpu"].get("ok"):
            reason = escape_cell(r["cpu"].get("reason", "")[:160])
            lines.append(f"| {r['model_type']} | {r['class']} | {_cpu_kind(reason)}: {reason} |")
    return "\n".join(lines)


def _cpu_kind(reason: str) -> str:
    if "library but it was not found" in reason:
        return "library not installed"
    if "missing" in reason and "required" in reason:
        return "needs more inputs"
    if reason.startswith("build"):
        return "shrunk config does not build"
    if reason.startswith(("crash", "timeout")):
        return "crash"
    return "generic inputs fail"


def summary(rows: list[dict]) -> str:
    built = [r for r in rows if r["cpu"].get("ok")]
    kinds = collections.Counter(_cpu_kind(r["cpu"].get("reason", "")) for r in rows if not r["cpu"].get("ok"))
    lines = [
        f"- architectures tried: {len(rows)}",
        f"- unsupported on CPU (do not build or run forward+backward there): {len(rows) - len(built)}"
        " (" + ", ".join(f"{k} {v}" for k, v in kinds.most_common()) + ")",
        f"- built on CPU: {len(built)}",
    ]
    lines += mode_summary(built, "model_type", "architecture", generalize_causes=True)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
