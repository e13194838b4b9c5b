"""The compiled mode, `torch.compile(model, backend="pjrt")`, against the CPU and against
DeferAndFuse: values, graphs and programs counted, input mutations written back, the cache
tiers, dynamic shapes and the errors a user meets (RFC 0033)."""

import copy
import gc
import json
import os
import sys

import pytest
import torch
import torch.nn as nn

import torch_pjrt
from conftest import in_mode_without_fallbacks, run_python

TOL = {"rtol": 2e-4, "atol": 2e-4}
GRAD_TOL = {"rtol": 1e-3, "atol": 1e-3}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: Dynamo's caches hold graphs of earlier tests' models."""
    torch._dynamo.reset()
    torch_pjrt.sync()
    torch_pjrt.reset_metrics()
    yield
    torch._dynamo.reset()
    # Dynamo's and AOTAutograd's objects hold device tensors in reference cycles: free them
    # now, not at some later test's garbage collection (the memory tests measure peaks).
    gc.collect()
    torch_pjrt.sync()


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(8, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)
    )


def _counts():
    torch_pjrt.sync()
    m = torch_pjrt.metrics()
    keys = (
        "compilations", "regions", "compiled_graphs", "compiled_graph_runs",
        "compiled_graph_replays", "graph_replays", "ops",
    )
    return {k: m[k] for k in keys}


def test_backend_is_listed_after_import_torch():
    # The torch_dynamo_backends entry point: no explicit `import torch_pjrt`.
    proc = run_python(
        """
        import torch, torch._dynamo
        print("pjrt" in torch._dynamo.list_backends())
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("True"), proc.stdout


def test_inference_matches_cpu_as_one_region_per_call():
    cpu = _mlp().eval()
    model = torch.compile(copy.deepcopy(cpu).to("pjrt"), backend="pjrt")
    x = torch.randn(16, 8)
    with torch.no_grad(), in_mode_without_fallbacks("strict"):
        torch.testing.assert_close(model(x.to("pjrt")).cpu(), cpu(x), **TOL)
        warm = _counts()
        assert warm["compiled_graphs"] == 1
        for _ in range(3):
            x = torch.randn(16, 8)
            torch.testing.assert_close(model(x.to("pjrt")).cpu(), cpu(x), **TOL)
        after = _counts()
    assert after["compilations"] == warm["compilations"], "no program after the first call"
    assert after["compiled_graph_runs"] - warm["compiled_graph_runs"] == 3
    # The graph's ops run as one region each call, whatever the surrounding mode: captured
    # on the second call, which records the region as a program; the later calls replay it.
    assert after["regions"] - warm["regions"] == 1
    assert after["compiled_graph_replays"] - warm["compiled_graph_replays"] == 2
    assert after["graph_replays"] - warm["graph_replays"] == 2
    graph = torch_pjrt.metrics()["compiled_graph_list"][-1]
    assert graph["kind"] == "inference" and graph["ops"] >= 6 and graph["programs"] == 1


def _train(model, opt, batches, step_fn):
    losses = []
    for x, y in batches:
        loss = step_fn(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return [float(l) for l in losses]


def _batches(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)) for _ in range(steps)]


def _loss(model, x, y):
    return nn.functional.mse_loss(model(x), y)


def test_training_loop_losses_equal_defer_and_fuse_with_no_program_after_warm_up():
    steps = 20
    batches = [(x.to("pjrt"), y.to("pjrt")) for x, y in _batches(steps)]

    eager = _mlp().to("pjrt")
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    with torch_pjrt.eager_mode("defer_and_fuse"):
        expected = _train(eager, eager_opt, batches, _loss)

    model = _mlp().to("pjrt")
    compiled = torch.compile(model, backend="pjrt")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with in_mode_without_fallbacks("defer_and_fuse"):
        losses = _train(compiled, opt, batches[:2], _loss)
        warm = _counts()
        losses += _train(compiled, opt, batches[2:], _loss)
        after = _counts()
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-6, atol=1e-6)
    assert warm["compiled_graphs"] == 2, "a forward and a backward graph"
    # The second step records each graph as a program, and the later ones replay it.
    assert after["compiled_graph_replays"] - warm["compiled_graph_replays"] == 2 * (steps - 2)
    assert after["compilations"] == warm["compilations"]
    assert after["compiled_graph_runs"] - warm["compiled_graph_runs"] == 2 * (steps - 2)
    kinds = [g["kind"] for g in torch_pjrt.metrics()["compiled_graph_list"]]
    assert kinds == ["forward", "backward"]


