"""The suite's workloads that JAX can express, as `jax.jit` programs, run in one process of the
JAX venv (.venv-jax): the ceiling the same XLA CPU compiler reaches on the same computations.

    .venv-jax/bin/python jax_workloads.py --workload norms --json-out out.json
    .venv-jax/bin/python jax_workloads.py --workload norms --dump-dir /tmp/jax-hlo

Each case has the name, shapes, dtypes and math of the torch case of the same name in
workloads.py, and is timed the same way: medians over BENCH_REPS repetitions after BENCH_WARMUP
warm-up ones, every repetition ending in `block_until_ready` (or a host read where the torch
case reads one) before the clock stops. Parameters and optimizer state are donated to the step
that updates them, as the torch optimizers update in place. Workloads with no JAX counterpart
(per-op eager loops, Hugging Face models) produce no cases.

Only the standard library, numpy and jax are imported: this venv has no torch. `--dump-dir`
writes, per case, the lowered StableHLO (`<case>.stablehlo.mlir`) and the HLO XLA compiled from
it (`<case>.compiled.hlo`), for comparison with the engine's TORCH_PJRT_DUMP_DIR modules.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
import resource
import statistics
import sys
import time
import traceback

QUICK = os.environ.get("BENCH_QUICK", "0") not in ("", "0")
REPS = max(1, int(os.environ.get("BENCH_REPS", "2" if QUICK else "5")))
WARMUP = max(1, int(os.environ.get("BENCH_WARMUP", "1" if QUICK else "2")))
BUDGET_S = float(os.environ.get("BENCH_BUDGET_S", "30" if QUICK else "150"))

# JAX picks its platform when first used: the CPU, as the other backends of the suite.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

_COMPILES = [0]


def _count_compiles(event: str, duration: float, **_kw) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILES[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compiles)


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _ready(out):
    """Blocks until every array in `out` is computed."""
    return jax.block_until_ready(out)


class Runner:
    """Times the cases of one workload, as workloads.Runner does for the torch backends."""

    def __init__(self, dump_dir: str | None):
        self.cases = []
        self.dump_dir = dump_dir

    def dump(self, case: str, fn, *args) -> None:
        """Writes the StableHLO `fn` lowers to for `args`, and the HLO XLA compiles from it."""
        if not self.dump_dir:
            return
        os.makedirs(self.dump_dir, exist_ok=True)
        stem = re.sub(r"[^A-Za-z0-9=.]+", "_", case).strip("_")
        lowered = fn.lower(*args)
        with open(os.path.join(self.dump_dir, f"{stem}.stablehlo.mlir"), "w") as f:
            f.write(lowered.as_text())
        with open(os.path.join(self.dump_dir, f"{stem}.compiled.hlo"), "w") as f:
            f.write(lowered.compile().as_text())

    def case(self, name: str, params: dict, per: int, unit: str, make):
        """`make()` returns one repetition, which returns what must be ready before the clock
        stops; `per` divides a repetition's time."""
        entry = {"case": name, "params": params, "per": unit, "count": per}
        try:
            run_once = make()
            started = time.perf_counter()
            first = first_compiles = None
            c_start = _COMPILES[0]
            for i in range(WARMUP):
                t0 = time.perf_counter()
                _ready(run_once())
                if i == 0:
                    first = time.perf_counter() - t0
                    first_compiles = _COMPILES[0] - c_start
                if time.perf_counter() - started > BUDGET_S:
                    entry["budget_hit"] = True
                    break
            c0 = _COMPILES[0]
            samples = []
            for _ in range(REPS):
                gc.collect()
                t0 = time.perf_counter()
                _ready(run_once())
                samples.append((time.perf_counter() - t0) / per)
                if time.perf_counter() - started > BUDGET_S:
                    entry["budget_hit"] = True
                    break
            entry.update(
                median_s=statistics.median(samples),
                samples_s=samples,
                first_s=first / per,
                reps=len(samples),
                compiles=_COMPILES[0] - c0,
                first_compiles=first_compiles,
            )
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}".strip()[:500]
            entry["traceback"] = traceback.format_exc()[-2000:]
        self.cases.append(entry)
        return entry


