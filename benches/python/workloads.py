"""The workloads of the benchmark suite, run for one backend in one process.

    python workloads.py --backend pjrt-defer_and_fuse --workload chains --json-out out.json

Backends: cpu (eager), inductor (torch.compile), torch_xla (its CPU PJRT client; needs the peer
venv's python), openxla (`torch.compile(backend="openxla")`, torch_xla's Dynamo backend, on
torch_xla's CPU client, where inductor compiles; the peer venv's python too), pjrt-strict,
pjrt-debug, pjrt-defer_and_fuse, pjrt-compiled (`torch.compile(backend="pjrt")` where inductor
compiles, the code around it in Strict). Each workload is a list of cases;
each case is timed as a median over repetitions, after warm-up repetitions, with the device synced
before the clock stops. The result (JSON) goes to --json-out, or stdout without it.

Only torch is imported at module level: the peer venv has torch_xla but not torch_pjrt, and the
project's venv the reverse.

Sizes: BENCH_QUICK=1 shrinks them (and the repetitions) for a smoke run; BENCH_REPS, BENCH_WARMUP
and BENCH_BUDGET_S (seconds one case may spend before it stops repeating) override the defaults;
BENCH_THREADS sets torch's intra-op threads (left at torch's default otherwise).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
import traceback

QUICK = os.environ.get("BENCH_QUICK", "0") not in ("", "0")
REPS = max(1, int(os.environ.get("BENCH_REPS", "2" if QUICK else "5")))
WARMUP = max(1, int(os.environ.get("BENCH_WARMUP", "1" if QUICK else "2")))
BUDGET_S = float(os.environ.get("BENCH_BUDGET_S", "30" if QUICK else "150"))

BACKENDS = (
    "cpu", "inductor", "torch_xla", "openxla", "pjrt-strict", "pjrt-debug", "pjrt-defer_and_fuse",
    "pjrt-compiled",
)
# The backends that run on torch_xla's device (both from the peer venv).
XLA_BACKENDS = ("torch_xla", "openxla")

if __name__ == "__main__" and any(b in sys.argv for b in XLA_BACKENDS):
    # torch_xla reads PJRT_DEVICE when it is imported: choose its CPU client before anything
    # imports it.
    os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def _maxrss_mb() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class Backend:
    """One backend: its device, how to sync it, how to compile a function for it and how to count
    its compilations."""

    def __init__(self, name: str):
        if name not in BACKENDS:
            raise ValueError(f"unknown backend {name!r}: expected one of {', '.join(BACKENDS)}")
        self.name = name
        self.mode = None
        self._xm = self._met = None
        if name in XLA_BACKENDS:
            os.environ.setdefault("PJRT_DEVICE", "CPU")
            import torch_xla
            import torch_xla.core.xla_model as xm
            import torch_xla.debug.metrics as met

            self._torch_xla, self._xm, self._met = torch_xla, xm, met
            cache_dir = os.environ.get("BENCH_XLA_CACHE_DIR")
            if cache_dir:
                # torch_xla's persistent compilation cache must be set before any computation.
                import torch_xla.runtime as xr

                xr.initialize_cache(cache_dir, readonly=False)
            self.device = torch_xla.device()
        elif name.startswith("pjrt-"):
            import torch_pjrt

            self._tp = torch_pjrt
            # The compiled mode's graphs run as regions of their own; the code around them runs
            # in Strict, the default mode.
            self.mode = "strict" if name == "pjrt-compiled" else name[len("pjrt-") :]
            self.device = torch.device("pjrt")
        else:
            self.device = torch.device("cpu")

    def start(self) -> None:
        """Starts the runtime with a transfer each way (no compilation), so that memory baselines
        and first-step timings leave the runtime's start-up out."""
        t = torch.ones(4).to(self.device)
        t.cpu()
        self.sync()

    def sync(self) -> None:
        if self.name.startswith("pjrt-"):
            self._tp.sync()
        elif self.name in XLA_BACKENDS:
            self._torch_xla.sync()
            self._xm.wait_device_ops()

    def settle_compiles(self):
        """pjrt: upgrades every quick program warm-up ran to its full compile (RFC 0041), as a
        loop running long enough does (one that runs once per repetition would otherwise stay
        quick for the first eight), and waits (at most a minute) for those compiles, so that the
        timed repetitions run the programs a loop settles on and do not share the cores with
        them; returns whether they finished. None elsewhere."""
        if self.name.startswith("pjrt-"):
            self._tp._api._upgrade_quick_programs()
            return self._tp._api._wait_compile_upgrades(60.0)
        return None

    def context(self):
        if self.mode is not None:
            return self._tp.eager_mode(self.mode)
        return contextlib.nullcontext()

    @property
    def compiles(self) -> bool:
        """Whether the backend runs `torch.compile`d functions (inductor, openxla, or pjrt's
        compiled mode)."""
        return self.name in ("inductor", "openxla", "pjrt-compiled")

    def compile(self, fn):
        if self.name == "inductor":
            return torch.compile(fn, dynamic=False)
        if self.name == "openxla":
            return torch.compile(fn, backend="openxla", dynamic=False)
        if self.name == "pjrt-compiled":
            return torch.compile(fn, backend="pjrt", dynamic=False)
        return fn

    def compile_count(self):
        """Compilations so far: pjrt executables built, torch_xla graphs compiled, dynamo graphs
        made for inductor, and for openxla XLA graphs compiled plus dynamo graphs made (a
        recompile of either kind counts); None for CPU eager."""
        if self.name.startswith("pjrt-"):
            return int(self._tp.metrics()["compilations"])
        if self.name in XLA_BACKENDS:
            data = self._met.metric_data("CompileTime")
            xla = int(data[0]) if data else 0
            if self.name == "openxla":
                from torch._dynamo.utils import counters

                xla += int(counters["stats"]["unique_graphs"])
            return xla
        if self.name == "inductor":
            from torch._dynamo.utils import counters

            return int(counters["stats"]["unique_graphs"])
        return None

    def metrics(self) -> dict:
        """Runtime counters for per-repetition profiles: the pjrt engine's, or torch_xla's
        compile and cache counters; empty for the others."""
        if self.name in XLA_BACKENDS:
            out = {n: self._met.counter_value(n) or 0 for n in _XLA_COUNTERS}
            data = self._met.metric_data("CompileTime")
            out["compilations"] = int(data[0]) if data else 0
            return out
        if not self.name.startswith("pjrt-"):
            return {}
        m = self._tp.metrics()
        out = {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        out["fallback_ops"] = dict(m.get("fallback_ops") or {})
        return out

    def device_peak(self):
        """Peak device memory in MiB and where it came from, or None and why not."""
        if self.name.startswith("pjrt-"):
            m = self._tp.metrics()
            keys = [k for k in m if "peak" in k and "byte" in k]
            if keys:
                return m[keys[0]] / 2**20, keys[0]
            return None, "torch_pjrt.metrics() has no peak-bytes counter"
        if self.name in XLA_BACKENDS:
            try:
                info = self._xm.get_memory_info(self.device)
                peak = info.get("peak_bytes_used") or info.get("peak_bytes")
                if peak:
                    return peak / 2**20, "xm.get_memory_info"
            except Exception as e:  # the CPU client has no allocator statistics
                return None, f"xm.get_memory_info: {type(e).__name__}"
            return None, "xm.get_memory_info has no peak"
        return None, "host memory: see peak RSS"


_XLA_COUNTERS = (
    "UncachedCompile",
    "CachedCompile",
    "PersistentCacheHit",
    "PersistentCacheDeserializeFailure",
    "ExecuteComputation",
    "MarkStep",
)


def _profile_delta(before: dict, after: dict, reps: int) -> dict:
    """Per-repetition change of each pjrt counter over the timed repetitions."""
    out = {}
    for k, v in after.items():
        if k == "fallback_ops":
            b = before.get(k, {})
            fb = {op: (n - b.get(op, 0)) / reps for op, n in v.items() if n - b.get(op, 0)}
            if fb:
                out[k] = fb
            continue
        if k in ("largest_region", "live_storages", "pending_ops"):
            out[k] = v  # levels, not counters
            continue
        d = v - before.get(k, 0)
        if d:
            out[k] = d / reps
    return out


class Runner:
    """Runs the cases of one workload on one backend and collects their results."""

    def __init__(self, backend: Backend):
        self.b = backend
        self.cases = []

    def case(self, name: str, params: dict, per: int, unit: str, make):
        """Times one case. `make()` builds the inputs and returns `run_once`, one repetition that
        returns whatever must stay alive until the sync (results left pending on the device would
        otherwise be dead and dropped); `per` divides a repetition's time (ops or steps in it)."""
        b = self.b
        entry = {"case": name, "params": params, "per": unit, "count": per}
        try:
            run_once = make()
            started = time.perf_counter()
            first = None
            first_compiles = None
            c_start = b.compile_count()
            for i in range(WARMUP):
                t0 = time.perf_counter()
                out = run_once()
                b.sync()
                del out
                if i == 0:
                    first = time.perf_counter() - t0
                    c_first = b.compile_count()
                    first_compiles = None if c_start is None else c_first - c_start
                if time.perf_counter() - started > BUDGET_S:
                    entry["budget_hit"] = True  # a workload that keeps compiling: cut warm-up short
                    break
            entry["upgrades_settled"] = b.settle_compiles()
            c0, m0 = b.compile_count(), b.metrics()
            samples = []
            for _ in range(REPS):
                gc.collect()
                t0 = time.perf_counter()
                out = run_once()
                b.sync()
                samples.append((time.perf_counter() - t0) / per)
                del out
                if time.perf_counter() - started > BUDGET_S:
                    entry["budget_hit"] = True  # fewer repetitions than asked
                    break
            c1, m1 = b.compile_count(), b.metrics()
            entry.update(
                median_s=statistics.median(samples),
                samples_s=samples,
                first_s=first / per,
                reps=len(samples),
                compiles=None if c0 is None else c1 - c0,
                first_compiles=first_compiles,
            )
            if m1:
                entry["profile"] = _profile_delta(m0, m1, len(samples))
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}".strip()[:500]
            entry["traceback"] = traceback.format_exc()[-2000:]
        self.cases.append(entry)
        return entry