def test_batchnorm_running_statistics_are_written_back_in_place():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 4))
    model = copy.deepcopy(cpu).to("pjrt")
    running_mean = model[1].running_mean
    compiled = torch.compile(model, backend="pjrt")
    for x, y in _batches(4):
        _loss(cpu, x, y).backward()
        _loss(compiled, x.to("pjrt"), y.to("pjrt")).backward()
    assert model[1].running_mean is running_mean
    torch.testing.assert_close(model[1].running_mean.cpu(), cpu[1].running_mean, **TOL)
    torch.testing.assert_close(model[1].running_var.cpu(), cpu[1].running_var, **TOL)
    assert int(model[1].num_batches_tracked.cpu()) == 4
    for p, q in zip(model.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, **GRAD_TOL)


def test_a_compiled_optimizer_step_follows_a_learning_rate_schedule_without_recompiling():
    cpu = _mlp()
    model = copy.deepcopy(cpu).to("pjrt")
    # A tensor learning rate is a graph input, so the schedule changes data, not the program.
    opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01), capturable=True)
    cpu_opt = torch.optim.Adam(cpu.parameters(), lr=torch.tensor(0.01))
    scheds = [
        torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s)) for o in (opt, cpu_opt)
    ]

    @torch.compile(backend="pjrt")
    def step():
        opt.step()

    for i, (x, y) in enumerate(_batches(6)):
        if i == 2:
            warm = _counts()
        _loss(model, x.to("pjrt"), y.to("pjrt")).backward()
        _loss(cpu, x, y).backward()
        step()
        cpu_opt.step()
        for o in (opt, cpu_opt):
            o.zero_grad()
        for s in scheds:
            s.step()
    after = _counts()
    assert after["compilations"] == warm["compilations"]
    assert after["compiled_graphs"] == warm["compiled_graphs"]
    for p, q in zip(model.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), **GRAD_TOL)


