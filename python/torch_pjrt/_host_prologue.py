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
    host_ops: int

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
    if any(n.users for n in deferred):
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
    host_ops = 0
    for node, place in places.items():
        if place == "device" or node.op == "placeholder" or node in deferred:
            continue
        env[node] = host_graph.node_copy(node, lambda n: env[n])
        host_ops += node.op == "call_function"
    groups = {}
    for node in boundary:
        groups.setdefault(node.meta["val"].dtype, []).append(node)
    packs = []
    for nodes in groups.values():
        flat = [host_graph.call_function(aten.reshape.default, (env[n], [-1])) for n in nodes]
        packs.append(host_graph.call_function(aten.cat.default, (flat,)))
    for node in deferred:
        host_graph.node_copy(node, lambda n: env[n])
        host_ops += 1
    host_graph.output(tuple([env[o] for o in on_host] + packs))
    host_graph.eliminate_dead_code()

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
