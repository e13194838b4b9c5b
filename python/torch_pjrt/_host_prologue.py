"""The CPU part of a compiled graph, split off so the device part can be recorded (RFC 0033).

A graph that takes CPU scalar tensors (a non-capturable optimizer's step counters, a learning
rate Dynamo turned into a 0-d tensor) computes on them with CPU ops (bias corrections, step
sizes) and hands the results to device ops, which lift them into the region as constants of
that call. Such a graph could not be recorded: a replay would repeat the recorded values.

Split here, the CPU ops run first, as a host prologue, and the values the device ops read are
packed into one CPU tensor per dtype and uploaded, as inputs of the device part. The device
part then takes only pjrt tensors and is recorded and replayed like any graph: a new step
count or learning rate changes the uploaded data, never the program, and no op of the device
part is captured again. Writes into CPU inputs (``step += 1``) run at the end of the prologue,
after the values read before them were packed.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass


@dataclass
class HostSplit:
    """A graph split into its host prologue and its device part."""

    prologue: object  # GraphModule over the CPU inputs: (host outputs..., packs...)
    device: object  # GraphModule over the device inputs and the uploaded packs
    host_inputs: list  # positions of the graph's CPU inputs
    device_inputs: list  # positions of the graph's pjrt inputs
    host_outputs: int  # how many of the prologue's results are graph outputs
    outputs: list  # per graph output: ("host", k), ("device", k) or ("constant", value)
    host_ops: int  # the prologue's tensor ops (list indexing left out)

    def run(self, args, run_device):
        """Runs the prologue on the CPU inputs, uploads the packs, runs the device part through
        `run_device` (the recorded or captured graph) and returns the graph's outputs."""
        host = self.prologue(*[args[i] for i in self.host_inputs])
        packs = [p.to("pjrt") for p in host[self.host_outputs :]]
        device = run_device([args[i] for i in self.device_inputs] + packs)
        results = []
        for where, k in self.outputs:
            if where == "host":
                results.append(host[k])
            elif where == "device":
                results.append(device[k])
            else:
                results.append(k)
        return tuple(results)


def _tensors(value):
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _place(node, gm):
    """'host', 'device' or None (neither, or both) for what `node` makes."""
    if node.op == "get_attr":
        value = operator.attrgetter(node.target)(gm)
        tensors = _tensors(value)
    else:
        tensors = _tensors(node.meta.get("val"))
    devices = {t.device.type for t in tensors}
    if devices == {"cpu"}:
        return "host"
    if devices == {"pjrt"}:
        return "device"
    return None


def _is_seeded(node):
    import torch

    target = node.target
    return isinstance(target, torch._ops.OpOverload) and (
        torch.Tag.nondeterministic_seeded in target.tags
    )


