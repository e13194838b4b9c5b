"""Regenerate tests/data/meta_cases.tsv: PyTorch's output dtypes/shapes (or errors) for op cases.

Run with the project's venv: `.venv/bin/python ops/tests/gen_meta_table.py`.
Each line: op, inputs, scalars, params, expected (tab-separated).
  inputs:   space-separated `dtype[d0,d1]` (`float32[2,3]`, `int64[]`)
  scalars:  space-separated `kind:value` (a Python number) or `kind:value@dtype` (a CPU 0-d tensor)
  params:   space-separated integers
  expected: space-separated output types, or `!ErrorClass: first line of the message`
"""
import itertools
import math
import os
import struct
import warnings

import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore")

DTYPES = {
    "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "float16": torch.float16, "float32": torch.float32,
    "float64": torch.float64, "bool": torch.bool, "bfloat16": torch.bfloat16,
}
NAMES = {v: k for k, v in DTYPES.items()}
CODES = {"uint8": 0, "int8": 1, "int16": 2, "int32": 3, "int64": 4, "float16": 5, "float32": 6,
         "float64": 7, "bool": 11, "bfloat16": 15}
ALL = list(DTYPES)


def f64bits(x):
    return struct.unpack("<q", struct.pack("<d", x))[0]


class T:
    """A tensor input spec."""

    def __init__(self, dtype, shape, fill=1):
        self.dtype, self.shape, self.fill = dtype, list(shape), fill

    def spec(self):
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"

    def make(self):
        return torch.full(self.shape, self.fill, dtype=DTYPES[self.dtype])


class S:
    """A scalar spec: a Python number, or a CPU 0-d tensor when dtype is given."""

    def __init__(self, value, dtype=None):
        self.value, self.dtype = value, dtype

    def spec(self):
        kind = "bool" if isinstance(self.value, bool) else "int" if isinstance(self.value, int) else "float"
        v = self.value
        if kind == "float":
            v = repr(float(v))
        s = f"{kind}:{v}"
        return s + (f"@{self.dtype}" if self.dtype else "")

    def make(self):
        if self.dtype:
            return torch.tensor(self.value, dtype=DTYPES[self.dtype])
        return self.value


def run(fn):
    try:
        r = fn()
    except Exception as e:  # noqa: BLE001 - every PyTorch error is data here
        msg = str(e).split("\n")[0].strip()
        return f"!{type(e).__name__}: {msg}"
    if isinstance(r, torch.Tensor):
        r = [r]
    return " ".join(f"{NAMES[t.dtype]}[{','.join(map(str, t.shape))}]" for t in r)


LINES = []


def case(op, inputs, scalars, params, fn):
    made_inputs = [t.make() for t in inputs]
    made_scalars = [s.make() for s in scalars]
    expected = run(lambda: fn(*made_inputs, *made_scalars))
    LINES.append("\t".join([
        op,
        " ".join(t.spec() for t in inputs),
        " ".join(s.spec() for s in scalars),
        " ".join(map(str, params)),
        expected,
    ]))


# ---- unary ---------------------------------------------------------------------------------
UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2, "log": torch.log,
    "log2": torch.log2, "log10": torch.log10, "log1p": torch.log1p, "expm1": torch.expm1,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu, "silu": F.silu,
    "erf": torch.erf, "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc,
    "sign": torch.sign, "reciprocal": torch.reciprocal, "logical_not": torch.logical_not,
    "bitwise_not": torch.bitwise_not, "isnan": torch.isnan, "isinf": torch.isinf,
    "nan_to_num": torch.nan_to_num,
}
for name, fn in UNARY.items():
    for d in ALL:
        case(name, [T(d, [2, 3])], [], [], fn)
    case(name, [T("float32", [])], [], [], fn)
