"""Generates and registers the pjrt kernel of every ATen overload the plugin implements.

The table below (TABLE) maps an ATen overload to an engine op (its name in the engine's op catalogue,
`ops/src/op_id.rs`) and a recipe: how the overload's arguments become the engine call's tensor
inputs and value scalars (in the op's order) and its static params (by name). The params' order
and kinds come from the op's typed layout in `param_layouts.json`, which `ops/tests/
param_layouts.rs` writes from the catalogue: the generator places each named param where the
layout puts it and refuses a recipe that names a field the layout lacks, gives a field of
another kind, or leaves out one the layout needs. From one functional entry the generator also
emits the in-place (`add_.Tensor`) and `out=` (`add.out`) variants that PyTorch defines for it:
they are found by matching argument lists, so the table names each op once.

Schemas, dispatch entries and C++ signatures come from torchgen, which PyTorch ships: it parses
the `native_functions.yaml` the installed PyTorch was generated from and gives each overload's
dispatcher signature (the exact types of `at::_ops::<op>::call`), so the generated code always
matches the installed PyTorch. Overloads that are CompositeImplicitAutograd are refused: a kernel
for them would hide the decomposition autograd relies on.

The same generator registers the hand-written kernels, from the rows of
`hand_written_kernels.py`: one include per op family, which the family's C++ file compiles where
it ends, and the in-place and `out=` forms derived from a functional row as for the table's.

Recipe statements, separated by `;` (X is an argument of the overload, F a field of the op's
param layout):
    t X      tensor input X (a CPU 0-d tensor is uploaded)
    t? X     optional tensor input (omitted when None)
    tl X     a list of tensor inputs
    ts X     tensor input, or a value scalar when X is a CPU 0-d tensor (Python numbers arrive so)
    tsk X    as `ts`, and its kind (1 tensor, 2 scalar) is the param `X_kind`
    tsk? X   as `tsk` for an optional tensor (kind 0 when None)
    t?k X    optional tensor input, and whether it is present (0 or 1) is the param `has_X`
    s X      value scalar X
    s1 X     value scalar X with default 1: dropped when trailing and equal to 1
    sk X     optional value scalar: appended when present; its kind (0 or 2) is the param `X_kind`
    p F      param F from the argument named F, encoded as F's kind says (a flag by enc::b, an
             optional dtype by enc::dt, an f64 by enc::f64, a counted list by enc::counted...)
    p F = E  param F from the C++ expression E (helpers in torch_pjrt::enc); a list field takes
             an int array expression
    pl F.. = E  the comma-separated fields F.., consecutive in the layout and each optional or
             several, from one int array expression (`enc::opt1(dim)`: one value or none)
    mask X   a bool[N] output mask: its bits (1 << i for result i) are the param X, and
             results whose bit is off are returned undefined, as PyTorch's kernels do
    fmt X..  4-d results are made channels-last when one of the tensors X.. is, as PyTorch's CPU
             kernels return them (the engine's results are contiguous); functional overloads only
    mfmt F X the result takes the layout memory format F asks for, `Preserve` keeping tensor X's
             (`clone`); functional overloads only

Usage: gen_kernels.py OUTPUT_DIR [--shards N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
from dataclasses import dataclass, field

from hand_written_kernels import HAND_WRITTEN

HERE = os.path.dirname(os.path.abspath(__file__))
LAYOUTS_FILE = os.path.join(HERE, "param_layouts.json")

UNARY = [
    "neg", "abs", "exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt",
    "sin", "cos", "tan", "tanh", "sigmoid", "silu", "erf", "erfc", "special_i1e", "i0", "special_i0e", "erfinv", "lgamma", "digamma", "floor", "ceil", "trunc", "sign",
    "reciprocal", "logical_not", "bitwise_not", "relu", "isnan", "isinf",
]
BINARY = [
    "maximum", "minimum", "atan2", "special_zeta", "nextafter", "logical_and", "logical_or", "logical_xor",
]
BINARY_TENSOR_SCALAR = [
    "mul", "div", "remainder", "fmod", "eq", "ne", "lt", "le", "gt", "ge",
    "bitwise_and", "bitwise_or", "bitwise_xor",
]

# (ATen overload, engine op, recipe)
TABLE: list[tuple[str, str, str]] = []
TABLE += [(name, name, "t self") for name in UNARY]
TABLE += [
    ("gelu", "gelu", "t self; p approximate = enc::gelu_approx(approximate)"),
    ("round", "round", "t self"),
    ("special_modified_bessel_i0", "i0", "t self"),
    ("round.decimals", "round", "t self; p decimals"),
    ("nan_to_num", "nan_to_num",
     "t self; pl given, nan, posinf, neginf = enc::nan_to_num(nan, posinf, neginf)"),
]
TABLE += [(name, name, "t self; ts other") for name in BINARY]
# The orthogonal polynomials of `torch.special`, at points x and degrees n.
POLYNOMIALS = [
    f"special_{kind}_polynomial_{letter}"
    for kind, letters in [("chebyshev", "tuvw"), ("shifted_chebyshev", "tuvw"), ("hermite", ["h", "he"]),
                          ("laguerre", "l"), ("legendre", "p")]
    for letter in letters
]
TABLE += [(name, name, "t x; ts n") for name in POLYNOMIALS]
for name in BINARY_TENSOR_SCALAR:
    TABLE += [(f"{name}.Tensor", name, "t self; ts other"), (f"{name}.Scalar", name, "t self; s other")]
# Shifts: `bitwise_*_shift.Tensor` brings its in-place and out= forms; the dunder forms are separate
# overloads with their own CPU kernels (the Scalar ones composite over these).
for name, op in [("left", "lshift"), ("right", "rshift")]:
    engine_op = f"bitwise_{name}_shift"
    TABLE += [
        (f"{engine_op}.Tensor", engine_op, "t self; ts other"),
        (f"__{op}__.Tensor", engine_op, "t self; ts other"),
        (f"__{op}__.Scalar", engine_op, "t self; s other"),
        (f"__i{op}__.Tensor", engine_op, "t self; ts other"),
        (f"__i{op}__.Scalar", engine_op, "t self; s other"),
    ]
for name in ["add", "sub", "rsub"]:
    TABLE += [
        (f"{name}.Tensor", name, "t self; ts other; s1 alpha"),
        (f"{name}.Scalar", name, "t self; s other; s1 alpha"),
    ]
TABLE += [
    ("div.Tensor_mode", "div", "t self; ts other; p rounding_mode"),
    ("div.Scalar_mode", "div", "t self; s other; p rounding_mode"),
    ("floor_divide", "div", "t self; ts other; p rounding_mode = 2"),
    ("floor_divide.Scalar", "div", "t self; s other; p rounding_mode = 2"),
    ("pow.Tensor_Tensor", "pow", "t self; ts exponent"),
    ("pow.Tensor_Scalar", "pow", "t self; s exponent"),
    ("pow.Scalar", "pow.Scalar", "t exponent; s self"),
    # ternary
    ("where.self", "where", "t condition; tsk self; tsk other"),
    ("clamp", "clamp", "t self; sk min; sk max"),
    ("clamp.Tensor", "clamp", "t self; tsk? min; tsk? max"),
    ("clamp_min", "clamp", "t self; sk min; p max_kind = 0"),
    ("clamp_min.Tensor", "clamp", "t self; tsk min; p max_kind = 0"),
    ("clamp_max", "clamp", "t self; p min_kind = 0; sk max"),
    ("clamp_max.Tensor", "clamp", "t self; p min_kind = 0; tsk max"),
    ("lerp.Scalar", "lerp", "t self; t end; s weight"),
    ("lerp.Tensor", "lerp", "t self; t end; ts weight"),
    ("addcmul", "addcmul", "t self; t tensor1; t tensor2; s1 value"),
    ("addcdiv", "addcdiv", "t self; t tensor1; t tensor2; s1 value"),
    # copies, fills and creation (the functional factories compose into these)
    ("clone", "clone", "t self; mfmt memory_format self"),
    ("fill_.Scalar", "full", "s value; p dtype = enc::code(self); p sizes = self.sizes()"),
    ("fill_.Tensor", "fill_", "t self; ts value"),
    ("zero_", "zeros", "p dtype = enc::code(self); p sizes = self.sizes()"),
    ("arange.start_out", "arange", "p dtype = enc::code(out); p start; p end; p step"),
    ("linspace.out", "linspace", "s start; s end; p dtype = enc::code(out); p steps"),
    ("eye.out", "eye", "p dtype = enc::code(out); p n; p m = n"),
    ("eye.m_out", "eye", "p dtype = enc::code(out); p n; p m"),
    # reductions
    ("sum", "sum", "t self; p keepdim = 0; p dtype"),
    ("sum.dim_IntList", "sum", "t self; p keepdim; p dtype; p dims = enc::dims(dim)"),
    ("mean", "mean", "t self; p keepdim = 0; p dtype"),
    ("mean.dim", "mean", "t self; p keepdim; p dtype; p dims = enc::dims(dim)"),
    ("prod", "prod", "t self; p keepdim = 0; p dtype"),
    ("prod.dim_int", "prod", "t self; p keepdim; p dtype; p dims = dim"),
    ("amax", "amax", "t self; p keepdim; p dims = dim"),
    ("max", "amax", 't self; p keepdim = enc::full_reduction(self, "max")'),
    ("min", "amin", 't self; p keepdim = enc::full_reduction(self, "min")'),
    ("amin", "amin", "t self; p keepdim; p dims = dim"),
    ("argmax", "argmax", "t self; p keepdim; pl dim = enc::opt1(dim)"),
    ("argmin", "argmin", "t self; p keepdim; pl dim = enc::opt1(dim)"),
    ("any", "any", "t self; p keepdim = 0"),
    ("any.dim", "any", "t self; p keepdim; p dims = dim"),
    ("any.dims", "any", "t self; p keepdim; p dims = enc::dims(dim)"),
    ("all", "all", "t self; p keepdim = 0"),
    ("all.dim", "all", "t self; p keepdim; p dims = dim"),
    ("all.dims", "all", "t self; p keepdim; p dims = enc::dims(dim)"),
    # `assume_unique` is only a hint for PyTorch's sorting kernel
    ("isin.Tensor_Tensor", "isin", "t elements; t test_elements; p invert"),
    ("isin.Tensor_Scalar", "isin", "t elements; s test_element; p invert"),
    ("var.correction", "var",
     "t self; p keepdim; p correction = enc::correction(correction); p dims = enc::dims(dim)"),
    ("std.correction", "std",
     "t self; p keepdim; p correction = enc::correction(correction); p dims = enc::dims(dim)"),
    ("logsumexp", "logsumexp", "t self; p keepdim; p dims = dim"),
    ("linalg_vector_norm", "linalg_vector_norm",
     "t self; p keepdim; p dtype; p ord; p dims = enc::dims(dim)"),
    ("_softmax", "_softmax", "t self; p dim; p half_to_float"),
    ("_log_softmax", "_log_softmax", "t self; p dim; p half_to_float"),
    # matrix products
    ("mm", "mm", "t self; t mat2"),
    ("bmm", "bmm", "t self; t mat2"),
    ("addmm", "addmm", "t self; t mat1; t mat2; s1 beta; s1 alpha"),
    ("baddbmm", "baddbmm", "t self; t batch1; t batch2; s1 beta; s1 alpha"),
    ("dot", "dot", "t self; t tensor"),
    # discrete Fourier transforms (every torch.fft function, stft and istft compose into these)
    ("_fft_c2c", "_fft_c2c", "t self; p normalization; p forward; p dims = enc::sym(dim)"),
    ("_fft_r2c", "_fft_r2c", "t self; p normalization; p onesided; p dims = dim"),
    ("_fft_c2r", "_fft_c2r", "t self; p normalization; p last_dim_size; p dims = dim"),
    # shape and indexing (view ops stay PyTorch's own: they alias storage)
    # A sequence grown by appends keeps a capacity buffer (growth.cpp, RFC 0028).
    ("cat", "cat", "first append_in_capacity tensors dim; tl tensors; p dim"),
    ("stack", "stack", "tl tensors; p dim"),
    ("flip", "flip", "t self; p dims"),
    ("roll", "roll", "t self; p shifts; p dims"),
    ("constant_pad_nd", "constant_pad_nd", "t self; s value; p pad = enc::sym(pad)"),
    ("repeat", "repeat", "t self; p repeats = enc::sym(repeats)"),
    ("tril", "tril", "t self; p diagonal"),
    ("triu", "triu", "t self; p diagonal"),
    ("gather", "gather", "t self; t index; p dim"),
    ("index_select", "index_select", "t self; t index; p dim"),
    ("scatter.src", "scatter", "t self; t index; t src; p dim"),
    ("scatter.value", "scatter", "t self; t index; s value; p dim"),
    ("scatter_add", "scatter_add", "t self; t index; t src; p dim"),
    ("embedding", "embedding", "t weight; t indices"),
    # backward ops
    ("threshold_backward", "threshold_backward", "t grad_output; t self; s threshold"),
    ("_softmax_backward_data", "_softmax_backward_data",
     "t grad_output; t output; p dim; p input_dtype"),
    ("_log_softmax_backward_data", "_log_softmax_backward_data",
     "t grad_output; t output; p dim; p input_dtype"),
    ("nll_loss_forward", "nll_loss_forward",
     "t self; t target; t? weight; p reduction; p ignore_index"),
    ("nll_loss_backward", "nll_loss_backward",
     "t grad_output; t self; t target; t total_weight; t? weight; p reduction; p ignore_index"),
]
# random numbers
TABLE += []
# convolution and pooling (PyTorch routes every convolution of this device, conv1d and the
# transposed ones included, through the `_overrideable` pair)
TABLE += [
    ("convolution_overrideable", "convolution_overrideable",
     "t input; t weight; t? bias; p transposed; p groups; p stride; p padding; p dilation; "
     "p output_padding; fmt input weight"),
    ("convolution_backward_overrideable", "convolution_backward_overrideable",
     "t grad_output; t input; t weight; mask output_mask; p transposed; p groups; p stride; "
     "p padding; p dilation; p output_padding; fmt input weight"),
    ("max_pool2d_with_indices", "max_pool2d_with_indices",
     "t self; p ceil_mode; p kernel_size; p stride; p padding; p dilation; fmt self"),
    ("max_pool2d_with_indices_backward", "max_pool2d_with_indices_backward",
     "t grad_output; t self; t indices; p ceil_mode; p kernel_size; p stride; p padding; "
     "p dilation; fmt self"),
    ("avg_pool2d", "avg_pool2d",
     "t self; p ceil_mode; p count_include_pad; p kernel_size; p stride; p padding; "
     "pl divisor_override = enc::opt1(divisor_override); fmt self"),
    ("avg_pool2d_backward", "avg_pool2d_backward",
     "t grad_output; t self; p ceil_mode; p count_include_pad; p kernel_size; p stride; "
     "p padding; pl divisor_override = enc::opt1(divisor_override); fmt self"),
    ("_adaptive_avg_pool2d", "_adaptive_avg_pool2d",
     "t self; p output_size = enc::sym(output_size); fmt self"),
    ("_adaptive_avg_pool2d_backward", "_adaptive_avg_pool2d_backward",
     "t grad_output; t self; fmt self"),
    ("max_pool3d_with_indices", "max_pool3d_with_indices",
     "t self; p ceil_mode; p kernel_size; p stride; p padding; p dilation"),
    ("max_pool3d_with_indices_backward", "max_pool3d_with_indices_backward",
     "t grad_output; t self; t indices; p ceil_mode; p kernel_size; p stride; p padding; "
     "p dilation"),
    ("avg_pool3d", "avg_pool3d",
     "t self; p ceil_mode; p count_include_pad; p kernel_size; p stride; p padding; "
     "pl divisor_override = enc::opt1(divisor_override)"),
    ("avg_pool3d_backward", "avg_pool3d_backward",
     "t grad_output; t self; p ceil_mode; p count_include_pad; p kernel_size; p stride; "
     "p padding; pl divisor_override = enc::opt1(divisor_override)"),
    ("adaptive_max_pool2d", "adaptive_max_pool2d", "t self; p output_size; fmt self"),
    ("adaptive_max_pool2d_backward", "adaptive_max_pool2d_backward",
     "t grad_output; t self; t indices; fmt self"),
]
# normalization (`native_batch_norm` is hand-written in backend.cpp: it updates the running
# statistics in place)
TABLE += [
    ("native_batch_norm_backward", "native_batch_norm_backward",
     "t grad_out; t input; t?k weight; t?k running_mean; t?k running_var; t?k save_mean; "
     "t?k save_invstd; p train; p eps; mask output_mask"),
    ("native_layer_norm", "native_layer_norm",
     "t input; t?k weight; t?k bias; p eps; p normalized_shape = enc::sym(normalized_shape)"),
    ("native_layer_norm_backward", "native_layer_norm_backward",
     "t grad_out; t input; t mean; t rstd; t?k weight; t?k bias; mask output_mask; "
     "p normalized_shape = enc::sym(normalized_shape)"),
    ("native_group_norm", "native_group_norm",
     "t input; t?k weight; t?k bias; p n = N; p c = C; p hxw = HxW; p group; p eps"),
    ("native_group_norm_backward", "native_group_norm_backward",
     "t grad_out; t input; t mean; t rstd; t?k weight; p n = N; p c = C; p hxw = HxW; p group; "
     "mask output_mask"),
    ("embedding_dense_backward", "embedding_dense_backward",
     "t grad_output; t indices; p num_weights; p padding_idx; p scale_grad_by_freq"),
    ("cumsum", "cumsum", "t self; p dim; p dtype"),
    ("cumprod", "cumprod", "t self; p dim; p dtype"),
    ("_logcumsumexp", "logcumsumexp", "t self; p dim"),
    ("masked_fill.Scalar", "masked_fill", "t self; t mask; s value"),
    ("masked_fill.Tensor", "masked_fill", "t self; t mask; ts value"),
]
# attention, sorting, indexing and optimizer ops
TABLE += [
    # Always a stable sort (`stable` needs no param); argsort and msort compose into it.
    ("sort.stable", "sort", "t self; p dim; p descending"),
    ("topk", "topk", "t self; p k; p dim; p largest; p sorted"),
]
# The softmax of the attention decomposition, activation gradients and losses (the fused
# optimizer steps are hand-written in optim.cpp: they take lists of tensors).
TABLE += [
    ("_safe_softmax", "_safe_softmax", "t self; p dim; p dtype"),
    ("gelu_backward", "gelu_backward",
     "t grad_output; t self; p approximate = enc::gelu_approx(approximate)"),
    ("tanh_backward", "tanh_backward", "t grad_output; t output"),
    ("sigmoid_backward", "sigmoid_backward", "t grad_output; t output"),
    ("log_sigmoid_forward", "log_sigmoid_forward", "t self"),
    ("log_sigmoid_backward", "log_sigmoid_backward", "t grad_output; t self; t buffer"),
    # l1_loss's gradient: `sgn` of a real tensor is its sign.
    ("sgn", "sign", "t self"),
    ("mse_loss", "mse_loss", "t self; t target; p reduction"),
    ("mse_loss_backward", "mse_loss_backward", "t grad_output; t self; t target; p reduction"),
    ("smooth_l1_loss", "smooth_l1_loss", "t self; t target; s beta; p reduction"),
    ("smooth_l1_loss_backward", "smooth_l1_loss_backward",
     "t grad_output; t self; t target; s beta; p reduction"),
    ("huber_loss", "huber_loss", "t self; t target; s delta; p reduction"),
    ("huber_loss_backward", "huber_loss_backward",
     "t grad_output; t self; t target; s delta; p reduction"),
    ("binary_cross_entropy", "binary_cross_entropy", "t self; t target; t? weight; p reduction"),
    ("binary_cross_entropy_backward", "binary_cross_entropy_backward",
     "t grad_output; t self; t target; t? weight; p reduction"),
    ("nll_loss2d_forward", "nll_loss2d_forward",
     "t self; t target; t? weight; p reduction; p ignore_index"),
    ("nll_loss2d_backward", "nll_loss2d_backward",
     "t grad_output; t self; t target; t total_weight; t? weight; p reduction; p ignore_index"),
]


# ----- schemas and C++ signatures, from torchgen ------------------------------------------------
#
# torchgen (shipped with PyTorch) parses the `native_functions.yaml` the installed PyTorch was
# generated from, and gives each overload's schema, its dispatch entries and the dispatcher's
# exact C++ signature (the one `at::_ops::<op>::call` takes and a kernel must have).


@dataclass
class Overload:
    qualified: str  # "add.Tensor" or "relu"
    packet: str
    overload: str  # "" for the default overload
    schema: object  # torchgen.model.FunctionSchema
    kind: str = "functional"  # functional | inplace | out
    outs: list[str] = field(default_factory=list)


@dataclass
class CppSig:
    struct: str  # the `at::_ops` struct: add_Tensor
    returns: str
    args: list[tuple[str, str]]  # (type, name)


def _split_name(qualified: str) -> tuple[str, str]:
    packet, _, overload = qualified.partition(".")
    return packet, overload


def _arg_key(schema, drop_outs: bool) -> list[tuple[str, str]]:
    """An overload's arguments by name and type; two forms of one op have the same key (out=
    forms once their written keyword arguments are dropped)."""
    args = schema.arguments
    outs = {a.name for a in args.out} if drop_outs else set()
    return [(a.name, str(a.type)) for a in args.flat_all if a.name not in outs]


def _classify(qualified: str, schema) -> Overload:
    packet, overload = _split_name(qualified)
    o = Overload(qualified, packet, overload, schema)
    outs = [a.name for a in schema.arguments.out]
    if outs:
        o.kind, o.outs = "out", outs
    else:
        written = [a.name for a in schema.arguments.flat_all if a.annotation and a.annotation.is_write]
        if written:
            o.kind, o.outs = "inplace", written
    return o


class Schemas:
    """Every ATen overload of the installed PyTorch, from torchgen's `native_functions.yaml`."""

    def __init__(self):
        import torchgen
        from torchgen.gen import parse_native_yaml

        native = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native")
        parsed = parse_native_yaml(
            os.path.join(native, "native_functions.yaml"), os.path.join(native, "tags.yaml")
        )
        self.functions = {str(f.func.name): f for f in parsed.native_functions}
        self.packets: dict[str, list[str]] = {}
        for qualified in self.functions:
            self.packets.setdefault(_split_name(qualified)[0], []).append(qualified)

    def function(self, qualified: str):
        f = self.functions.get(qualified)
        if f is None:
            raise SystemExit(f"gen_kernels: aten::{qualified} does not exist in this PyTorch")
        return f

    def overload(self, qualified: str) -> Overload:
        return _classify(qualified, self.function(qualified).func)

    def is_composite_implicit(self, qualified: str) -> bool:
        return self.function(qualified).has_composite_implicit_autograd_kernel

    def signature(self, qualified: str) -> CppSig:
        from torchgen.api.types import DispatcherSignature
        from torchgen.context import native_function_manager

        f = self.function(qualified)
        # The signature's C++ types depend on per-function settings (tensor lists as
        # ITensorListRef, const refs for written tensors) that the manager installs.
        with native_function_manager(f):
            sig = DispatcherSignature.from_schema(f.func)
            args = [(a.type, a.name) for a in sig.arguments()]
            returns = sig.returns_type().cpp_type()
        return CppSig(f.func.name.unambiguous_name(), returns, args)

    def variants_of(self, qualified: str) -> list[Overload]:
        """The overload itself plus, for a functional one, its in-place and out= forms: the
        overloads of `packet_` and of `packet` whose arguments are the same."""
        first = self.overload(qualified)
        found = [first]
        if first.kind != "functional":
            return found
        key = _arg_key(first.schema, drop_outs=False)
        for q in self.packets.get(first.packet + "_", []):
            o = self.overload(q)
            if o.kind == "inplace" and _arg_key(o.schema, drop_outs=False) == key:
                found.append(o)
        for q in self.packets.get(first.packet, []):
            o = self.overload(q)
            if q != qualified and o.kind == "out" and _arg_key(o.schema, drop_outs=True) == key:
                found.append(o)
        return found