# --- the computations, as in workloads.py ------------------------------------------------------


def _chain(t, k):
    ops = (
        lambda t: t * 0.999,
        lambda t: t + 0.01,
        lambda t: jnp.maximum(t, 0.0),
        lambda t: t - 0.005,
    )
    for i in range(k):
        t = ops[i % len(ops)](t)
    return t


def _mfloats(n: int) -> str:
    return f"{n // 2**20}M" if n >= 2**20 else f"{n // 2**10}K"


def _layer_norm(x, w, b, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * w + b


def _linear_init(rng, fan_in: int, fan_out: int):
    """nn.Linear's default initialization: uniform in ±1/sqrt(fan_in), weight (out, in)."""
    bound = 1.0 / math.sqrt(fan_in)
    w = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
    b = rng.uniform(-bound, bound, (fan_out,)).astype(np.float32)
    return jnp.asarray(w), jnp.asarray(b)


def _linear(x, w, b):
    return x @ w.T + b


def _cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))


def _mlp(batches: int = 8):
    """The MLP 784-256-256-10 with SGD (lr 0.01, momentum 0.9) as one jitted step that donates
    the parameters and momentum buffers, and a few batches of 64."""
    rng = np.random.default_rng(0)
    params = [_linear_init(rng, 784, 256), _linear_init(rng, 256, 256), _linear_init(rng, 256, 10)]
    bufs = jax.tree_util.tree_map(jnp.zeros_like, params)
    data = [
        (jnp.asarray(rng.standard_normal((64, 784), dtype=np.float32)),
         jnp.asarray(rng.integers(0, 10, (64,), dtype=np.int64).astype(np.int32)))
        for _ in range(batches)
    ]

    def loss_fn(params, x, y):
        h = x
        for i, (w, b) in enumerate(params):
            h = _linear(h, w, b)
            if i < len(params) - 1:
                h = jax.nn.relu(h)
        return _cross_entropy(h, y)

    def step(params, bufs, x, y):
        # torch's SGD: buf = momentum * buf + grad (the first step's buf is the grad, as from
        # zeros here); p -= lr * buf.
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        bufs = jax.tree_util.tree_map(lambda m, g: 0.9 * m + g, bufs, grads)
        params = jax.tree_util.tree_map(lambda p, m: p - 0.01 * m, params, bufs)
        return loss, params, bufs

    return params, bufs, jax.jit(step, donate_argnums=(0, 1)), data


def wl_chains(r: Runner):
    sizes = (2**16, 2**18) if QUICK else (4 * 2**20, 16 * 2**20)
    ks = (4, 8) if QUICK else (4, 8, 16, 24)
    rng = np.random.default_rng(0)
    for n in sizes:
        x = jnp.asarray(rng.random(n, dtype=np.float32))
        for k in ks:
            name = f"k={k} n={_mfloats(n)}"

            def make(k=k, x=x, name=name):
                fn = jax.jit(lambda t: _chain(t, k).sum())
                r.dump(name, fn, x)
                # `.item()`: the sum read on the host.
                return lambda: float(fn(x))

            r.case(name, {"k": k, "n": n}, 1, "call", make)
        del x


def wl_norms(r: Runner):
    rows = 256 if QUICK else 4096
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((rows, 1024), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal(1024, dtype=np.float32))
    bias = jnp.asarray(rng.standard_normal(1024, dtype=np.float32))
    fns = {
        "layer_norm": lambda t, w, b: _layer_norm(t, w, b),
        "softmax": lambda t, w, b: jax.nn.softmax(t, axis=-1),
        # F.gelu's default: the exact, erf form.
        "gelu": lambda t, w, b: jax.nn.gelu(t, approximate=False),
    }
    for name, f in fns.items():
        case = f"{name} {rows}x1024"

        def make(f=f, case=case):
            fn = jax.jit(f)
            r.dump(case, fn, x, w, bias)
            return lambda: fn(x, w, bias)

        r.case(case, {"op": name, "rows": rows}, 1, "call", make)