def split(gm):
    """The graph split into a host prologue and a device part, or None when it takes no CPU
    tensor, has no device part, or cannot be split (a CPU value computed from a device one, an
    input that is not a tensor, a CPU value other than a tensor read by the device).

    Every node is one of: "host", computed from a CPU input (the prologue runs it); "device",
    a pjrt value (the device part runs it); "constant", a CPU value that depends on no input
    (a constant tensor, a factory op), which both parts compute where they need it."""
    import torch
    import torch.fx as fx

    aten = torch.ops.aten
    places = {}
    output = None
    for node in gm.graph.nodes:
        if node.op == "output":
            output = node
            continue
        if node.op == "placeholder":
            place = _place(node, gm)
        elif node.op == "get_attr":
            place = _place(node, gm)
            place = "constant" if place == "host" else place
        elif node.op == "call_function":
            inputs = {places[i] for i in node.all_input_nodes}
            made = _place(node, gm)
            if made is None and "val" in node.meta and not _tensors(node.meta["val"]):
                made = "none"  # a list element's index, a size: placed by its inputs
            if made == "device":
                place = "device"
            elif made in ("host", "none"):
                if "device" in inputs:
                    place = "device" if made == "none" else None
                else:
                    place = "host" if "host" in inputs else "constant"
            else:
                place = None
            if place in ("host", "constant") and _is_seeded(node):
                place = None  # both parts would draw from the CPU generator
        else:
            place = None
        if place is None:
            return None
        places[node] = place
    if "host" not in places.values() or "device" not in places.values():
        return None

    # The host values the device ops read: each one a CPU tensor.
    boundary = []
    for node, place in places.items():
        if place != "device":
            continue
        for i in node.all_input_nodes:
            if places[i] == "host" and i not in boundary:
                if not isinstance(i.meta.get("val"), torch.Tensor):
                    return None
                boundary.append(i)

    # Writes into CPU inputs go after the packing, which must see the values before them.
    deferred = [
        n
        for n, p in places.items()
        if p == "host"
        and n.target is aten.copy_.default
        and n.args[0].op == "placeholder"
    ]
    if any(n.users or len(n.args) != 2 or n.kwargs for n in deferred):
        return None
    outputs_of = output.args[0]
    if not isinstance(outputs_of, (list, tuple)):
        return None
    on_host = [
        o for o in outputs_of if isinstance(o, fx.Node) and places[o] in ("host", "constant")
    ]

    host_graph = fx.Graph()
    env = {}
    host_inputs, device_inputs = [], []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for position, node in enumerate(placeholders):
        if places[node] == "host":
            host_inputs.append(position)
            env[node] = host_graph.node_copy(node)
        else:
            device_inputs.append(position)
    for node, place in places.items():
        if place == "device" or node.op == "placeholder" or node in deferred:
            continue
        env[node] = host_graph.node_copy(node, lambda n: env[n])
    groups = {}
    for node in boundary:
        groups.setdefault(node.meta["val"].dtype, []).append(node)
    packs = []
    for nodes in groups.values():
        # One op per pack and one for the writes, not one per value: a step of Adam over 200
        # parameters packs 400 scalars and writes 200 step counters.
        if all(n.meta["val"].dim() == 0 for n in nodes):
            packs.append(host_graph.call_function(aten.stack.default, ([env[n] for n in nodes],)))
        else:
            flat = [host_graph.call_function(aten.reshape.default, (env[n], [-1])) for n in nodes]
            packs.append(host_graph.call_function(aten.cat.default, (flat,)))
    if deferred:
        targets = [env[n.args[0]] for n in deferred]
        values = [env[n.args[1]] if isinstance(n.args[1], fx.Node) else n.args[1] for n in deferred]
        host_graph.call_function(aten._foreach_copy_.default, (targets, values))
    host_graph.output(tuple([env[o] for o in on_host] + packs))
    _vectorize_scalar_foreach(host_graph)
    host_graph.eliminate_dead_code()
    host_ops = sum(
        n.op == "call_function" and n.target is not operator.getitem for n in host_graph.nodes
    )

    device_graph = fx.Graph()
    denv = {}
    for node in placeholders:
        if places[node] == "device":
            denv[node] = device_graph.node_copy(node)
    pack_inputs = [device_graph.placeholder(f"host_values_{k}") for k in range(len(groups))]
    for pack, nodes in zip(pack_inputs, groups.values()):
        offset = 0
        for node in nodes:
            val = node.meta["val"]
            n = val.numel()
            flat = device_graph.call_function(aten.slice.Tensor, (pack, 0, offset, offset + n))
            denv[node] = device_graph.call_function(aten.view.default, (flat, list(val.shape)))
            offset += n
    for node, place in places.items():
        if place != "host" and node.op != "placeholder":
            denv[node] = device_graph.node_copy(node, lambda n: denv[n])

    plan = []
    device_results = []
    for o in outputs_of:
        if not isinstance(o, fx.Node):
            plan.append(("constant", o))
        elif places[o] != "device":
            plan.append(("host", on_host.index(o)))
        else:
            plan.append(("device", len(device_results)))
            device_results.append(denv[o])
    device_graph.output(tuple(device_results))
    device_graph.eliminate_dead_code()

    return HostSplit(
        prologue=fx.GraphModule(gm, host_graph),
        device=fx.GraphModule(gm, device_graph),
        host_inputs=host_inputs,
        device_inputs=device_inputs,
        host_outputs=len(on_host),
        outputs=plan,
        host_ops=host_ops,
    )


# The pointwise overloads a foreach overload's ops are, in order of preference.
_POINTWISE_OVERLOADS = {
    "default": ("default",),
    "Scalar": ("Scalar", "Tensor_Scalar"),
    "ScalarAndTensor": ("Scalar",),
    "List": ("Tensor", "Tensor_Tensor"),
    "Tensor": ("Tensor", "Tensor_Tensor"),
}