_SCHEMAS: Schemas | None = None


def schemas() -> Schemas:
    global _SCHEMAS
    if _SCHEMAS is None:
        _SCHEMAS = Schemas()
    return _SCHEMAS


def variants_of(qualified: str) -> list[Overload]:
    return schemas().variants_of(qualified)

# ----- code generation ---------------------------------------------------------------------------


# ----- params by name, placed by the op's layout ------------------------------------------------


@dataclass
class Field:
    name: str
    kind: str  # a FieldKind name of ops/src/param_layout.rs: int, flag, f64, ints, counted...
    optional: bool


def load_layouts(path: str = LAYOUTS_FILE) -> dict[str, list[Field]]:
    """Each engine op's param layout (its fields in order), by the op's catalogue name."""
    with open(path) as f:
        data = json.load(f)
    layouts = {name: [Field(**fd) for fd in fields] for name, fields in data["layouts"].items()}
    return {op: layouts[layout] for op, layout in data["ops"].items()}


LIST_KINDS = {"ints", "counted"}

# `p F` with no expression: the argument named F, encoded as F's kind is.
DEFAULT_ENCODINGS = {
    "int": "{}",
    "flag": "enc::b({})",
    "f64": "enc::f64({})",
    "dtype": "static_cast<int64_t>({})",
    "opt_dtype": "enc::dt({})",
    "reduction": "{}",
    "rounding_mode": "enc::rounding({})",
    "ints": "{}",
    "counted": "enc::counted({})",
}