for d in ALL:
    case("gelu", [T(d, [4])], [], [], F.gelu)
    case("gelu", [T(d, [4])], [], [1], lambda x: F.gelu(x, approximate="tanh"))
    case("round", [T(d, [4])], [], [], torch.round)
    case("round", [T(d, [4])], [], [2], lambda x: torch.round(x, decimals=2))

# ---- binary --------------------------------------------------------------------------------
def binary_fn(name, params):
    if name == "div":
        mode = {0: None, 1: "trunc", 2: "floor"}[params[0]] if params else None
        return lambda x, y: torch.div(x, y, rounding_mode=mode)
    return getattr(torch, name)


BINARY = ["add", "sub", "rsub", "mul", "div", "remainder", "fmod", "pow", "maximum", "minimum",
          "atan2", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
          "bitwise_and", "bitwise_or", "bitwise_xor"]
TENSOR_ONLY = {"maximum", "minimum", "atan2", "logical_and", "logical_or", "logical_xor"}
SCALARS = [S(2), S(2.5), S(True), S(0), S(-1), S(2.5, "float64"), S(2, "int32"), S(True, "bool"),
           S(2.5, "float16"), S(0, "int64")]
for name in BINARY:
    variants = [[]] + ([[1], [2]] if name == "div" else [])
    for params in variants:
        fn = binary_fn(name, params)
        for a, b in itertools.product(ALL, ALL):
            case(name, [T(a, [3]), T(b, [3])], [], params, fn)
        for d in ALL:
            for s in SCALARS:
                if name in TENSOR_ONLY and s.dtype is None:
                    continue
                case(name, [T(d, [3])], [s], params, fn)
            case(name, [T(d, [])], [S(2.5, "float64")], params, fn)
            if name not in TENSOR_ONLY:
                case(name, [T(d, [])], [S(3)], params, fn)
        for sa, sb in [([2, 3], [3]), ([2, 1], [1, 4]), ([], [3]), ([3], []), ([2, 3], [4]),
                       ([0, 3], [3]), ([5, 1, 3], [2, 1])]:
            case(name, [T("float32", sa), T("float32", sb)], [], params, fn)
        for sa, sb, da, db in [([], [3], "float64", "float32"), ([], [3], "float32", "int32"),
                               ([], [], "float64", "float32"), ([], [], "int32", "int64"),
                               ([3], [], "int32", "float64"), ([3], [], "bool", "int8")]:
            case(name, [T(da, sa), T(db, sb)], [], params, fn)

for d in ALL:
    for alpha in [S(2), S(2.5), S(True)]:
        case("add", [T(d, [3]), T(d, [3])], [alpha], [],
             lambda x, y, al: torch.add(x, y, alpha=al))
        case("sub", [T(d, [3]), T("int32", [3])], [alpha], [],
             lambda x, y, al: torch.sub(x, y, alpha=al))
        case("add", [T(d, [3])], [S(1), alpha], [], lambda x, y, al: torch.add(x, y, alpha=al))
        case("rsub", [T(d, [3])], [S(1.5), alpha], [], lambda x, y, al: torch.rsub(x, y, alpha=al))
    for s in SCALARS:
        case("pow.Scalar", [T(d, [3])], [s], [], lambda x, y: torch.pow(y, x))

# ---- ternary -------------------------------------------------------------------------------
for a, b in itertools.product(ALL, ALL):
    case("where", [T("bool", [2, 3]), T(a, [3]), T(b, [2, 1])], [], [], torch.where)
for d in ALL:
    case("where", [T(d, [3]), T("float32", [3]), T("float32", [3])], [], [], torch.where)
    for s in [S(2), S(2.5), S(True), S(2.5, "float64")]:
        case("where", [T("bool", [3]), T(d, [3])], [s], [], torch.where)
        case("where", [T("bool", [3]), T(d, [3])], [s], [2, 1], lambda c, x, y: torch.where(c, y, x))
    case("where", [T("bool", [3])], [S(1), S(2.5)], [2, 2], torch.where)
    case("where", [T("bool", [3])], [S(1), S(2)], [2, 2], torch.where)