def test_a_whole_training_step_compiles_forward_backward_and_optimizer():
    cpu = _mlp()
    model = copy.deepcopy(cpu).to("pjrt")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cpu_opt = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9)

    def train_step(model, opt, x, y):
        loss = _loss(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    compiled_step = torch.compile(train_step, backend="pjrt")
    for i, (x, y) in enumerate(_batches(5)):
        if i == 2:
            warm = _counts()
        loss = compiled_step(model, opt, x.to("pjrt"), y.to("pjrt"))
        expected = train_step(cpu, cpu_opt, x, y)
        torch.testing.assert_close(loss.cpu(), expected.detach(), **TOL)
    after = _counts()
    assert after["compilations"] == warm["compilations"]
    kinds = {g["kind"] for g in torch_pjrt.metrics()["compiled_graph_list"]}
    assert kinds == {"forward", "backward", "inference"}, kinds
    # `loss.backward()` inside the function is where Dynamo breaks the graph.
    assert torch_pjrt.metrics()["graph_breaks"] >= 1


def test_dynamic_shapes_run_every_size_with_the_same_graph():
    cpu = _mlp().eval()
    model = torch.compile(copy.deepcopy(cpu).to("pjrt"), backend="pjrt", dynamic=True)
    with torch.no_grad():
        for batch in (3, 7, 12, 5):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(model(x.to("pjrt")).cpu(), cpu(x), **TOL)
    assert torch_pjrt.metrics()["compiled_graphs"] == 1


def test_inductor_on_a_pjrt_model_names_the_pjrt_backend():
    model = torch.compile(_mlp().to("pjrt"))
    with pytest.raises(Exception, match=r'backend="pjrt"'):
        model(torch.randn(2, 8, device="pjrt"))


def test_an_op_without_a_device_kernel_is_an_error_that_names_it():
    @torch.compile(backend="pjrt")
    def f(x):
        return torch.special.bessel_j0(x) + 1

    with pytest.raises(Exception, match=r"aten::special_bessel_j0.*no kernel") as info:
        f(torch.randn(4, device="pjrt"))
    assert "torch._dynamo.disable" in str(info.value)
    # The engine stays usable.
    assert float((torch.ones(2, device="pjrt") * 3).sum()) == 6.0


def test_graph_breaks_and_graphs_are_counted_and_reported():
    @torch.compile(backend="pjrt")
    def f(x):
        y = x.sin() * 2
        torch._dynamo.graph_break()
        return y.cos() + 1

    x = torch.randn(8)
    torch.testing.assert_close(f(x.to("pjrt")).cpu(), (x.sin() * 2).cos() + 1, **TOL)
    m = torch_pjrt.metrics()
    assert m["graph_breaks"] == 1
    assert m["compiled_graphs"] == 2
    assert m["compiled_graph_seconds"] > 0
    report = torch_pjrt.metrics_report()
    assert "compiled graphs (torch.compile" in report
    assert all(g["graph"] in report for g in m["compiled_graph_list"])
    torch_pjrt.reset_metrics()
    m = torch_pjrt.metrics()
    assert m["graph_breaks"] == 0 and m["compiled_graphs"] == 0 and m["compiled_graph_list"] == []


RESTART_PROBE = """
import json, torch, torch_pjrt
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
compiled = torch.compile(model.to("pjrt"), backend="pjrt")
x = torch.randn(5, 8, device="pjrt")
torch_pjrt.sync()
torch_pjrt.reset_metrics()
compiled(x).sum().backward()
torch_pjrt.sync()
m = torch_pjrt.metrics()
print(json.dumps({k: m[k] for k in ("compilations", "cache_hits_tier3", "compiled_graphs")}))
"""


def test_a_restarted_process_with_a_cache_directory_compiles_nothing(tmp_path):
    env = {"TORCH_PJRT_CACHE_DIR": str(tmp_path)}
    runs = []
    for _ in range(2):
        proc = run_python(RESTART_PROBE, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["compilations"] >= 2 and first["compiled_graphs"] == 2
    assert second["compilations"] == 0, second
    assert second["cache_hits_tier3"] >= 2 and second["compiled_graphs"] == 2


@pytest.mark.parametrize("name", ["gpt2", "bert", "vit", "llama"])
def test_hf_models_compile_as_full_graphs_like_the_cpu(name):
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    import hf

    cpu, inputs = hf.build(name, layers=1)
    # Without a loss type the model logs a warning from inside forward, which Dynamo cannot
    # trace under any backend.
    if getattr(cpu, "loss_type", "") is None:
        cpu.loss_type = "ForCausalLM"
    model = copy.deepcopy(cpu).to("pjrt")
    expected = cpu(**inputs)
    expected.loss.backward()
    compiled = torch.compile(model, backend="pjrt", fullgraph=True)
    with in_mode_without_fallbacks("strict"):
        out = compiled(**hf.to_device(inputs, "pjrt"))
        out.loss.backward()
        actual = hf.tensors(out)
        for key, e in hf.tensors(expected).items():
            torch.testing.assert_close(actual[key].detach().cpu(), e.detach(), **TOL)
        for (n, p), q in zip(model.named_parameters(), cpu.parameters()):
            if q.grad is not None:
                torch.testing.assert_close(
                    p.grad.cpu(), q.grad, msg=lambda m: f"{name} gradient of {n}: {m}", **GRAD_TOL
                )
    m = torch_pjrt.metrics()
    assert m["compiled_graphs"] == 2 and m["graph_breaks"] == 0


def test_replays_capture_nothing_and_follow_new_inputs():
    cpu = _mlp().eval()
    model = torch.compile(copy.deepcopy(cpu).to("pjrt"), backend="pjrt")
    with torch.no_grad(), in_mode_without_fallbacks("strict"):
        for _ in range(2):
            model(torch.randn(16, 8, device="pjrt"))
        before = _counts()
        for _ in range(5):
            x = torch.randn(16, 8)
            torch.testing.assert_close(model(x.to("pjrt")).cpu(), cpu(x), **TOL)
        after = _counts()
    assert after["compiled_graph_replays"] - before["compiled_graph_replays"] == 5
    # The uploads and reads are the only engine ops: the graph's own ops are not captured.
    assert after["ops"] - before["ops"] <= 2 * 5, (before, after)


def test_a_graph_that_draws_random_numbers_is_never_replayed():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.Dropout(0.5)).to("pjrt").train()
    compiled = torch.compile(model, backend="pjrt")
    x = torch.randn(4, 8, device="pjrt")
    with torch.no_grad():
        masks = [(compiled(x) == 0).cpu() for _ in range(4)]
    assert torch_pjrt.metrics()["compiled_graph_replays"] == 0
    assert not all(torch.equal(masks[0], m) for m in masks[1:]), "every call draws new numbers"


def test_a_replay_reads_inputs_at_their_own_offsets():
    @torch.compile(backend="pjrt", dynamic=False)
    def f(x):
        return (x * 2).sum(0)

    base = torch.randn(8, 4)
    pbase = base.to("pjrt")
    for start in (0, 0, 0, 2, 4, 0):
        # Views of one storage at new offsets: the program read the recorded offset, so a
        # replay at another one must not reuse it blindly.
        torch.testing.assert_close(f(pbase[start : start + 4]).cpu(), (base[start : start + 4] * 2).sum(0), **TOL)


def test_an_out_of_range_index_in_a_replayed_graph_raises_at_the_read():
    emb = nn.Embedding(10, 4).to("pjrt")
    compiled = torch.compile(emb, backend="pjrt")
    with torch.no_grad():
        for _ in range(3):
            compiled(torch.tensor([1, 2, 3], device="pjrt")).cpu()
        assert torch_pjrt.metrics()["compiled_graph_replays"] >= 1
        with pytest.raises((IndexError, RuntimeError), match="out of"):
            compiled(torch.tensor([1, 12, 3], device="pjrt")).cpu()
        # The engine stays usable, and so does the program.
        torch.testing.assert_close(
            compiled(torch.tensor([4], device="pjrt")).cpu(), emb.weight[4:5].detach().cpu()
        )



def _default_optimizer(optimizer, params, scheduled):
    """A default-constructed optimizer (CPU step counters, not capturable): with a float learning
    rate, or with a CPU tensor one and a schedule (a float one under a schedule is a new constant
    to Dynamo at every value: it recompiles the step, whatever the backend's graphs)."""
    if not scheduled:
        return optimizer(params), None
    opt = optimizer(params, lr=torch.tensor(1e-2))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.1 * s))