def wl_mlp(r: Runner):
    steps = 3 if QUICK else 20
    for sync_each in (True, False):

        def make(sync_each=sync_each):
            params, bufs, step, data = _mlp()
            state = [params, bufs]
            if sync_each:
                r.dump("mlp step", step, params, bufs, *data[0])

            def run_once():
                loss = None
                for i in range(steps):
                    loss, state[0], state[1] = step(state[0], state[1], *data[i % len(data)])
                    if sync_each:
                        _ready((loss, state[0]))
                return loss, state[0]

            return run_once

        name = "sync every step" if sync_each else "no sync (one at the end)"
        r.case(name, {"steps": steps, "sync_each_step": sync_each}, steps, "step", make)

    def make_products():
        params, _, _, data = _mlp()
        (w1, _), (w2, _), (w3, _) = params
        x = data[0][0]
        rng = np.random.default_rng(2)
        h1, h2, g1, g2 = (jnp.asarray(rng.standard_normal((64, 256), dtype=np.float32)) for _ in range(4))
        g3 = jnp.asarray(rng.standard_normal((64, 10), dtype=np.float32))

        def products(x, h1, h2, g1, g2, g3):
            return (x @ w1.T, h1 @ w2.T, h2 @ w3.T,
                    g3.T @ h2, g3 @ w3, g2.T @ h1, g2 @ w2, g1.T @ x)

        fn = jax.jit(products)
        r.dump("mlp products", fn, x, h1, h2, g1, g2, g3)

        def run_once():
            out = None
            for _ in range(steps):
                out = _ready(fn(x, h1, h2, g1, g2, g3))
            return out

        return run_once

    r.case("the step's 8 matrix products alone", {"steps": steps, "diagnostic": True}, steps, "step",
           make_products)


def wl_item_loop(r: Runner):
    steps = 3 if QUICK else 20

    def make():
        params, bufs, step, data = _mlp()
        state = [params, bufs]

        def run_once():
            total = 0.0
            for i in range(steps):
                loss, state[0], state[1] = step(state[0], state[1], *data[i % len(data)])
                total += float(loss)
            return total, state[0]

        return run_once

    r.case("loss.item() every step", {"steps": steps}, steps, "step", make)


def wl_adam(r: Runner):
    """Adam (torch's defaults: betas 0.9/0.999, eps 1e-8) over 200 parameters, the learning
    rate from the same schedule passed as an argument every step, so it never recompiles."""
    count = 20 if QUICK else 200
    steps = 2 if QUICK else 5
    lo, hi = 4096, 65536
    sizes = [int(round((lo + (hi - lo) * i / (count - 1)) / 256)) * 256 for i in range(count)]
    b1, b2, eps = 0.9, 0.999, 1e-8

    def make():
        rng = np.random.default_rng(0)
        params = [jnp.asarray(rng.standard_normal(s, dtype=np.float32)) for s in sizes]
        grads = [jnp.asarray(rng.standard_normal(s, dtype=np.float32) * 1e-3) for s in sizes]
        state = {
            "params": params,
            "m": [jnp.zeros_like(p) for p in params],
            "v": [jnp.zeros_like(p) for p in params],
            "t": 0,
        }

        def update(params, m, v, grads, lr, t):
            # torch's single-tensor Adam: bias corrections from the step count, then
            # p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps).
            bc1 = 1 - b1 ** t
            bc2_sqrt = jnp.sqrt(1 - b2 ** t)
            new_p, new_m, new_v = [], [], []
            for p, mi, vi, g in zip(params, m, v, grads):
                mi = b1 * mi + (1 - b1) * g
                vi = b2 * vi + (1 - b2) * g * g
                denom = jnp.sqrt(vi) / bc2_sqrt + eps
                new_p.append(p - (lr / bc1) * mi / denom)
                new_m.append(mi)
                new_v.append(vi)
            return new_p, new_m, new_v

        fn = jax.jit(update, donate_argnums=(0, 1, 2))
        r.dump("adam", fn, state["params"], state["m"], state["v"], grads, jnp.float32(1e-3),
               jnp.float32(1))

        def lr_at(s):
            return 1e-3 * min(1.0, (s + 1) / 10) * 0.5 * (1 + math.cos(math.pi * s / 1000))

        def run_once():
            for _ in range(steps):
                lr = lr_at(state["t"])
                state["t"] += 1
                state["params"], state["m"], state["v"] = fn(
                    state["params"], state["m"], state["v"], grads, jnp.float32(lr),
                    jnp.float32(state["t"]))
                _ready(state["params"])
            return state["params"]

        return run_once

    r.case(
        f"{count} params, {sum(sizes) / 1e6:.1f}M floats",
        {"params": count, "floats": sum(sizes), "steps": steps},
        steps,
        "step",
        make,
    )