case("where", [T("bool", [2]), T("float32", [3]), T("float32", [3])], [], [], torch.where)

for d in ALL:
    for lo, hi in [(S(0), S(1)), (S(0.5), None), (None, S(2.5)), (S(0.5, "float64"), S(1))]:
        scalars = [s for s in (lo, hi) if s is not None]
        params = [2 if lo else 0, 2 if hi else 0]
        case("clamp", [T(d, [3])], scalars, params,
             (lambda lo, hi: lambda x, *s: torch.clamp(x, *( [s[0], s[1]] if lo and hi else [s[0], None] if lo else [None, s[0]])))(lo, hi))
    case("clamp", [T(d, [2, 3]), T("float32", [3])], [], [1, 0], lambda x, lo: torch.clamp(x, lo))
    case("clamp", [T(d, [2, 3]), T("int32", [3]), T("int64", [2, 1])], [], [1, 1],
         lambda x, lo, hi: torch.clamp(x, lo, hi))
    case("clamp", [T(d, [3])], [S(1)], [0, 2], lambda x, hi: torch.clamp(x, max=hi))
case("clamp", [T("float32", [3])], [], [0, 0], lambda x: torch.clamp(x))
# On bool, only a single tensor bound has a kernel (maximum / minimum).
case("clamp", [T("bool", [3]), T("bool", [3])], [], [1, 0], lambda x, lo: torch.clamp(x, lo))
case("clamp", [T("bool", [3]), T("bool", [3])], [], [0, 1], lambda x, hi: torch.clamp(x, None, hi))
case("clamp", [T("bool", [3])], [S(True, "bool")], [2, 0], lambda x, lo: torch.clamp(x, lo))
case("clamp", [T("bool", [3]), T("bool", [3]), T("bool", [3])], [], [1, 1], torch.clamp)
case("clamp", [T("bool", [3])], [S(False), S(True)], [2, 2], torch.clamp)
case("clamp", [T("bool", [3])], [S(False)], [2, 0], lambda x, lo: torch.clamp_min(x, lo))
case("clamp", [T("bool", [3])], [S(True)], [0, 2], lambda x, hi: torch.clamp_max(x, hi))

for a in ALL:
    for b in ["float32", "float64", a]:
        case("lerp", [T(a, [2, 3]), T(b, [3])], [S(0.5)], [], torch.lerp)
        case("lerp", [T(a, [2, 3]), T(a, [3]), T(b, [2, 1])], [], [], torch.lerp)
    for t1, t2 in [(a, a), (a, "float32"), ("int32", a), ("bool", "bool")]:
        case("addcmul", [T(a, [3]), T(t1, [2, 3]), T(t2, [3])], [S(2)], [],
             lambda x, y, z, v: torch.addcmul(x, y, z, value=v))
        case("addcdiv", [T(a, [3]), T(t1, [2, 3]), T(t2, [3])], [S(0.5)], [],
             lambda x, y, z, v: torch.addcdiv(x, y, z, value=v))

# ---- casts, copies, creation ---------------------------------------------------------------
for a in ALL:
    for b in ALL:
        case("_to_copy", [T(a, [2, 3])], [], [CODES[b]], (lambda b: lambda x: x.to(DTYPES[b]))(b))
    case("copy_", [T(a, [2, 3]), T("float32", [3])], [], [], lambda x, y: x.copy_(y))
    case("clone", [T(a, [2, 3])], [], [], torch.clone)
case("copy_", [T("float32", [2]), T("float32", [3])], [], [], lambda x, y: x.copy_(y))
case("copy_", [T("float32", [3]), T("float32", [2, 3])], [], [], lambda x, y: x.copy_(y))
FILLS = [S(300), S(-1), S(255.5), S(2.7), S(float("nan")), S(float("inf")), S(1e39), S(70000.0),
         S(True), S(-129), S(65519.0)]