# Statements that make a param as they add an input or a scalar: (field name, its kind).
IMPLICIT_PARAMS = {
    "tsk": ("{}_kind", "operand_kind"),
    "tsk?": ("{}_kind", "operand_kind"),
    "sk": ("{}_kind", "operand_kind"),
    "t?k": ("has_{}", "flag"),
    "mask": ("{}", "output_mask"),
}

ARGUMENT_VERBS = ("t", "t?", "t?k", "tl", "ts", "tsk", "tsk?", "s", "s1", "sk", "mask")


class _Params:
    """The params a recipe gives, checked against the op's layout and emitted in its order."""

    def __init__(self, layout: list[Field], engine_op: str, fail):
        self.layout = layout
        self.engine_op = engine_op
        self.fail = fail
        self.given: dict[int, tuple[str, bool]] = {}  # field index -> (C++ expression, as list)
        self.group_end: int | None = None  # last field of a `pl` group, which ends the params

    def _index(self, name: str) -> int:
        for i, f in enumerate(self.layout):
            if f.name == name:
                return i
        fields = ", ".join(f"{f.name}: {f.kind}" for f in self.layout) or "none"
        self.fail(f"engine op {self.engine_op} has no param '{name}' (its layout: {fields})")

    def _take(self, i: int, expr: str, as_list: bool) -> None:
        if i in self.given:
            self.fail(f"param '{self.layout[i].name}' is given twice")
        self.given[i] = (expr, as_list)

    def one(self, name: str, expr: str | None, kind: str | None = None) -> None:
        """Field `name` from `expr` (None: the argument of that name, encoded by kind)."""
        i = self._index(name)
        field = self.layout[i]
        if kind is not None and field.kind != kind:
            self.fail(f"param '{name}' is {field.kind} in the layout, the recipe makes it {kind}")
        if expr is None:
            encoding = DEFAULT_ENCODINGS.get(field.kind)
            if encoding is None:
                self.fail(f"param '{name}' ({field.kind}) needs an expression: `p {name} = ...`")
            expr = encoding.format(name)
        self._take(i, expr, field.kind in LIST_KINDS)

    def group(self, names: list[str], expr: str) -> None:
        """Consecutive optional fields from one int array expression, which may give fewer."""
        idx = [self._index(n) for n in names]
        if idx != list(range(idx[0], idx[0] + len(idx))):
            self.fail(f"`pl {', '.join(names)}` names fields that are not consecutive in the layout")
        for i in idx:
            if not self.layout[i].optional:
                self.fail(
                    f"`pl` gives '{self.layout[i].name}' from a list that may be shorter, but the "
                    "layout needs it; give it with `p`"
                )
        self._take(idx[0], expr, True)
        for i in idx[1:]:
            self.given[i] = ("", False)
        self.group_end = idx[-1]

    def lines(self) -> list[str]:
        """`c.param`/`c.params` calls in layout order, after checking nothing is out of place."""
        if not self.given:
            last = -1
        else:
            last = max(self.given)
        for i, field in enumerate(self.layout):
            if i < last and i not in self.given:
                later = self.layout[last].name
                self.fail(f"param '{field.name}' is left out, but the later param '{later}' is given")
            if i > last and not (field.optional or field.kind == "ints"):
                self.fail(f"param '{field.name}' ({field.kind}) is left out, but the layout needs it")
        if self.group_end is not None and self.group_end != last:
            self.fail("params given after a `pl` list that may be shorter would move")
        out = []
        for i in sorted(self.given):
            expr, as_list = self.given[i]
            if expr:
                out.append(f"c.params({expr});" if as_list else f"c.param({expr});")
        return out