# --- workloads -------------------------------------------------------------------------------


def wl_tiny_ops(r: Runner):
    """10,000 `x = x + 1.0` on 16 floats, then `.item()`: per-op host overhead."""
    b, n = r.b, (1000 if QUICK else 10_000)
    x0 = torch.zeros(16).to(b.device)

    def make():
        if b.compiles:
            # A compiled function runs many ops per call: compile a block of adds and call it
            # n / block times (tracing the whole 10,000-op loop would unroll it into one graph).
            block = 100

            def add_block(y):
                for _ in range(block):
                    y = y + 1.0
                return y

            fn = b.compile(add_block)

            def run_once():
                y = x0
                for _ in range(n // block):
                    y = fn(y)
                return y.sum().item()

            return run_once

        def run_once():
            y = x0
            for _ in range(n):
                y = y + 1.0
            return y.sum().item()

        return run_once

    e = r.case(f"{n} adds, 16 floats", {"ops": n}, n, "op", make)
    if "error" not in e and b.compiles:
        e["note"] = "compiled blocks of 100 adds"


_CHAIN_OPS = (
    lambda t: t * 0.999,
    lambda t: t + 0.01,
    torch.relu,
    lambda t: t - 0.005,
)


def _chain(t, k):
    for i in range(k):
        t = _CHAIN_OPS[i % len(_CHAIN_OPS)](t)
    return t


def _mfloats(n: int) -> str:
    return f"{n // 2**20}M" if n >= 2**20 else f"{n // 2**10}K"


def wl_chains(r: Runner):
    """Elementwise chains of k ops over 4M and 16M floats, then `.sum().item()`."""
    b = r.b
    sizes = (2**16, 2**18) if QUICK else (4 * 2**20, 16 * 2**20)
    ks = (4, 8) if QUICK else (4, 8, 16, 24)
    for n in sizes:
        x = torch.rand(n, generator=torch.Generator().manual_seed(0)).to(b.device)
        for k in ks:

            def make(k=k, x=x):
                fn = b.compile(lambda t: _chain(t, k).sum())
                return lambda: fn(x).item()

            r.case(f"k={k} n={_mfloats(n)}", {"k": k, "n": n}, 1, "call", make)
        del x


def wl_norms(r: Runner):
    """LayerNorm, softmax and GELU forward on 4096x1024."""
    b = r.b
    rows = 256 if QUICK else 4096
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 1024, generator=g).to(b.device)
    w = torch.randn(1024, generator=g).to(b.device)
    bias = torch.randn(1024, generator=g).to(b.device)
    fns = {
        "layer_norm": lambda t: F.layer_norm(t, (1024,), w, bias),
        "softmax": lambda t: torch.softmax(t, dim=-1),
        "gelu": lambda t: F.gelu(t),
    }
    for name, f in fns.items():

        def make(f=f):
            fn = b.compile(f)
            return lambda: fn(x)

        r.case(f"{name} {rows}x1024", {"op": name, "rows": rows}, 1, "call", make)