for d in ALL:
    for v in FILLS:
        case("fill_", [T(d, [2])], [v], [], lambda x, v: x.fill_(v))
        case("full", [], [v], [CODES[d], 2, 3], (lambda d: lambda v: torch.full((2, 3), v, dtype=DTYPES[d]))(d))
    case("zeros", [], [], [CODES[d], 4], (lambda d: lambda: torch.zeros(4, dtype=DTYPES[d]))(d))
    case("ones", [], [], [CODES[d], 0, 2], (lambda d: lambda: torch.ones(0, 2, dtype=DTYPES[d]))(d))
    case("eye", [], [], [CODES[d], 3, 4], (lambda d: lambda: torch.eye(3, 4, dtype=DTYPES[d]))(d))
    case("linspace", [], [S(0), S(1)], [CODES[d], 5], (lambda d: lambda a, b: torch.linspace(a, b, 5, dtype=DTYPES[d]))(d))
case("full", [], [S(1.0)], [6, -1, 2], lambda v: torch.full((-1, 2), v))
case("eye", [], [], [6, -1, 2], lambda: torch.eye(-1, 2))
case("linspace", [], [S(0), S(1)], [6, -1], lambda a, b: torch.linspace(a, b, -1))
for d in ["int64", "int32", "float32", "float64", "bfloat16", "uint8"]:
    for st, en, sp in [(0, 5, 1), (0, 5, 1.5), (0.5, 5, 0.3), (10, 0, -3), (0, 10, -1), (0, 5, 0),
                       (-3, 7, 2), (0, 0, 1)]:
        case("arange", [], [], [CODES[d], f64bits(st), f64bits(en), f64bits(sp)],
             (lambda st, en, sp, d: lambda: torch.arange(st, en, sp, dtype=DTYPES[d]))(st, en, sp, d))

# ---- reductions ----------------------------------------------------------------------------
def red(name, fn, shape, dims, keepdim, extra_params, d, **kw):
    def call(x):
        if dims:
            return fn(x, dims, keepdim=keepdim, **kw)
        return fn(x, **kw) if not keepdim else fn(x, list(range(len(shape))), keepdim=True, **kw)
    case(name, [T(d, shape)], [], [int(keepdim)] + extra_params + list(dims), call)