@pytest.mark.parametrize("scheduled", [False, True], ids=["float_lr", "scheduled_tensor_lr"])
@pytest.mark.parametrize("optimizer", [torch.optim.Adam, torch.optim.AdamW])
def test_a_default_optimizer_step_with_cpu_scalars_is_replayed(optimizer, scheduled):
    # Dynamo hands the step's graph the step counters (and a tensor learning rate) as CPU 0-d
    # tensors. Their CPU ops run before the graph's device part, whose program is recorded once
    # and replayed with the new values uploaded.
    steps, warm_up = 20, 5
    batches = [(x.to("pjrt"), y.to("pjrt")) for x, y in _batches(steps)]

    def train(compile_step):
        model = _mlp().to("pjrt")
        opt, sched = _default_optimizer(optimizer, model.parameters(), scheduled)
        step = torch.compile(opt.step, backend="pjrt") if compile_step else opt.step
        losses, warm = [], None
        for i, (x, y) in enumerate(batches):
            if i == warm_up:
                warm = _counts()
            loss = _loss(model, x, y)
            loss.backward()
            step()
            opt.zero_grad()
            if sched is not None:
                sched.step()
            losses.append(loss.detach())
        return model, [float(l) for l in losses], warm

    with torch_pjrt.eager_mode("defer_and_fuse"):
        expected_model, expected, _ = train(compile_step=False)
    with in_mode_without_fallbacks("defer_and_fuse"):
        model, losses, warm = train(compile_step=True)
        after = _counts()
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-6, atol=1e-6)
    for p, q in zip(model.parameters(), expected_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), rtol=1e-6, atol=1e-6)
    assert after["compilations"] == warm["compilations"], (warm, after)
    assert after["compiled_graphs"] == warm["compiled_graphs"]
    assert after["compiled_graph_replays"] - warm["compiled_graph_replays"] == steps - warm_up
    graphs = torch_pjrt.metrics()["compiled_graph_list"]
    assert graphs[-1]["host_ops"] > 0, graphs