def _scalar_list(node_list):
    """The 0-d tensors' dtype when `node_list` is a list of nodes making CPU 0-d tensors of one
    dtype, else None."""
    import torch
    import torch.fx as fx

    if not isinstance(node_list, (list, tuple)) or not node_list:
        return None
    vals = [n.meta.get("val") if isinstance(n, fx.Node) else None for n in node_list]
    if not all(
        isinstance(v, torch.Tensor) and v.dim() == 0 and v.device.type == "cpu" for v in vals
    ):
        return None
    dtypes = {v.dtype for v in vals}
    return dtypes.pop() if len(dtypes) == 1 else None


def _unbound_stack(nodes):
    """The 1-d tensor whose unbinding `nodes` are, in order, or None."""
    import torch

    first = nodes[0]
    if first.op != "call_function" or first.target is not operator.getitem:
        return None
    source = first.args[0]
    if (
        getattr(source, "target", None) is not torch.ops.aten.unbind.int
        or source.meta.get("stack_of") != len(nodes)
        or not all(
            n.op == "call_function" and n.target is operator.getitem and n.args == (source, k)
            for k, n in enumerate(nodes)
        )
    ):
        return None
    return source.args[0]


def _vectorize_scalar_foreach(graph) -> None:
    """Runs each functional foreach op over CPU 0-d tensors as one op over their stack: the
    prologue of an optimizer step over 200 parameters is a dozen foreach ops over the step
    counters, which PyTorch's CPU foreach kernels run one 0-d tensor at a time (about 2,400
    tensor ops a step). Each list of 0-d tensors is stacked (a list that is an unbound stack
    takes the stack itself), the pointwise op runs once and is unbound for the elements' users."""
    import torch

    aten = torch.ops.aten
    stacks = {}

    def stacked(nodes, before):
        key = tuple(nodes)
        if key not in stacks:
            source = _unbound_stack(nodes)
            if source is None:
                with graph.inserting_before(before):
                    source = graph.call_function(aten.stack.default, (list(nodes),))
            stacks[key] = source
        return stacks[key]

    for node in list(graph.nodes):
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        name = target._schema.name
        if not name.startswith("aten::_foreach_") or target._schema.is_mutable:
            continue
        packet = getattr(aten, name.removeprefix("aten::_foreach_"), None)
        overloads = _POINTWISE_OVERLOADS.get(target._overloadname, ())
        pointwise = next((getattr(packet, o) for o in overloads if hasattr(packet, o)), None)
        users = list(node.users)
        lists = [a for a in node.args if isinstance(a, (list, tuple))]
        if (
            pointwise is None
            or not users
            or not lists
            or not all(u.target is operator.getitem for u in users)
            or _scalar_list(users) is None
        ):
            continue
        count = len(lists[0])
        dtypes = [_scalar_list(a) for a in lists]
        if None in dtypes or any(len(a) != count for a in lists):
            continue
        # The stacked op must make the elements' dtype: PyTorch promotes 0-d and 1-d tensors
        # alike, but that is checked on small tensors here, not assumed.
        samples = iter(torch.zeros(count, dtype=d) for d in dtypes)
        sample_args = [next(samples) if isinstance(a, (list, tuple)) else a for a in node.args]
        try:
            made = pointwise(*sample_args, **node.kwargs).dtype
        except (RuntimeError, TypeError):
            continue
        if made != users[0].meta["val"].dtype:
            continue
        args = [stacked(list(a), node) if isinstance(a, (list, tuple)) else a for a in node.args]
        with graph.inserting_before(node):
            out = graph.call_function(pointwise, tuple(args), dict(node.kwargs))
            unbound = graph.call_function(aten.unbind.int, (out,))
        unbound.meta["stack_of"] = count
        for user in users:
            user.args = (unbound, user.args[1])
        graph.erase_node(node)

    # A pack of values that are an unbound stack is that stack.
    for node in list(graph.nodes):
        if node.target is aten.stack.default and len(node.args) == 1 and not node.kwargs:
            nodes = list(node.args[0])
            source = _scalar_list(nodes) is not None and _unbound_stack(nodes)
            if source is not None and source is not False:
                node.replace_all_uses_with(source)
                graph.erase_node(node)