for d in ALL:
    for shape, dims in [([2, 3, 4], [1]), ([2, 3, 4], [0, 2]), ([2, 3, 4], [-1]), ([2, 3], []),
                        ([], []), ([], [0]), ([0, 3], [0]), ([2, 3], [2]), ([2, 3], [0, 0])]:
        for keepdim in [False, True]:
            red("sum", torch.sum, shape, dims, keepdim, [-1], d)
            red("mean", torch.mean, shape, dims, keepdim, [-1], d)
            red("amax", torch.amax, shape, dims, keepdim, [], d)
            red("amin", torch.amin, shape, dims, keepdim, [], d)
            red("any", torch.any, shape, dims, keepdim, [], d)
            red("all", torch.all, shape, dims, keepdim, [], d)
            if shape:
                red("logsumexp", torch.logsumexp, shape, dims or list(range(len(shape))), keepdim, [], d)
            red("var", torch.var, shape, dims, keepdim, [f64bits(1.0)], d, correction=1)
            red("std", torch.std, shape, dims, keepdim, [f64bits(0.0)], d, correction=0)
    for out in ["float64", "int32", "float16"]:
        red("sum", torch.sum, [2, 3], [1], False, [CODES[out]], d, dtype=DTYPES[out])
        red("mean", torch.mean, [2, 3], [1], False, [CODES[out]], d, dtype=DTYPES[out])
    case("prod", [T(d, [2, 3])], [], [0, -1, 1], lambda x: torch.prod(x, 1))
    case("prod", [T(d, [2, 3])], [], [0, -1], lambda x: torch.prod(x))
    case("prod", [T(d, [2, 3])], [], [1, CODES["float64"], 0], lambda x: torch.prod(x, 0, keepdim=True, dtype=torch.float64))
    for shape, dim, keepdim in [([2, 3], 1, False), ([2, 3], 0, True), ([2, 3], None, False),
                                ([2, 3], None, True), ([], 0, False), ([0], None, False),
                                ([0, 3], 1, False), ([0, 3], 0, False), ([2, 3], 2, False)]:
        for name, fn in [("argmax", torch.argmax), ("argmin", torch.argmin)]:
            params = [int(keepdim)] + ([dim] if dim is not None else [])
            case(name, [T(d, shape)], [], params, (lambda fn, dim, keepdim: lambda x: fn(x, dim, keepdim=keepdim))(fn, dim, keepdim))
    for ordv in [2.0, 1.0, float("inf"), float("-inf"), 0.0, 3.0]:
        for shape, dims in [([2, 3], [1]), ([2, 3], []), ([0, 3], [0]), ([0, 3], [1]), ([0, 3], [])]:
            case("linalg_vector_norm", [T(d, shape)], [], [0, -1, f64bits(ordv)] + dims,
                 (lambda o, dims: lambda x: torch.linalg.vector_norm(x, o, dims or None))(ordv, dims))
        case("linalg_vector_norm", [T(d, [2, 3])], [], [1, CODES["float64"], f64bits(ordv), 0],
             (lambda o: lambda x: torch.linalg.vector_norm(x, o, 0, keepdim=True, dtype=torch.float64))(ordv))
    for dim in [1, -1, 0, 2]:
        case("_softmax", [T(d, [2, 3])], [], [dim, 0], (lambda dim: lambda x: torch._softmax(x, dim, False))(dim))
        case("_log_softmax", [T(d, [2, 3])], [], [dim, 0], (lambda dim: lambda x: torch._log_softmax(x, dim, False))(dim))
    case("_softmax", [T(d, [])], [], [0, 0], lambda x: torch._softmax(x, 0, False))
    case("_softmax", [T(d, [2])], [], [0, 1], lambda x: torch._softmax(x, 0, True))

# ---- matrix products -----------------------------------------------------------------------
for a in ALL:
    for b in [a, "float32"]:
        case("mm", [T(a, [2, 3]), T(b, [3, 4])], [], [], torch.mm)
        case("bmm", [T(a, [5, 2, 3]), T(b, [5, 3, 4])], [], [], torch.bmm)
        case("dot", [T(a, [3]), T(b, [3])], [], [], torch.dot)
        case("matmul", [T(a, [2, 1, 2, 3]), T(b, [5, 3, 4])], [], [], torch.matmul)
        case("addmm", [T(a, [4]), T(a, [2, 3]), T(b, [3, 4])], [S(1), S(1)], [],
             lambda s, x, y, be, al: torch.addmm(s, x, y, beta=be, alpha=al))
        case("baddbmm", [T(b, [1, 4]), T(a, [5, 2, 3]), T(a, [5, 3, 4])], [S(0.5), S(2)], [],
             lambda s, x, y, be, al: torch.baddbmm(s, x, y, beta=be, alpha=al))
for sa, sb in [([3], [3]), ([3], [4]), ([2, 3], [3]), ([2, 3], [4]), ([3], [3, 4]), ([3], [4, 5]),
               ([2, 3], [3, 4]), ([4, 2, 3], [3]), ([4, 2, 3], [3, 5]), ([4, 2, 3], [2, 3]),
               ([3], [2, 3, 4]), ([2, 3], [5, 3, 4]), ([2, 1, 2, 3], [5, 3, 4]), ([2, 2, 3], [3, 3, 4]),
               ([2, 2, 3], [2, 4, 4]), ([], [3]), ([3], []), ([2, 0, 3], [3, 0])]:
    case("matmul", [T("float32", sa), T("float32", sb)], [], [], torch.matmul)