def test_a_compiled_training_step_with_a_default_optimizer_replays_every_graph():
    steps, warm_up = 20, 5
    batches = [(x.to("pjrt"), y.to("pjrt")) for x, y in _batches(steps)]

    def train_step(model, opt, x, y):
        loss = _loss(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def train(step_fn):
        model = _mlp().to("pjrt")
        opt, sched = _default_optimizer(torch.optim.AdamW, model.parameters(), scheduled=True)
        losses, warm = [], None
        for i, (x, y) in enumerate(batches):
            if i == warm_up:
                warm = _counts()
            losses.append(step_fn(model, opt, x, y).detach())
            sched.step()
        return [float(l) for l in losses], warm

    with torch_pjrt.eager_mode("defer_and_fuse"):
        expected, _ = train(train_step)
    with in_mode_without_fallbacks("defer_and_fuse"):
        losses, warm = train(torch.compile(train_step, backend="pjrt"))
        after = _counts()
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-6, atol=1e-6)
    assert after["compilations"] == warm["compilations"], (warm, after)
    # Forward, backward and the optimizer's graph: each replayed on every later step, none of
    # their ops captured again.
    assert after["compiled_graph_replays"] - warm["compiled_graph_replays"] == 3 * (steps - warm_up)
    assert after["compiled_graph_runs"] - warm["compiled_graph_runs"] == 3 * (steps - warm_up)



def test_a_host_prologue_runs_foreach_ops_over_cpu_scalars_as_one_op_each():
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_pjrt import _host_prologue

    def step(steps, params):
        new = torch._foreach_add(steps, 1)
        corrections = torch._foreach_sub(torch._foreach_pow(0.9, new), 1)
        out = [p * c for p, c in zip(params, corrections)]
        for s, n in zip(steps, new):
            s.copy_(n)
        return out

    def inputs(device):
        steps = [torch.tensor(float(k)) for k in range(4)]
        return steps, [torch.full((3,), k + 1.0, device=device) for k in range(4)]

    gm = make_fx(step, tracing_mode="fake")(*inputs("pjrt"))
    split = _host_prologue.split(gm)
    assert split is not None
    prologue_ops = [str(n.target) for n in split.prologue.graph.nodes if n.op == "call_function"]
    # PyTorch's CPU foreach kernels would run each of these once per 0-d tensor.
    assert not [op for op in prologue_ops if "_foreach_" in op and "copy_" not in op], prologue_ops
    steps, params = inputs("pjrt")
    expected_steps, expected_params = inputs("cpu")
    expected = step(expected_steps, expected_params)
    out = split.run(list(steps) + list(params), lambda args: split.device(*args))
    for a, e in zip(out, expected):
        torch.testing.assert_close(a.cpu(), e)
    assert [float(s) for s in steps] == [float(s) for s in expected_steps] == [1.0, 2.0, 3.0, 4.0]


def _per_step(counts_before, counts_after, steps):
    return {k: (counts_after[k] - counts_before[k]) / steps for k in ("executions", "graph_replays")}


def _launches():
    torch_pjrt.sync()
    m = torch_pjrt.metrics()
    return {"executions": m["executions"], "graph_replays": m["graph_replays"]}