def recipe_lines(
    recipe: str,
    arg_names: set[str] | None,
    qualified: str,
    engine_op: str,
    layout: list[Field],
) -> list[str]:
    """The C++ statements of a recipe: inputs and scalars in recipe order, then the params in
    the order of the engine op's layout. `arg_names` None skips the check of argument names
    (the table check runs without PyTorch's signatures)."""

    def fail(message: str):
        raise SystemExit(f"gen_kernels: {qualified}: {message}")

    def check_args(*names: str) -> None:
        for name in names:
            if arg_names is not None and name not in arg_names:
                fail(f"recipe names '{name}', not an argument")

    params = _Params(layout, engine_op, fail)
    lines = []
    for stmt in filter(None, (s.strip() for s in recipe.split(";"))):
        verb, _, rest = stmt.partition(" ")
        rest = rest.strip()
        if verb in ARGUMENT_VERBS:
            check_args(rest)
        if verb in IMPLICIT_PARAMS:
            field_pattern, kind = IMPLICIT_PARAMS[verb]
            field_name = field_pattern.format(rest)
        if verb == "t":
            lines.append(f"c.input({rest});")
        elif verb == "t?":
            lines.append(f"c.opt_input({rest});")
        elif verb == "t?k":
            lines.append(f"c.opt_input({rest});")
            params.one(field_name, f"static_cast<int64_t>({rest}.has_value() && {rest}->defined())", kind)
        elif verb == "tl":
            lines.append(f"c.inputs({rest});")
        elif verb == "ts":
            lines.append(f"c.input_or_scalar({rest});")
        elif verb in ("tsk", "tsk?", "sk"):
            call = {"tsk": "input_or_scalar", "tsk?": "opt_input_or_scalar", "sk": "opt_scalar"}[verb]
            lines.append(f"const int64_t param_{field_name} = c.{call}({rest});")
            params.one(field_name, f"param_{field_name}", kind)
        elif verb == "s":
            lines.append(f"c.scalar({rest});")
        elif verb == "s1":
            lines.append(f"c.scalar_default1({rest});")
        elif verb == "mask":
            lines.append(f"int64_t {rest}_bits = 0;")
            lines.append(f"for (size_t i = 0; i < {rest}.size(); ++i) {rest}_bits |= int64_t({rest}[i]) << i;")
            params.one(field_name, f"{rest}_bits", kind)
        elif verb == "p":
            name, eq, expr = rest.partition("=")
            name = name.strip()
            if not eq:
                check_args(name)
            params.one(name, expr.strip() if eq else None)
        elif verb == "pl":
            names, eq, expr = rest.partition("=")
            if not eq or not expr.strip():
                fail(f"`pl` needs an expression: `pl {names.strip()} = ...`")
            params.group([n.strip() for n in names.split(",")], expr.strip())
        elif verb == "first":
            # `first FN args...`: the functional kernel asks FN first; its result, when it gives
            # one, is the kernel's (kernel_code emits the call).
            check_args(*rest.split()[1:])
        elif verb in ("fmt", "mfmt"):
            check_args(*rest.split())
        else:
            fail(f"unknown recipe statement '{stmt}'")
    return lines + params.lines()