for sa, sb in [([2, 3], [4, 5]), ([3], [3, 5]), ([2, 3], [3]), ([2, 3, 4], [3, 4])]:
    case("mm", [T("float32", sa), T("float32", sb)], [], [], torch.mm)
for sa, sb in [([2, 3], [3, 5]), ([2, 2, 3], [3, 3, 5]), ([2, 2, 3], [2, 4, 5])]:
    case("bmm", [T("float32", sa), T("float32", sb)], [], [], torch.bmm)
for ss in [[5], [3, 5], [2, 1], [1], []]:
    case("addmm", [T("float32", ss), T("float32", [2, 3]), T("float32", [3, 5])], [], [], torch.addmm)
for sa, sb in [([3], [4]), ([3, 1], [3])]:
    case("dot", [T("float32", sa), T("float32", sb)], [], [], torch.dot)

# ---- shape ops -----------------------------------------------------------------------------
for a in ALL:
    for b in ALL:
        case("cat", [T(a, [2, 3]), T(b, [2, 1])], [], [1], lambda x, y: torch.cat([x, y], 1))
    case("stack", [T(a, [2, 3]), T("float64", [2, 3])], [], [-1], lambda x, y: torch.stack([x, y], -1))
for shapes, dim in [([[2, 3], [3, 3]], 1), ([[2, 3], [2, 3, 4]], 1), ([[], [3]], 0), ([[2, 3]], 2),
                    ([[2, 3], [0]], 0), ([[0], [0]], 0), ([[2, 3], [4, 3], [1, 3]], 0), ([[2, 3], [2, 3]], -2)]:
    case("cat", [T("float32", s) for s in shapes], [], [dim], lambda *xs, dim=dim: torch.cat(xs, dim))
for shapes, dim in [([[2], [3]], 0), ([[2, 3], [2, 3]], 2), ([[2, 3], [2, 3]], 3), ([[]], 0)]:
    case("stack", [T("float32", s) for s in shapes], [], [dim], lambda *xs, dim=dim: torch.stack(xs, dim))
for dims in [[0], [1, 0], [-1], [2], [0, 0]]:
    case("flip", [T("int32", [2, 3])], [], dims, lambda x, dims=dims: torch.flip(x, dims))
for shifts, dims in [([1], [0]), ([1, 2], [0]), ([-4], []), ([1, 2], [0, 1]), ([], []), ([1], [2])]:
    case("roll", [T("bool", [2, 3])], [], [len(shifts)] + shifts + dims,
         lambda x, s=shifts, d=dims: torch.roll(x, s, d))
for pad in [[1, 2], [1, 2, 3, 4], [1, 2, 3], [1, 2, 3, 4, 5, 6], [-1, -1], [1, -6], [0, 0, -2, 1]]:
    for d in ["float32", "int64", "bfloat16", "bool"]:
        case("constant_pad_nd", [T(d, [2, 3])], [S(1)], pad, lambda x, v, p=pad: torch.constant_pad_nd(x, p, v))
for reps in [[2, 3], [2, 1, 3], [2], [0, 2], [1, 1, 1, 1]]:
    case("repeat", [T("float16", [2, 3])], [], reps, lambda x, r=reps: x.repeat(r))
for shape in [[3], [3, 4], [2, 3, 4]]:
    for diag in [[], [1], [-2]]:
        case("tril", [T("float32", shape)], [], diag, lambda x, d=diag: torch.tril(x, *d))
        case("triu", [T("int8", shape)], [], diag, lambda x, d=diag: torch.triu(x, *d))
for d in ["int64", "int32", "float32"]:
    case("gather", [T("float32", [2, 3]), T(d, [2, 2], fill=0)], [], [1], lambda x, i: torch.gather(x, 1, i))
    case("index_select", [T("bfloat16", [2, 3]), T(d, [4], fill=0)], [], [1], lambda x, i: torch.index_select(x, 1, i))
    case("scatter", [T("float32", [2, 3]), T(d, [2, 2], fill=0), T("float32", [2, 3])], [], [1],
         lambda x, i, s: torch.scatter(x, 1, i, s))
    case("scatter_add", [T("float32", [2, 3]), T(d, [2, 2], fill=0), T("float32", [2, 3])], [], [0],
         lambda x, i, s: torch.scatter_add(x, 0, i, s))
    case("embedding", [T("float32", [4, 3]), T(d, [2, 5], fill=0)], [], [], torch.embedding)
