"""The compiled mode: ``torch.compile(model, backend="pjrt")`` (RFC 0033).

Dynamo hands the backend an FX graph; AOTAutograd functionalizes it and splits training into a
forward and a backward graph (input mutations such as BatchNorm's running statistics or an
optimizer's state stay in the graph as ``copy_`` into the input). Each graph then runs through
the engine's own pipeline in DeferAndFuse, between two region boundaries: everything pending
before it is launched first, and its ops are launched as one region when it returns, without
waiting. So a graph is one program, compiled once and cached in the three tiers like any region,
whatever eager mode the code around it runs in.

An op the device has no kernel for would run on the CPU in the middle of the graph: compiling
such a graph raises an error that names the op, instead of cutting the program silently.
"""

from __future__ import annotations

import collections
import sys
import threading
import time

from . import _host_prologue, _native

# Dispatch keys whose kernels serve every device: an op with one of them runs through the
# device's kernels for the ops it calls.
_DEVICE_GENERIC_KEYS = (
    "PrivateUse1",
    "CompositeExplicitAutograd",
    "CompositeExplicitAutogradNonFunctional",
    "CompositeImplicitAutograd",
)
_GRAPHS_KEPT = 32

_lock = threading.Lock()
_counters = {"graphs": 0, "runs": 0, "replays": 0, "compile_seconds": 0.0}
_latest = collections.deque(maxlen=_GRAPHS_KEPT)
_graph_break_baseline = 0


def _dynamo_graph_breaks() -> int:
    """Graph breaks Dynamo has counted in this process (every backend's: Dynamo decides them
    before any backend sees a graph)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    return int(sum(utils.counters.get("graph_break", {}).values()))


def metrics() -> dict:
    """The compiled mode's counters, merged into ``torch_pjrt.metrics()``."""
    global _graph_break_baseline
    breaks = _dynamo_graph_breaks()
    with _lock:
        if breaks < _graph_break_baseline:  # torch._dynamo.reset() cleared Dynamo's counters
            _graph_break_baseline = 0
        return {
            "compiled_graphs": _counters["graphs"],
            "compiled_graph_runs": _counters["runs"],
            "compiled_graph_replays": _counters["replays"],
            "compiled_graph_seconds": _counters["compile_seconds"],
            "compiled_graph_list": [dict(g) for g in _latest],
            "graph_breaks": breaks - _graph_break_baseline,
        }


def reset_metrics() -> None:
    global _graph_break_baseline
    with _lock:
        _counters.update(graphs=0, runs=0, replays=0, compile_seconds=0.0)
        _latest.clear()
        _graph_break_baseline = _dynamo_graph_breaks()


def _ops_without_device_kernel(gm) -> list[str]:
    import torch

    missing = []
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        name = target.name()
        if not any(
            torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
            for key in _DEVICE_GENERIC_KEYS
        ):
            missing.append(name)
    return sorted(set(missing))


def _fallback_counts() -> dict:
    from ._api import metrics

    return dict(metrics().get("fallback_ops") or {})


def _draws_random_numbers(gm) -> bool:
    import torch

    seeded = torch.Tag.nondeterministic_seeded
    return any(
        n.op == "call_function"
        and isinstance(n.target, torch._ops.OpOverload)
        and seeded in n.target.tags
        for n in gm.graph.nodes
    )


class _Replay:
    """A recorded graph: the engine's program handle, what the inputs looked like, and how to
    build the outputs from the inputs and the fresh storages the program fills."""

    def __init__(self, handle, offsets, storages, fresh, recipes):
        self.handle = handle
        self.offsets = offsets  # each input's storage offset
        self.storages = storages  # how many distinct storages the inputs had
        self.fresh = fresh  # (elements, dtype) of each fresh storage
        self.recipes = recipes
        self.misses = 0


def _storage_key(t) -> int:
    return t.untyped_storage().data_ptr()


def _plan_outputs(args, outputs):
    """(fresh tensors, recipes) for rebuilding `outputs` on a replay, or None when they cannot
    be rebuilt from the inputs and fresh storages."""
    import torch

    by_identity = {id(a): k for k, a in enumerate(args)}
    by_storage = {}
    for k, a in enumerate(args):
        by_storage.setdefault(_storage_key(a), k)
    fresh, fresh_index, recipes = [], {}, []
    for out in outputs if isinstance(outputs, (list, tuple)) else ():
        if out is None:
            recipes.append(None)
            continue
        if not isinstance(out, torch.Tensor) or out.device.type != "pjrt":
            return None
        if id(out) in by_identity:
            recipes.append(("input", by_identity[id(out)]))
            continue
        geometry = (tuple(out.shape), out.stride(), out.storage_offset())
        key = _storage_key(out)
        if key in by_storage:
            k = by_storage[key]
            if args[k].dtype != out.dtype:
                return None
            recipes.append(("view", k, geometry))
            continue
        m = fresh_index.get(key)
        if m is None:
            m = fresh_index[key] = len(fresh)
            fresh.append(out)
        recipes.append(("fresh", m, geometry))
    if not isinstance(outputs, (list, tuple)):
        return None
    return fresh, recipes