def check_table(table=None, layouts: dict[str, list[Field]] | None = None) -> None:
    """Every recipe against its engine op's param layout (no PyTorch needed); SystemExit names
    the first recipe that disagrees."""
    table = TABLE if table is None else table
    layouts = load_layouts() if layouts is None else layouts
    for qualified, engine_op, recipe in table:
        layout = layouts.get(engine_op)
        if layout is None:
            raise SystemExit(
                f"gen_kernels: {qualified}: engine op '{engine_op}' is not in the catalogue's "
                f"param layouts ({os.path.basename(LAYOUTS_FILE)})"
            )
        recipe_lines(recipe, None, qualified, engine_op, layout)


def kernel_code(
    o: Overload, sig: CppSig, op_index: int, recipe: str, engine_op: str, layout: list[Field]
) -> str:
    names = {n for _, n in sig.args}
    params = ", ".join(f"{t} {n}" for t, n in sig.args)
    fn = f"k_{sig.struct}"
    body = []
    firsts = [s.split()[1:] for s in recipe.split(";") if s.split()[:1] == ["first"]]
    if firsts and o.kind == "functional":
        fn_name, *fn_args = firsts[0]
        body.append(f"  if (auto early = {fn_name}({', '.join(fn_args)})) return std::move(*early);")
    body.append(f'  OpCall c(g_kernel_op_ids[{op_index}], "aten::{o.qualified}");')
    body += ["  " + line for line in recipe_lines(recipe, names, o.qualified, engine_op, layout)]
    # Complex values the engine op does not compute run on the CPU (OpCall::on_cpu).
    call_args = ", ".join(n for _, n in sig.args)
    body.append(
        "  if (C10_UNLIKELY(c.on_cpu())) return at::native::call_fallback_fn_symint<"
        f"&pjrt_cpu_fallback, at::_ops::{sig.struct}>::call({call_args});"
    )
    n_results = len(o.schema.returns)
    fmts = [s.split()[1:] for s in recipe.split(";") if s.split()[:1] == ["fmt"]]
    mfmts = [s.split()[1:] for s in recipe.split(";") if s.split()[:1] == ["mfmt"]]

    def result(expr: str) -> str:
        if mfmts:
            memory_format, like = mfmts[0]
            return f"in_memory_format({expr}, {memory_format}, {like})"
        if not fmts:
            return expr
        return f"in_format_of({expr}, {{{', '.join(fmts[0])}}})"

    if o.kind == "functional":
        if n_results == 1:
            body.append(f"  return {result('c.run_functional()')};")
        else:
            body.append(f"  auto r = c.run_functional_n({n_results});")
            items = ", ".join(result(f"std::move(r[{i}])") for i in range(n_results))
            masks = [s.split()[1] for s in recipe.split(";") if s.split()[:1] == ["mask"]]
            if masks:
                items = ", ".join(
                    f"{masks[0]}[{i}] ? {result(f'std::move(r[{i}])')} : at::Tensor()"
                    for i in range(n_results)
                )
            body.append(f"  return {sig.returns}({items});")
    else:
        for out in o.outs:
            body.append(f"  c.out({out});")
        body.append("  c.run_inplace();" if o.kind == "inplace" else "  c.run_out();")
        if len(o.outs) == 1:
            body.append(f"  return {o.outs[0]};")
        else:
            body.append(f"  return {sig.returns}({', '.join(o.outs)});")
    return f"static {sig.returns} {fn}({params}) {{\n" + "\n".join(body) + "\n}\n"