for xs, ishape, dim in [([2, 3], [2, 4], 0), ([2, 3], [2], 0), ([2, 3], [3, 3], 1), ([2, 3], [1, 1], -1), ([2, 3], [2, 3], 2)]:
    case("gather", [T("float32", xs), T("int64", ishape, fill=0)], [], [dim], lambda x, i, dim=dim: torch.gather(x, dim, i))
    case("scatter", [T("float32", xs), T("int64", ishape, fill=0)], [S(2.5)], [dim], lambda x, i, v, dim=dim: torch.scatter(x, dim, i, v))
    case("scatter", [T("float32", xs), T("int64", ishape, fill=0), T("float32", [2, 3])], [], [dim],
         lambda x, i, s, dim=dim: torch.scatter(x, dim, i, s))
case("scatter", [T("float32", [2, 3]), T("int64", [2, 3], fill=0), T("float64", [2, 3])], [], [0],
     lambda x, i, s: torch.scatter(x, 0, i, s))
# The index dtype is checked only when the index has elements.
case("gather", [T("float32", [5]), T("uint8", [0])], [], [0], lambda x, i: torch.gather(x, 0, i))
case("gather", [T("float32", [5]), T("uint8", [2], fill=0)], [], [0], lambda x, i: torch.gather(x, 0, i))
case("scatter", [T("float32", [5]), T("uint8", [0]), T("float32", [5])], [], [0],
     lambda x, i, s: torch.scatter(x, 0, i, s))
case("scatter", [T("float32", [5]), T("int64", [2, 0]), T("float32", [5])], [], [0],
     lambda x, i, s: torch.scatter(x, 0, i, s))
# A 0-d tensor counts as 1-d in the shape checks.
case("gather", [T("float32", []), T("int64", [1], fill=0)], [], [0], lambda x, i: torch.gather(x, 0, i))
case("gather", [T("float32", []), T("int64", [2], fill=0)], [], [0], lambda x, i: torch.gather(x, 0, i))
case("gather", [T("float32", [3]), T("int64", [], fill=0)], [], [0], lambda x, i: torch.gather(x, 0, i))
case("scatter", [T("float32", []), T("int64", [1], fill=0), T("float32", [])], [], [0],
     lambda x, i, s: torch.scatter(x, 0, i, s))
case("scatter_add", [T("float32", []), T("int64", [], fill=0), T("float32", [1])], [], [0],
     lambda x, i, s: torch.scatter_add(x, 0, i, s))
case("index_select", [T("float32", [2, 3]), T("int64", [2, 2], fill=0)], [], [0], lambda x, i: torch.index_select(x, 0, i))
case("index_select", [T("float32", [2, 3]), T("int64", [], fill=0)], [], [0], lambda x, i: torch.index_select(x, 0, i))
case("embedding", [T("float32", [4]), T("int64", [2], fill=0)], [], [], torch.embedding)
for xs, sizes in [([2, 3], [3]), ([2, 3], [2, 4]), ([2, 1], [2, 4]), ([3], [2, -1]), ([2, 1], [3, 2, -1]), ([], [2, 2])]:
    case("expand", [T("float32", xs)], [], sizes, lambda x, s=sizes: x.expand(*s))
for xs, sizes in [([2, 3], [2, 4]), ([2, 3], [3]), ([2, 3], [1, 3]), ([2, 3], [1]), ([4, 2, 3], [2, 1]), ([2, 3], [])]:
    case("sum_to_size", [T("float32", xs)], [], sizes, lambda x, s=sizes: x.sum_to_size(*s) if s else x.sum_to_size(()))