def wl_attention(r: Runner):
    """The pre-LN causal self-attention block, forward and the parameters' gradients."""
    batch, seq, width, heads = (2, 64, 64, 4) if QUICK else (8, 256, 256, 4)
    hd = width // heads

    def make():
        rng = np.random.default_rng(0)
        params = {
            "ln_w": jnp.ones(width, jnp.float32),
            "ln_b": jnp.zeros(width, jnp.float32),
            "qkv": _linear_init(rng, width, 3 * width),
            "proj": _linear_init(rng, width, width),
        }
        x = jnp.asarray(np.random.default_rng(1).standard_normal((batch, seq, width), dtype=np.float32))

        def block(p, x):
            qkv = _linear(_layer_norm(x, p["ln_w"], p["ln_b"]), *p["qkv"])
            qkv = qkv.reshape(batch, seq, 3, heads, hd).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            scores = (q @ jnp.swapaxes(k, -1, -2)) / math.sqrt(hd)
            causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
            scores = jnp.where(causal, scores, -jnp.inf)
            a = jax.nn.softmax(scores, axis=-1) @ v
            return x + _linear(a.transpose(0, 2, 1, 3).reshape(batch, seq, width), *p["proj"])

        def fwd_bwd(p, x):
            return jax.value_and_grad(lambda p: jnp.mean(jnp.square(block(p, x))))(p)

        fn = jax.jit(fwd_bwd)
        r.dump("attention", fn, params, x)
        return lambda: fn(params, x)

    r.case(
        f"batch {batch}, seq {seq}, width {width}, {heads} heads",
        {"batch": batch, "seq": seq, "width": width, "heads": heads},
        1,
        "call",
        make,
    )


WORKLOADS = {
    "chains": wl_chains,
    "norms": wl_norms,
    "mlp": wl_mlp,
    "adam": wl_adam,
    "attention": wl_attention,
    "item_loop": wl_item_loop,
}


def _jaxlib_version():
    try:
        import jaxlib

        return jaxlib.__version__
    except Exception:  # a jax without its own jaxlib module
        return None


def run(workload: str, dump_dir: str | None) -> dict:
    result = {"backend": "jax", "workload": workload, "quick": QUICK, "reps": REPS, "warmup": WARMUP}
    result["loadavg_start"] = os.getloadavg()[0]
    result["versions"] = {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": _jaxlib_version(),
        "cpus": os.cpu_count(),
    }
    rss0 = _maxrss_mb()
    try:
        _ready(jnp.ones(4) + 1)  # the runtime started outside the clock
        rss0 = _maxrss_mb()
        runner = Runner(dump_dir)
        fn = WORKLOADS.get(workload)
        if fn is not None:
            fn(runner)
        result["cases"] = runner.cases
        result["ok"] = True
    except Exception as e:
        result["ok"] = False
        result["error"] = f"{type(e).__name__}: {e}".strip()[:500]
        result["traceback"] = traceback.format_exc()[-2000:]
    result["peak_rss_mb"] = _maxrss_mb() - rss0
    result["loadavg_end"] = os.getloadavg()[0]
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--json-out", help="write the result here instead of stdout")
    ap.add_argument("--dump-dir", help="write each case's StableHLO and compiled HLO here")
    args = ap.parse_args(argv)
    result = run(args.workload, args.dump_dir)
    text = json.dumps(result)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