# ----- typed param builders for hand-written kernels ---------------------------------------------

# A layout field's C++ type in a builder, and how `encode` appends it (`{}`: the field's value).
BUILDER_KINDS = {
    "int": ("int64_t", ["c.param({});"]),
    "flag": ("bool", ["c.param(int64_t{{{} ? 1 : 0}});"]),
    "f64": ("double", ["c.param(std::bit_cast<int64_t>({}));"]),
    "dtype": ("c10::ScalarType", ["c.param(static_cast<int64_t>({}));"]),
    "opt_dtype": ("std::optional<c10::ScalarType>",
                  ["c.param({0} ? static_cast<int64_t>(*{0}) : int64_t{{-1}});"]),
    "reduction": ("int64_t", ["c.param({});"]),
    "rounding_mode": ("int64_t", ["c.param({});"]),
    "operand_kind": ("int64_t", ["c.param({});"]),
    "output_mask": ("int64_t", ["c.param({});"]),
    "ints": ("c10::IntArrayRef", ["c.params({});"]),
    "counted": ("c10::IntArrayRef", ["c.param(static_cast<int64_t>({0}.size()));", "c.params({0});"]),
}

_CPP_KEYWORDS = {
    "and", "or", "not", "xor", "new", "delete", "int", "float", "double", "bool", "char",
    "long", "short", "signed", "unsigned", "void", "class", "struct", "union", "enum",
    "template", "typename", "operator", "this", "return", "default", "case", "switch",
}


def op_identifier(engine_op: str) -> str:
    """The C++ name of an engine op in `torch_pjrt::ops` (`pow.Scalar` is `pow_Scalar`)."""
    ident = re.sub(r"[^A-Za-z0-9_]", "_", engine_op)
    return ident + "_" if ident in _CPP_KEYWORDS else ident


def load_layout_table(path: str = LAYOUTS_FILE) -> tuple[dict[str, list[Field]], dict[str, str]]:
    """Every layout's fields by the layout's name, and each engine op's layout name."""
    with open(path) as f:
        data = json.load(f)
    layouts = {name: [Field(**fd) for fd in fields] for name, fields in data["layouts"].items()}
    return layouts, dict(data["ops"])


def _builder_struct(name: str, fields: list[Field], users: list[str]) -> str:
    def fail(message: str):
        raise SystemExit(f"gen_kernels: param layout {name}: {message}")

    members, body = [], []
    optional_seen: list[Field] = []
    for i, fd in enumerate(fields):
        if fd.kind not in BUILDER_KINDS:
            fail(f"field '{fd.name}' has kind {fd.kind}, which no C++ builder encodes")
        ctype, appends = BUILDER_KINDS[fd.kind]
        if fd.optional:
            members.append(f"  std::optional<{ctype}> {fd.name} = std::nullopt;")
            later = [f.name for f in fields[i + 1:]]
            if later:
                given = " || ".join(f"{n}.has_value()" for n in later)
                body.append(f"    if (!{fd.name}) {{")
                body.append(f"      TORCH_CHECK(!({given}),")
                body.append(
                    f'          "param layout {name}: a later optional param is given without '
                    f"'{fd.name}' before it\");"
                )
                body.append("      return;")
                body.append("    }")
            else:
                body.append(f"    if (!{fd.name}) {{")
                body.append("      return;")
                body.append("    }")
            body += ["    " + a.format(f"{fd.name}.value()") for a in appends]
            optional_seen.append(fd)
        else:
            if optional_seen:
                fail(f"the required field '{fd.name}' follows the optional '{optional_seen[0].name}'")
            members.append(f"  Required<{ctype}> {fd.name};")
            body += ["    " + a.format(f"{fd.name}.value") for a in appends]
    fields_doc = ", ".join(f"{fd.name}: {fd.kind}{'?' if fd.optional else ''}" for fd in fields)
    doc = f"Layout {name} ({fields_doc or 'no params'}), of: {', '.join(users)}."
    lines = textwrap.wrap(doc, 97, initial_indent="// ", subsequent_indent="// ", break_on_hyphens=False)
    lines.append(f"struct {name} {{")
    lines += members
    lines.append("")
    lines.append("  template <typename Call>")
    lines.append(f"  void encode([[maybe_unused]] Call& c) const {{")
    lines += body
    lines.append("  }")
    lines.append("};")
    return "\n".join(lines) + "\n"