class _CompiledGraph:
    """One AOTAutograd graph (forward, backward or inference), run as one region. Its first
    call runs and waits (the compile is the graph's); its second runs and records the region as
    a program over the graph's storages; later calls replay that program without running the
    graph's ops, whenever the inputs are pjrt tensors shaped as when it was recorded."""

    def __init__(self, gm, kind: str, name: str, host_ops: int = 0):
        self.gm = gm
        self.kind = kind
        self.name = name
        self.ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
        self.host_ops = host_ops  # CPU ops split off into a host prologue
        self.warm = False
        # Random ops draw from the generator's state as scalars of their own: a recorded
        # program would repeat its numbers.
        self.recordable = not _draws_random_numbers(gm)
        self.replay = None

    def __call__(self, args):
        engine = _native.ensure_started()
        if self.replay is not None:
            outputs = self._replayed(args)
            if outputs is not None:
                return outputs
        elif self.warm and self.recordable:
            return self._recording(engine, args)
        if not self.warm:
            return self._first_call(engine, args)
        return self._run(engine, args)

    def _replayed(self, args):
        import torch

        replay = self.replay
        if len(args) != len(replay.offsets):
            return None
        storages = set()
        for a, offset in zip(args, replay.offsets):
            if (
                not isinstance(a, torch.Tensor)
                or a.device.type != "pjrt"
                or a.storage_offset() != offset
            ):
                return None
            storages.add(_storage_key(a))
        if len(storages) != replay.storages:
            return None
        # The program runs on its inputs' device; its fresh results are made there too.
        device = args[0].device if args else torch.device("pjrt")
        fresh = [torch.empty(n, dtype=dtype, device=device) for n, dtype in replay.fresh]
        if not torch.ops.torch_pjrt.graph_replay(replay.handle, args, fresh):
            replay.misses += 1
            if replay.misses > 3:  # the program keeps being unusable: stop asking
                self.replay = None
            return None
        outputs = []
        for recipe in replay.recipes:
            if recipe is None:
                outputs.append(None)
            elif recipe[0] == "input":
                outputs.append(args[recipe[1]])
            else:
                base = args[recipe[1]] if recipe[0] == "view" else fresh[recipe[1]]
                size, stride, offset = recipe[2]
                outputs.append(base.as_strided(size, stride, offset))
        with _lock:
            _counters["runs"] += 1
            _counters["replays"] += 1
        return tuple(outputs)

    def _recording(self, engine, args):
        import torch

        self.recordable = False  # recorded at most once
        if not all(isinstance(a, torch.Tensor) and a.device.type == "pjrt" for a in args):
            return self._run(engine, args)
        # Pending ops that make only inputs (autograd's `ones_like` seed of a backward graph)
        # join the region: the program computes them, and a replay drops them.
        torch.ops.torch_pjrt.graph_begin_record(args)
        try:
            outputs = self.gm(*args)
            plan = _plan_outputs(args, outputs)
        except BaseException:
            _native.check(engine.tpjrt_graph_end())
            raise
        if plan is None:
            _native.check(engine.tpjrt_graph_end())
        else:
            fresh, recipes = plan
            handle = torch.ops.torch_pjrt.graph_end_record(args, fresh)
            if handle:
                self.replay = _Replay(
                    handle,
                    [a.storage_offset() for a in args],
                    len({_storage_key(a) for a in args}),
                    [(f.untyped_storage().nbytes() // f.element_size(), f.dtype) for f in fresh],
                    recipes,
                )
        with _lock:
            _counters["runs"] += 1
        return outputs

    def _run(self, engine, args):
        # Pending work of the code around the graph is launched as its own region, and the
        # graph's ops become one region, launched when it returns.
        _native.check(engine.tpjrt_graph_begin())
        try:
            outputs = self.gm(*args)
        finally:
            _native.check(engine.tpjrt_graph_end())
        with _lock:
            _counters["runs"] += 1
        return outputs

    def _first_call(self, engine, args):
        """Runs the graph once and waits for it: the compile it causes is the graph's, and an
        op that fell back to the CPU on the way is an error (the static check cannot see inside
        composite kernels)."""
        from ._api import metrics

        _native.check(engine.tpjrt_sync())
        before = metrics()
        fallbacks_before = dict(before.get("fallback_ops") or {})
        start = time.perf_counter()
        outputs = self._run(engine, args)
        _native.check(engine.tpjrt_sync())
        seconds = time.perf_counter() - start
        after = metrics()
        fell_back = sorted(
            op
            for op, count in (after.get("fallback_ops") or {}).items()
            if count > fallbacks_before.get(op, 0)
        )
        if fell_back:
            raise NotImplementedError(_fallback_message(self.name, fell_back))
        record = {
            "graph": self.name,
            "kind": self.kind,
            "ops": self.ops,
            "host_ops": self.host_ops,
            "programs": int(after["compilations"] - before["compilations"]),
            "compile_seconds": float(after["compile_seconds"] - before["compile_seconds"]),
            "first_run_seconds": seconds,
        }
        with _lock:
            _counters["graphs"] += 1
            _counters["compile_seconds"] += record["compile_seconds"]
            _latest.append(record)
        self.warm = True
        return outputs


def _fallback_message(graph: str, ops: list[str]) -> str:
    listed = ", ".join(ops)
    return (
        f"torch.compile(backend='pjrt'): graph {graph} calls {listed}, which the pjrt device has "
        "no kernel for: in eager mode it runs on the CPU, but a compiled graph must run on the "
        "device as one program. Run that part of the model eagerly (wrap it in "
        "torch._dynamo.disable) or compile with another backend."
    )


_graph_numbers = collections.Counter()


def _compiler(kind: str):
    def compile_graph(gm, example_inputs):
        # CPU scalar inputs (a non-capturable optimizer's steps, a learning rate): their CPU
        # ops become a prologue, so the device part takes pjrt tensors only and is replayed.
        split = _host_prologue.split(gm)
        device_gm = gm if split is None else split.device
        missing = _ops_without_device_kernel(device_gm)
        with _lock:
            _graph_numbers[kind] += 1
            name = f"{kind}_{_graph_numbers[kind]}"
        if missing:
            raise NotImplementedError(_fallback_message(name, missing))
        graph = _CompiledGraph(device_gm, kind, name, 0 if split is None else split.host_ops)

        if split is None:

            def run(args):
                return graph(args)

        else:

            def run(args):
                return split.run(args, graph)

        run._boxed_call = True  # AOTAutograd calls it with one list of arguments
        run.graph = graph
        return run

    return compile_graph


def pjrt_backend(gm, example_inputs, **options):
    """The Dynamo backend ``"pjrt"``: AOTAutograd's graphs, each run as one engine region."""
    if options:
        unknown = ", ".join(sorted(options))
        raise ValueError(
            f"torch.compile(backend='pjrt') takes no options, got {unknown}: the engine's own "
            "settings (TORCH_PJRT_* variables, torch_pjrt.eager_mode) apply to compiled graphs"
        )
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        keep_inference_input_mutations=True,
        partition_fn=min_cut_rematerialization_partition,
    )
    return backend(gm, example_inputs)


_INDUCTOR_MESSAGE = (
    "torch.compile's default backend, inductor, generates code for CPU and CUDA devices and "
    "cannot compile a model on the 'pjrt' device: compile it with "
    "torch.compile(model, backend=\"pjrt\") instead"
)


def _refuse_inductor_on_pjrt() -> None:
    """Makes inductor, given pjrt tensors, fail at once with a message naming the pjrt backend
    (it would fail deep in its code generation otherwise)."""
    import torch

    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    original = getattr(wrapper, "__call__", None)
    if original is None or getattr(original, "_torch_pjrt", False):
        return

    def __call__(self, model_, inputs_, *args, **kwargs):
        if any(getattr(getattr(t, "device", None), "type", None) == "pjrt" for t in inputs_):
            raise RuntimeError(_INDUCTOR_MESSAGE)
        return original(self, model_, inputs_, *args, **kwargs)

    __call__._torch_pjrt = True
    __call__.__wrapped__ = original
    wrapper.__call__ = __call__


def register() -> None:
    """Registers the backend with Dynamo now when Dynamo is already imported (the
    ``torch_dynamo_backends`` entry point registers it lazily otherwise), and the inductor
    guard. Never imports Dynamo."""
    _refuse_inductor_on_pjrt()
    registry = sys.modules.get("torch._dynamo.backends.registry")
    if registry is not None and "pjrt" not in registry._COMPILER_FNS:
        registry.register_backend(pjrt_backend, name="pjrt")