@pytest.mark.parametrize("around", ["defer_and_fuse", "strict"])
def test_a_compiled_training_step_launches_one_program_per_graph(around):
    # The step of the benchmark suite: zero_grad, forward, backward and an SGD step with
    # momentum, all under torch.compile. Dynamo breaks the graph at `loss.backward()`, whose
    # `ones_like` seed autograd makes between the forward and the backward graph.
    steps, warm_up = 10, 4
    batches = [(x.to("pjrt"), y.to("pjrt")) for x, y in _batches(steps)]

    def train(compiled, mode):
        model = _mlp().to("pjrt")
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = _loss(model, x, y)
            loss.backward()
            opt.step()
            return loss

        fn = torch.compile(step, backend="pjrt") if compiled else step
        losses = []
        with in_mode_without_fallbacks(mode):
            for i, (x, y) in enumerate(batches):
                if i == warm_up:
                    before = _launches()
                losses.append(fn(x, y).detach())
                torch_pjrt.sync()
            after = _launches()
        return [float(l) for l in losses], _per_step(before, after, steps - warm_up)

    expected, eager = train(False, "defer_and_fuse")
    losses, compiled = train(True, around)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-6, atol=1e-6)
    assert eager == {"executions": 1, "graph_replays": 0}, "DeferAndFuse: the step is one region"
    # The forward, backward and optimizer graphs replayed, and nothing else: the seed is still
    # pending when the backward graph is replayed, and its program computes it (it was a one-op
    # region of its own, launched before the backward replay: 4 a step). Strict, which runs
    # every other op outside a graph at once, holds an op that only makes a new value after a
    # graph ran, for the next graph to take.
    assert compiled == {"executions": 3, "graph_replays": 3}


@pytest.mark.parametrize("around", ["defer_and_fuse", "strict"])
def test_a_backward_graph_computes_its_seed_with_each_calls_value(around):
    # `loss.backward(gradient)` with a gradient made on the device just before: a fill whose
    # value changes at every step, folded into the backward graph's program with that value.
    steps, warm_up = 10, 4
    batches = [(x.to("pjrt"), y.to("pjrt")) for x, y in _batches(steps)]

    def train(compiled):
        model = _mlp().to("pjrt")
        opt = torch.optim.SGD(model.parameters(), lr=0.05)

        def forward(x, y):
            return _loss(model, x, y)

        if compiled:
            forward = torch.compile(forward, backend="pjrt")
        losses, grads = [], []
        with in_mode_without_fallbacks("defer_and_fuse" if not compiled else around):
            for i, (x, y) in enumerate(batches):
                if i == warm_up:
                    before = _launches()
                loss = forward(x, y)
                if i == steps - 1:
                    # A gradient the host uploaded, not a pending fill: the program that
                    # computes its seed cannot run, and the graph's ops do.
                    seed = torch.tensor(0.25).to("pjrt")
                else:
                    seed = torch.full_like(loss, 1.0 + 0.5 * i)
                loss.backward(seed)
                grads.append(model[0].weight.grad.detach().clone())
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach())
                torch_pjrt.sync()
                if i == steps - 2:
                    after = _launches()
        return [float(l) for l in losses], grads, _per_step(before, after, steps - 1 - warm_up)

    expected, expected_grads, _ = train(False)
    losses, grads, launched = train(True)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-6, atol=1e-6)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g.cpu(), e.cpu(), rtol=1e-6, atol=1e-6)
    if around == "defer_and_fuse":
        # The forward and backward replays and the optimizer's region.
        assert launched == {"executions": 3, "graph_replays": 2}
    else:
        # Strict runs the optimizer's ops one by one, and holds the seed for the backward graph.
        assert launched["graph_replays"] == 2


def test_strict_runs_values_held_after_a_graph_when_eager_code_reads_them():
    # After a compiled graph, Strict holds ops that only make new values for the next graph's
    # prologue. Eager code that reads them, or reads a device value, runs them first: values
    # and the one-op programs of eager Strict are unchanged.
    f = torch.compile(lambda t: (t * 2).sum(), backend="pjrt")
    x = torch.arange(6.0).to("pjrt")
    with in_mode_without_fallbacks("strict"):
        for _ in range(3):
            f(x)
        z = torch.zeros(3, device="pjrt")
        h = torch.full((3,), 2.5, device="pjrt")
        y = x[:3] + h  # reads a device value: the held fills run first
        assert torch.equal(y.cpu(), torch.arange(3.0) + 2.5)
        assert torch.equal((z + h).cpu(), torch.full((3,), 2.5))
        f(x)
        o = torch.ones(2, device="pjrt")
        assert torch.equal(o.cpu(), torch.ones(2))  # a read of a held value runs it
        f(x)
        r = torch.full((4,), 3.0, device="pjrt").add_(1.0)  # held, then written in place
        assert torch.equal(r.cpu(), torch.full((4,), 4.0))