BUILDERS_HEADER = """\
// Generated by gen_kernels.py from param_layouts.json (the op catalogue's typed param layouts);
// do not edit. One builder per layout: a hand-written kernel names each param, and `encode`
// appends them in the layout's order, so positions are written in one place, the catalogue.
//
//   static const auto op = engine_op(ops::native_batch_norm);
//   OpCall c(op, "aten::native_batch_norm", {.has_weight = ..., ..., .eps = eps});
//
// A designated initializer must follow the layout's order, name its fields and give every
// required one (`Required` has no default), so a builder the layout no longer matches does not
// compile; `OpCall` takes only the layout of the op it calls.
#pragma once

#include <bit>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

namespace torch_pjrt {
namespace params {

// A field the layout needs: no default, so a builder that leaves it out does not compile. A flag
// takes a bool only, not an integer that would mean one.
template <typename T>
class Required {
 public:
  template <typename U>
    requires std::is_convertible_v<U, T> &&
      (!std::is_same_v<T, bool> || std::is_same_v<std::remove_cvref_t<U>, bool>)
  Required(U&& v) : value(std::forward<U>(v)) {}

  T value;
};

// An engine op's catalogue name, typed by its param layout (`ops::native_batch_norm`).
template <typename Layout>
struct EngineOpName {
  const char* name;
};

// An engine op's resolved id, typed by its param layout (`engine_op(ops::...)` gives one).
template <typename Layout>
struct EngineOp {
  int32_t id;
};

"""


def param_builders_code(layouts: dict[str, list[Field]], op_layouts: dict[str, str]) -> str:
    """The C++ header of typed param builders: one struct per layout, one typed name per op."""
    users: dict[str, list[str]] = {name: [] for name in layouts}
    for op, layout in op_layouts.items():
        if layout not in layouts:
            raise SystemExit(f"gen_kernels: engine op {op} names the unknown param layout {layout}")
        users[layout].append(op)
    text = BUILDERS_HEADER
    for name, fields in layouts.items():
        text += _builder_struct(name, fields, users[name] or ["no op"]) + "\n"
    text += "}  // namespace params\n\n"
    text += "// Every engine op by its catalogue name, with the layout its params take.\n"
    text += "namespace ops {\n"
    seen: dict[str, str] = {}
    for op, layout in op_layouts.items():
        ident = op_identifier(op)
        if ident in seen:
            raise SystemExit(f"gen_kernels: engine ops {seen[ident]} and {op} share the C++ name {ident}")
        seen[ident] = op
        text += f'inline constexpr params::EngineOpName<params::{layout}> {ident}{{"{op}"}};\n'
    text += "}  // namespace ops\n\n}  // namespace torch_pjrt\n"
    return text


def write_param_builders(out_dir: str, path: str = LAYOUTS_FILE) -> str:
    layouts, op_layouts = load_layout_table(path)
    os.makedirs(out_dir, exist_ok=True)
    return _write(os.path.join(out_dir, "param_builders.h"), param_builders_code(layouts, op_layouts))


# ----- hand-written kernels: registered from their rows ------------------------------------------


def _options(row_options: str, qualified: str) -> set[str]:
    options = set(row_options.split())
    unknown = options - {"only", "real", "autograd", "over_implicit"}
    if unknown:
        raise SystemExit(f"gen_kernels: {qualified}: unknown option(s) {sorted(unknown)}")
    return options


_FUNCTION_NAME_RE = re.compile(r"^[A-Za-z_][\w:]*(<[^()]*>)?$")


def _kernel_call(kernel: str, arg_names: list[str]) -> str:
    """A row's kernel as a C++ expression: a function name is called with the arguments."""
    if _FUNCTION_NAME_RE.match(kernel):
        return f"{kernel}({', '.join(arg_names)})"
    return kernel


def hand_written_kernel_code(o: Overload, sig: CppSig, base: Overload, kernel: str, options: set[str]) -> str:
    """The C++ kernel of overload `o`, registered from the row of `base` (`o` itself, or the
    functional overload `o` is the in-place or out= form of)."""
    params = ", ".join(f"{t} {n}" for t, n in sig.args)
    all_names = [n for _, n in sig.args]
    # A derived out= form passes the functional arguments on; the in-place form passes them all.
    base_names = all_names if o is base or o.kind == "inplace" else [n for n in all_names if n not in o.outs]
    call = _kernel_call(kernel, base_names)
    body = []
    if "real" in options:
        # The first tensor argument decides (`self`, or `A` of torch.linalg's ops).
        first = next(n for t, n in sig.args if t.replace(" ", "") in ("constat::Tensor&", "at::Tensor&"))
        body.append(
            f"  if (C10_UNLIKELY({first}.is_complex())) return run_on_cpu<at::_ops::{sig.struct}>"
            f"({', '.join(all_names)});"
        )
    if o is base:
        body.append(f"  return {call};")
    elif o.kind == "inplace":
        if len(o.outs) != 1:
            raise SystemExit(f"gen_kernels: aten::{o.qualified} writes {o.outs}; derive one in-place form")
        body.append(f"  return write_in_place({call}, {o.outs[0]});")
    elif len(o.outs) == 1:
        body.append(f"  return write_out({call}, {o.outs[0]});")
    else:
        # `computed`: an out= argument may be named `result` (`_linalg_solve_ex.result`).
        body.append(f"  auto computed = {call};")
        body += [f"  write_out(std::get<{i}>(computed), {out});" for i, out in enumerate(o.outs)]
        body.append(f"  return {sig.returns}({', '.join(o.outs)});")
    return f"{sig.returns} {hand_written_kernel_name(sig)}({params}) {{\n" + "\n".join(body) + "\n}\n"


def hand_written_kernel_name(sig: CppSig) -> str:
    return f"k_{sig.struct}"


def hand_written_kernels(
    known: Schemas, rows: dict[str, list[tuple[str, str, str]]], engine_overloads: set[str]
) -> dict[str, list[tuple[str, str, str, set[str]]]]:
    """Each family's kernels: (qualified, C++ function, its code, options), every row's own
    overload and the forms derived from a functional row that no row and no engine kernel
    names."""
    explicit: dict[str, str] = {}
    for family, family_rows in rows.items():
        for qualified, _, _ in family_rows:
            if qualified in engine_overloads:
                raise SystemExit(f"gen_kernels: aten::{qualified} has an engine row and a hand-written row")
            if qualified in explicit:
                raise SystemExit(
                    f"gen_kernels: aten::{qualified} has two hand-written rows ({explicit[qualified]}, {family})"
                )
            explicit[qualified] = family
    result: dict[str, list[tuple[str, str, str, set[str]]]] = {}
    for family, family_rows in rows.items():
        kernels = result.setdefault(family, [])
        for qualified, kernel, row_options in family_rows:
            options = _options(row_options, qualified)
            if known.is_composite_implicit(qualified) and "over_implicit" not in options:
                raise SystemExit(
                    f"gen_kernels: aten::{qualified} is CompositeImplicitAutograd; a pjrt kernel "
                    "would bypass the decomposition autograd differentiates (option over_implicit: "
                    "the device answers it itself)"
                )
            base = known.overload(qualified)
            # A view's result aliases its input: there is no in-place or out= form to derive.
            aliases = any(r.annotation is not None for r in base.schema.returns)
            forms = [base] if "only" in options or aliases else known.variants_of(qualified)
            base = forms[0]  # the forms compare with it by identity
            for o in forms:
                if o is not base and (
                    o.qualified in explicit
                    or o.qualified in engine_overloads
                    or known.is_composite_implicit(o.qualified)
                ):
                    continue
                sig = known.signature(o.qualified)
                code = hand_written_kernel_code(o, sig, base, kernel, options)
                # Only the row's own overload goes above autograd: an out= form is not
                # differentiable, and autograd's check for that must stay in front of it.
                form_options = options if o is base else options - {"autograd"}
                kernels.append((o.qualified, hand_written_kernel_name(sig), code, form_options))
    return result