def _mlp(b: Backend, batches: int = 8):
    """The MLP 784-256-256-10, SGD with momentum, and a few batches of 64 on the device."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    ).to(b.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(64, 784, generator=g).to(b.device), torch.randint(0, 10, (64,), generator=g).to(b.device))
        for _ in range(batches)
    ]

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    return model, b.compile(step), data


def wl_mlp(r: Runner):
    """An MLP 784-256-256-10 training step (batch 64), with and without a sync per step."""
    b = r.b
    steps = 3 if QUICK else 20
    for sync_each in (True, False):

        def make(sync_each=sync_each):
            model, step, data = _mlp(b)

            def run_once():
                loss = None
                for i in range(steps):
                    loss = step(*data[i % len(data)])
                    if sync_each:
                        b.sync()
                return loss, model

            return run_once

        name = "sync every step" if sync_each else "no sync (one at the end)"
        r.case(name, {"steps": steps, "sync_each_step": sync_each}, steps, "step", make)

    def make_products():
        # The step's eight matrix products alone (three forward, five backward), with the
        # step's shapes and transposes, a sync after each step's worth: how much of the step
        # time the backend's GEMM kernels set.
        model, _, data = _mlp(b)
        w1, w2, w3 = (model[i].weight.detach() for i in (0, 2, 4))
        x = data[0][0]
        g = torch.Generator().manual_seed(2)
        h1, h2, g1, g2 = (torch.randn(64, 256, generator=g).to(b.device) for _ in range(4))
        g3 = torch.randn(64, 10, generator=g).to(b.device)

        def products(x, h1, h2, g1, g2, g3):
            return (x @ w1.t(), h1 @ w2.t(), h2 @ w3.t(),
                    g3.t() @ h2, g3 @ w3, g2.t() @ h1, g2 @ w2, g1.t() @ x)

        fn = b.compile(products)

        def run_once():
            out = None
            for _ in range(steps):
                out = fn(x, h1, h2, g1, g2, g3)
                b.sync()
            return out

        return run_once

    r.case("the step's 8 matrix products alone", {"steps": steps, "diagnostic": True}, steps, "step",
           make_products)


def wl_item_loop(r: Runner):
    """The MLP step with `loss.item()` every step, as a training loop that logs its loss does."""
    b = r.b
    steps = 3 if QUICK else 20

    def make():
        model, step, data = _mlp(b)

        def run_once():
            total = 0.0
            for i in range(steps):
                total += step(*data[i % len(data)]).item()
            return total, model

        return run_once

    r.case("loss.item() every step", {"steps": steps}, steps, "step", make)


def wl_adam(r: Runner):
    """Adam over 200 parameters of 4K-64K floats, with an LR schedule that changes the learning
    rate every step; counts the compilations after warm-up."""
    b = r.b
    count = 20 if QUICK else 200
    steps = 2 if QUICK else 5
    lo, hi = 4096, 65536
    sizes = [int(round((lo + (hi - lo) * i / (count - 1)) / 256)) * 256 for i in range(count)]

    def make():
        g = torch.Generator().manual_seed(0)
        params = []
        for s in sizes:
            p = torch.randn(s, generator=g).to(b.device).requires_grad_()
            p.grad = (torch.randn(s, generator=g) * 1e-3).to(b.device)
            params.append(p)
        # A compiled optimizer recompiles on every new float learning rate; a tensor one is how
        # torch.compile takes a schedule.
        lr = torch.tensor(1e-3) if b.compiles else 1e-3
        capturable = False
        if b.name in ("pjrt-compiled", "openxla"):
            # On an accelerator a compiled optimizer keeps its step counts and learning rate on
            # the device (capturable): its graph is then all device work (pjrt replays it).
            lr, capturable = torch.tensor(1e-3, device=b.device), True
        opt = torch.optim.Adam(params, lr=lr, capturable=capturable)
        # Compiled before the scheduler wraps opt.step: dynamo skips the wrapper, and the graph
        # break there leaves a step ~100x slower than the compiled one.
        opt_step = b.compile(opt.step)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / 10) * 0.5 * (1 + math.cos(math.pi * s / 1000))
        )

        def run_once():
            for _ in range(steps):
                opt_step()
                sched.step()
                b.sync()
            return params

        return run_once

    r.case(
        f"{count} params, {sum(sizes) / 1e6:.1f}M floats",
        {"params": count, "floats": sum(sizes), "steps": steps},
        steps,
        "step",
        make,
    )


class _AttentionBlock(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        bsz, seq, width = x.shape
        qkv = self.qkv(self.ln(x)).view(bsz, seq, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(a.transpose(1, 2).reshape(bsz, seq, width))


def wl_attention(r: Runner):
    """A pre-LN causal self-attention block forward + backward: seq 256, width 256, 4 heads,
    batch 8."""
    b = r.b
    batch, seq, width, heads = (2, 64, 64, 4) if QUICK else (8, 256, 256, 4)

    def make():
        torch.manual_seed(0)
        block = _AttentionBlock(width, heads).to(b.device)
        x = torch.randn(batch, seq, width, generator=torch.Generator().manual_seed(1)).to(b.device)

        def fwd_bwd(t):
            loss = block(t).pow(2).mean()
            loss.backward()
            return loss

        fn = b.compile(fwd_bwd)

        def run_once():
            for p in block.parameters():
                p.grad = None
            return fn(x), [p.grad for p in block.parameters()]

        return run_once

    r.case(
        f"batch {batch}, seq {seq}, width {width}, {heads} heads",
        {"batch": batch, "seq": seq, "width": width, "heads": heads},
        1,
        "call",
        make,
    )


def wl_first_step(r: Runner):
    """First-step latency of the MLP training step in a fresh process: the caches are whatever the
    driver set up (empty for a cold start, filled by a previous process for a warm one)."""
    b = r.b
    model, step, data = _mlp(b)
    b.sync()
    entry = {"case": "first MLP step", "params": {}, "per": "step", "count": 1}
    c0, m0 = b.compile_count(), b.metrics()
    # The step ends in loss.item() and then a sync: DeferAndFuse materializes only the loss's
    # region at .item() and would leave the backward and the update for later otherwise.
    t0 = time.perf_counter()
    step(*data[0]).item()
    b.sync()
    first = time.perf_counter() - t0
    c1, m1 = b.compile_count(), b.metrics()
    t0 = time.perf_counter()
    step(*data[1]).item()
    b.sync()
    second = time.perf_counter() - t0
    entry.update(
        median_s=first,
        samples_s=[first],
        first_s=first,
        second_s=second,
        reps=1,
        compiles=None if c0 is None else c1 - c0,
    )
    if m1:
        entry["profile"] = _profile_delta(m0, m1, 1)
    r.cases.append(entry)


GEN_TOKENS = int(os.environ.get("BENCH_GEN_TOKENS", "8" if QUICK else "32"))


def _tiny_decoder(arch: str):
    """A tiny generator with random weights: GPT-2 (2 layers, width 64, 2 heads), Llama (2 layers,
    width 64, 4 heads, 2 KV heads) or T5 (encoder-decoder, one layer each, width 64, 2 heads),
    vocabulary 500."""
    import transformers

    torch.manual_seed(0)
    if arch == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=500)
        model = transformers.GPT2LMHeadModel(config)
    elif arch == "t5":
        config = transformers.T5Config(
            d_model=64, d_ff=128, d_kv=16, num_layers=1, num_decoder_layers=1, num_heads=2,
            vocab_size=500, decoder_start_token_id=0, pad_token_id=0,
        )
        model = transformers.T5ForConditionalGeneration(config)
    else:
        config = transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=500,
        )
        model = transformers.LlamaForCausalLM(config)
    return model.eval()


def wl_generate(r: Runner):
    """Greedy `generate()` of a tiny GPT-2 and Llama from an 8-token prompt (BENCH_GEN_TOKENS new
    tokens, default 32), with HF's dynamic and static KV caches, and of a tiny T5 with its dynamic
    cache: the first request (compiles included: "first rep", and the programs it compiled in the
    note) and the repeated one.
    pjrt-compiled runs the static cache with the model's forward under
    `torch.compile(backend="pjrt")` (HF's recipe for compiled generation); inductor and openxla
    are left out (CPU eager and torch_xla are the references)."""
    if r.b.name in ("inductor", "openxla"):
        return
    try:
        import transformers  # noqa: F401
    except ImportError:
        r.cases.append({"case": "generate", "error": "transformers is not installed in this venv"})
        return
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    caches = ("static",) if r.b.compiles else ("dynamic", "static")
    # T5 (encoder-decoder) runs with HF's dynamic cache only: the target for it is the
    # dynamic-cache bound of the decoders.
    archs = [("gpt2", c) for c in caches] + [("llama", c) for c in caches]
    if not r.b.compiles:
        archs.append(("t5", "dynamic"))
    for arch, cache in archs:
        def make(arch=arch, cache=cache):
            model = _tiny_decoder(arch).to(r.b.device)
            if r.b.compiles:
                model.forward = r.b.compile(model.forward)
            ids = torch.randint(0, 500, (1, 8), generator=torch.Generator().manual_seed(1))
            ids = ids.to(r.b.device)
            kwargs = dict(max_new_tokens=GEN_TOKENS, min_new_tokens=GEN_TOKENS, do_sample=False, pad_token_id=0)
            if cache == "static":
                kwargs["cache_implementation"] = "static"

            def run_once():
                with torch.no_grad():
                    return model.generate(ids, **kwargs).cpu()

            return run_once

        entry = r.case(
            f"{arch} {cache} cache, {GEN_TOKENS} tokens",
            {"arch": arch, "cache": cache, "new_tokens": GEN_TOKENS},
            1,
            "request",
            make,
        )
        if entry.get("first_compiles") is not None:
            entry["note"] = f"first request compiled {entry['first_compiles']} programs"


PROMPTS_PER_REP = 4


def wl_prompts(r: Runner):
    """Tiny GPT-2 `generate()` of 8 tokens for prompts whose length changes at every request
    (17..31 tokens, one bucket of bounded shapes; a repetition is 4 requests): a chat server's
    traffic. Per request; the programs the timed repetitions compiled are in "compiles"."""
    if r.b.compiles:
        return
    try:
        import transformers  # noqa: F401
    except ImportError:
        r.cases.append({"case": "prompts", "error": "transformers is not installed in this venv"})
        return
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)

    def make():
        model = _tiny_decoder("gpt2").to(r.b.device)
        kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
        calls = [0]

        def run_once():
            outs = []
            for _ in range(PROMPTS_PER_REP):
                length = 17 + (calls[0] * 4) % 15
                calls[0] += 1
                ids = torch.randint(0, 500, (1, length),
                                    generator=torch.Generator().manual_seed(length))
                with torch.no_grad():
                    outs.append(model.generate(ids.to(r.b.device), **kwargs).cpu())
            return outs

        return run_once

    entry = r.case("gpt2, prompt length 17..31, 8 tokens", {"arch": "gpt2", "new_tokens": 8},
                   PROMPTS_PER_REP, "request", make)
    if entry.get("compiles") is not None:
        entry["note"] = f"the timed requests compiled {entry['compiles']} programs"


def _tiny_bert():
    """BERT for sequence classification: 2 layers, width 32, 2 heads, vocabulary 200, dropout
    off (losses comparable across devices)."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=3, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


def _collated_batch(step: int, length: int, batch: int = 4):
    """Ids and an attention mask padded to the batch's longest row (`length`), as
    `DataCollatorWithPadding` pads them."""
    import random

    rng = random.Random(step)
    lens = [length] + [rng.randint(2, length) for _ in range(batch - 1)]
    ids = torch.randint(1, 200, (batch, length), generator=torch.Generator().manual_seed(step))
    mask = torch.zeros(batch, length, dtype=torch.long)
    for row, n in enumerate(lens):
        mask[row, :n] = 1
    return ids * mask, mask


BERT_STEPS = int(os.environ.get("BENCH_BERT_STEPS", "8" if QUICK else "16"))


def wl_padded_batches(r: Runner):
    """A tiny BERT fine-tuned (SGD) on batches padded to random lengths 8..128: one repetition is
    BERT_STEPS steps of new random lengths (per step). The first repetition's programs are in
    the note, the later ones' in "compiles"."""
    if r.b.compiles:
        return
    try:
        import transformers  # noqa: F401
    except ImportError:
        r.cases.append({"case": "bert", "error": "transformers is not installed in this venv"})
        return
    import random

    def make():
        model = _tiny_bert().to(r.b.device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        rng = random.Random(0)
        calls = [0]

        def run_once():
            losses = []
            for _ in range(BERT_STEPS):
                step = calls[0]
                calls[0] += 1
                ids, mask = _collated_batch(step, rng.randint(8, 128))
                labels = torch.randint(0, 3, (4,), generator=torch.Generator().manual_seed(step))
                opt.zero_grad()
                out = model(input_ids=ids.to(r.b.device), attention_mask=mask.to(r.b.device),
                            labels=labels.to(r.b.device))
                out.loss.backward()
                opt.step()
                losses.append(out.loss.detach())
            return torch.stack(losses).cpu()

        return run_once

    entry = r.case("bert fine-tune, lengths 8..128", {"steps": BERT_STEPS}, BERT_STEPS, "step", make)
    if entry.get("first_compiles") is not None:
        entry["note"] = (f"first {BERT_STEPS} steps compiled {entry['first_compiles']} programs, "
                         f"the timed ones {entry['compiles']}")


WORKLOADS = {
    "tiny_ops": wl_tiny_ops,
    "chains": wl_chains,
    "norms": wl_norms,
    "mlp": wl_mlp,
    "adam": wl_adam,
    "attention": wl_attention,
    "item_loop": wl_item_loop,
    "first_step": wl_first_step,
    "generate": wl_generate,
    "prompts": wl_prompts,
    "padded_batches": wl_padded_batches,
}


def versions(backend: Backend) -> dict:
    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
    }
    if backend.name in XLA_BACKENDS:
        out["torch_xla"] = backend._torch_xla.__version__
    if backend.mode is not None:
        out["torch_pjrt"] = backend._tp.__version__
        # Build times of the engine and the plugin, so a report can tell when they changed
        # between the processes of one run.
        pkg = os.path.dirname(backend._tp.__file__)
        stamps = [
            os.path.getmtime(os.path.join(pkg, f))
            for f in sorted(os.listdir(pkg))
            if f.endswith(".so")
        ]
        out["engine_build"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(max(stamps))) if stamps else None
    return out


def run(backend_name: str, workload: str) -> dict:
    result = {"backend": backend_name, "workload": workload, "quick": QUICK, "reps": REPS, "warmup": WARMUP}
    result["loadavg_start"] = os.getloadavg()[0]
    rss0 = _maxrss_mb()
    threads = os.environ.get("BENCH_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    try:
        b = Backend(backend_name)
        result["versions"] = versions(b)
        with b.context():
            b.start()
            rss0 = _maxrss_mb()
            runner = Runner(b)
            WORKLOADS[workload](runner)
            b.sync()
        result["cases"] = runner.cases
        peak, source = b.device_peak()
        result["device_peak_mb"] = peak
        result["device_peak_source"] = source
        result["ok"] = True
    except Exception as e:
        result["ok"] = False
        result["error"] = f"{type(e).__name__}: {e}".strip()[:500]
        result["traceback"] = traceback.format_exc()[-2000:]
    # Peak RSS growth over the workload, inputs included; on the XLA CPU client device buffers
    # are host memory, so this covers them too.
    result["peak_rss_mb"] = _maxrss_mb() - rss0
    result["loadavg_end"] = os.getloadavg()[0]
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", required=True, choices=BACKENDS)
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--json-out", help="write the result here instead of stdout")
    args = ap.parse_args(argv)
    result = run(args.backend, args.workload)
    text = json.dumps(result)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