for xs, sizes in [([2, 3], [5, -1]), ([2, 3], [-1, -1]), ([2, 3], [3, -1]), ([2, 3], [6]), ([2, 3], [7]), ([0, 3], [-1, 0])]:
    case("reshape", [T("float32", xs)], [], sizes, lambda x, s=sizes: x.reshape(*s))
for dims in [[0, 1, 2], [0, 0], [1, 0], [-1, 0]]:
    case("permute", [T("float32", [2, 3])], [], dims, lambda x, d=dims: x.permute(*d))
for d0, d1 in [(0, 1), (-1, 0), (0, 2)]:
    case("transpose", [T("float32", [2, 3])], [], [d0, d1], lambda x, a=d0, b=d1: x.transpose(a, b))
for dim, st, en, sp in [(1, 0, 3, 0), (1, 0, 3, -1), (1, 0, 3, 2), (0, -1, 100, 1), (1, 2, 1, 1), (1, -100, -1, 1), (2, 0, 1, 1)]:
    case("slice", [T("float32", [2, 3])], [], [dim, st, en, sp], lambda x, a=(dim, st, en, sp): torch.ops.aten.slice(x, *a))
for dim, idx in [(0, 5), (0, 1), (1, -1), (1, -4), (2, 0)]:
    case("select", [T("float32", [2, 3])], [], [dim, idx], lambda x, a=(dim, idx): x.select(*a))

# ---- backward ------------------------------------------------------------------------------
for a in ["float32", "float64", "bfloat16", "int32"]:
    case("threshold_backward", [T(a, [2, 3]), T("float32", [3])], [S(0.0)], [],
         lambda g, x, t: torch.ops.aten.threshold_backward(g, x, t))
    for name, fn in [("_log_softmax_backward_data", torch.ops.aten._log_softmax_backward_data),
                     ("_softmax_backward_data", torch.ops.aten._softmax_backward_data)]:
        case(name, [T(a, [2, 3]), T(a, [2, 3])], [], [1, CODES[a]],
             lambda g, y, fn=fn, a=a: fn(g, y, 1, DTYPES[a]))
case("threshold_backward", [T("float32", [2, 3]), T("float32", [4])], [S(0.0)], [],
     lambda g, x, t: torch.ops.aten.threshold_backward(g, x, t))
for xs, ts, td, ws, red in [([2, 3], [2], "int64", None, 1), ([2, 3], [2], "int32", None, 1),
                            ([2, 3], [3], "int64", None, 1), ([2, 3, 4], [2], "int64", None, 1),
                            ([2, 3], [2], "int64", [4], 1), ([2, 3], [2], "int64", [3], 0),
                            ([3], [], "int64", None, 0), ([3], [], "int64", None, 1), ([2, 3], [2], "int64", None, 2),
                            ([2, 3], [2], "uint8", None, 2)]:
    inputs = [T("float32", xs), T(td, ts, fill=0)] + ([T("float32", ws)] if ws else [])
    case("nll_loss_forward", inputs, [], [red, -100],
         lambda x, t, *w, red=red: torch.ops.aten.nll_loss_forward(x, t, w[0] if w else None, red, -100))
    gshape = [xs[0]] if red == 0 and len(xs) == 2 else []
    binputs = [T("float32", gshape), T("float32", xs), T(td, ts, fill=0), T("float32", [])] + ([T("float32", ws)] if ws else [])
    case("nll_loss_backward", binputs, [], [red, -100],
         lambda g, x, t, tw, *w, red=red: torch.ops.aten.nll_loss_backward(g, x, t, w[0] if w else None, red, -100, tw))

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "meta_cases.tsv")
with open(path, "w") as f:
    f.write(f"# generated by gen_meta_table.py with torch {torch.__version__}\n")
    for line in LINES:
        f.write(line + "\n")
print(f"{len(LINES)} cases -> {path}")