def hand_written_include(family: str, kernels: list[tuple[str, str, str, set[str]]]) -> str:
    text = (
        "// Generated by gen_kernels.py from hand_written_kernels.py; do not edit. Included where\n"
        f"// {family}.cpp ends, inside namespace torch_pjrt, so its kernels call the family's own\n"
        "// functions.\n\nnamespace {\n\n"
    )
    text += "\n".join(code for _, _, code, _ in kernels)
    text += "\n}  // namespace\n\nTORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {\n"
    for qualified, fn, _, _ in kernels:
        text += f'  m.impl("{qualified}", TORCH_FN({fn}));\n'
    text += "}\n"
    above = [(q, fn) for q, fn, _, options in kernels if "autograd" in options]
    if above:
        text += "\n// Above autograd: these compositions record their own gradients.\n"
        text += "TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {\n"
        for qualified, fn in above:
            text += f'  m.impl("{qualified}", TORCH_FN({fn}));\n'
        text += "}\n"
    return text


HEADER = """// Generated by gen_kernels.py from its op table and the installed PyTorch; do not edit.
#include <ATen/native/CPUFallback.h>

#include "pjrt_backend.h"

namespace torch_pjrt {

// Engine op ids, resolved by name when the engine table is installed (-1: unknown op).
extern int32_t g_kernel_op_ids[];
"""


def generate(out_dir: str, shards: int) -> list[str]:

    known = schemas()
    layouts = load_layouts()
    check_table(TABLE, layouts)
    # Hand-written kernels include it (through pjrt_backend.h); it is no source of its own.
    write_param_builders(out_dir)
    engine_ops: list[str] = []
    kernels: list[tuple[str, str, int, str]] = []  # (qualified, code, op index, fn)
    seen: set[str] = set()
    for qualified, engine_op, recipe in TABLE:
        if engine_op not in engine_ops:
            engine_ops.append(engine_op)
        index = engine_ops.index(engine_op)
        for o in variants_of(qualified):
            if o.qualified in seen:
                continue
            if known.is_composite_implicit(o.qualified):
                if o.qualified == qualified:
                    raise SystemExit(
                        f"gen_kernels: aten::{qualified} is CompositeImplicitAutograd; a pjrt "
                        "kernel would bypass the decomposition autograd differentiates"
                    )
                continue
            seen.add(o.qualified)
            sig = known.signature(o.qualified)
            code = kernel_code(o, sig, index, recipe, engine_op, layouts[engine_op])
            kernels.append((o.qualified, code, index, f"k_{sig.struct}"))

    os.makedirs(out_dir, exist_ok=True)
    # Hand-written kernels: an include per family, which its C++ file compiles.
    for family, family_kernels in hand_written_kernels(known, HAND_WRITTEN, seen).items():
        _write(os.path.join(out_dir, f"{family}_kernels.inc"), hand_written_include(family, family_kernels))
    written = []
    per_shard = (len(kernels) + shards - 1) // shards
    for s in range(shards):
        chunk = kernels[s * per_shard:(s + 1) * per_shard]
        text = HEADER + "\nnamespace {\n\n" + "\n".join(code for _, code, _, _ in chunk) + "\n}  // namespace\n\n"
        text += f"void register_kernels_shard{s}(torch::Library& lib) {{\n"
        for qualified, _, index, fn in chunk:
            text += f"  if (g_kernel_op_ids[{index}] >= 0) lib.impl(\"{qualified}\", TORCH_FN({fn}));\n"
        text += "}\n\n}  // namespace torch_pjrt\n"
        written.append(_write(os.path.join(out_dir, f"kernels_{s}.cpp"), text))

    reg = ["// Generated by gen_kernels.py; do not edit.", '#include "pjrt_backend.h"',
           '#include "module_api.h"', "", "namespace torch_pjrt {", ""]
    reg.append(f"int32_t g_kernel_op_ids[{len(engine_ops)}];")
    reg.append("")
    reg.append("namespace {")
    reg.append("const char* const kEngineOps[] = {")
    reg += [f'    "{name}",' for name in engine_ops]
    reg.append("};")
    reg.append("const char* const kKernels[] = {")
    reg += [f'    "aten::{q}",' for q, _, _, _ in kernels]
    reg.append("};")
    reg.append("const int kKernelOps[] = {" + ", ".join(str(i) for _, _, i, _ in kernels) + "};")
    reg.append("}  // namespace")
    reg.append("")
    for s in range(shards):
        reg.append(f"void register_kernels_shard{s}(torch::Library& lib);")
    reg.append("")
    reg.append("std::vector<std::string> register_generated_kernels() {")
    reg.append("  const TpjrtApi& table = api();")
    reg.append(f"  for (int i = 0; i < {len(engine_ops)}; ++i) {{")
    reg.append("    int32_t id = -1;")
    reg.append("    g_kernel_op_ids[i] = table.op_id(kEngineOps[i], &id) == TPJRT_OK ? id : -1;")
    reg.append("  }")
    reg.append("  // Registrations live as long as the process.")
    reg.append("  auto* lib = new torch::Library(torch::Library::IMPL, \"aten\",")
    reg.append("      c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);")
    for s in range(shards):
        reg.append(f"  register_kernels_shard{s}(*lib);")
    reg.append("  std::vector<std::string> missing;")
    reg.append(f"  for (int k = 0; k < {len(kernels)}; ++k) {{")
    reg.append("    if (g_kernel_op_ids[kKernelOps[k]] < 0) missing.emplace_back(kKernels[k]);")
    reg.append("  }")
    reg.append("  return missing;")
    reg.append("}")
    reg.append("")
    reg.append("namespace module {")
    reg.append("std::vector<std::string> kernel_names() {")
    reg.append("  return std::vector<std::string>(std::begin(kKernels), std::end(kKernels));")
    reg.append("}")
    reg.append("}  // namespace module")
    reg.append("")
    reg.append("}  // namespace torch_pjrt")
    written.append(_write(os.path.join(out_dir, "register.cpp"), "\n".join(reg) + "\n"))
    return written


def _write(path: str, text: str) -> str:
    """Writes only when the content changed, so an unchanged table rebuilds nothing."""
    try:
        with open(path) as f:
            if f.read() == text:
                return path
    except OSError:
        pass
    with open(path, "w") as f:
        f.write(text)
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--shards", type=int, default=2)
    args = parser.parse_args(argv)
    for path in generate(args.out_dir, args.shards):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
