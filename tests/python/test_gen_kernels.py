"""The kernel generator's recipes against the engine ops' typed param layouts.

`python/torch_pjrt/csrc/param_layouts.json` is written from the op catalogue by
`ops/tests/param_layouts.rs`; the generator places every param a recipe names where the op's
layout puts it, and refuses a recipe that disagrees with the layout. Hand-written kernels build
their params through typed builders generated from the same layouts (`param_builders.h`)."""

import os
import re
import sys

import pytest

CSRC = os.path.join(os.path.dirname(__file__), "..", "..", "python", "torch_pjrt", "csrc")
sys.path.insert(0, os.path.abspath(CSRC))

import gen_kernels  # noqa: E402


@pytest.fixture(scope="module")
def layouts():
    return gen_kernels.load_layouts()


def lines(layouts, recipe, op):
    return gen_kernels.recipe_lines(recipe, None, f"test.{op}", op, layouts[op])


def test_every_recipe_fits_its_engine_ops_param_layout(layouts):
    gen_kernels.check_table(gen_kernels.TABLE, layouts)
    ops_in_table = {engine_op for _, engine_op, _ in gen_kernels.TABLE}
    assert ops_in_table <= set(layouts), ops_in_table - set(layouts)


def test_params_are_placed_by_the_layout_not_by_the_recipe(layouts):
    # linalg_vector_norm's layout is [keepdim, dtype, ord, dims...]; the recipe names them in
    # another order and the generated call still appends them in the layout's.
    out = lines(layouts, "t self; p dims = enc::dims(dim); p ord; p keepdim; p dtype", "linalg_vector_norm")
    assert out == [
        "c.input(self);",
        "c.param(enc::b(keepdim));",
        "c.param(enc::dt(dtype));",
        "c.param(enc::f64(ord));",
        "c.params(enc::dims(dim));",
    ]
    # A kind chosen by a statement that adds an input lands at its field's place too.
    out = lines(layouts, "t self; p min_kind = 0; tsk max", "clamp")
    assert out == [
        "c.input(self);",
        "const int64_t param_max_kind = c.input_or_scalar(max);",
        "c.param(0);",
        "c.param(param_max_kind);",
    ]


@pytest.mark.parametrize(
    "op, recipe, message",
    [
        ("sum", "t self; p keepdim; p dtype; p dim", "engine op sum has no param 'dim'"),
        ("amax", "t self; p keepdim; p keepdim = 0", "param 'keepdim' is given twice"),
        ("topk", "t self; p k; p dim; p largest", "param 'sorted' (flag) is left out"),
        ("var", "t self; p correction = enc::correction(correction)", "param 'keepdim' is left out"),
        ("clamp", "t self; t?k min; sk max", "engine op clamp has no param 'has_min'"),
        ("native_batch_norm_backward", "t grad_out; t input; mask train",
         "param 'train' is flag in the layout, the recipe makes it output_mask"),
        ("where", "t condition; p self_kind", "needs an expression"),
        ("nan_to_num", "t self; pl given, nan = enc::nan_to_num(nan, posinf, neginf); p posinf",
         "params given after a `pl` list"),
        ("native_layer_norm", "t input; pl has_weight, has_bias = x", "the layout needs it"),
        ("neg", "t self; p approximate = 1", "engine op neg has no param 'approximate'"),
    ],
)
def test_a_recipe_that_disagrees_with_the_layout_is_refused(layouts, op, recipe, message):
    with pytest.raises(SystemExit) as refused:
        lines(layouts, recipe, op)
    assert message in str(refused.value), str(refused.value)
    assert f"test.{op}" in str(refused.value)


def test_an_engine_op_missing_from_the_catalogue_is_refused(layouts):
    with pytest.raises(SystemExit, match="engine op 'no_such_op' is not in the catalogue"):
        gen_kernels.check_table([("neg", "no_such_op", "t self")], layouts)


# ----- typed param builders for hand-written kernels ---------------------------------------------


@pytest.fixture(scope="module")
def layout_table():
    return gen_kernels.load_layout_table()


def builder_members(code: str, layout: str) -> list[str]:
    """The member names of a layout's builder struct, in declaration order."""
    body = code.split(f"struct {layout} {{\n", 1)[1].split("  template <typename Call>", 1)[0]
    return re.findall(r"^  (?:Required|std::optional)<.*> (\w+)(?: = std::nullopt)?;$", body, re.M)


def test_every_layout_has_a_builder_whose_fields_are_the_layouts(layout_table):
    layouts, op_layouts = layout_table
    code = gen_kernels.param_builders_code(layouts, op_layouts)
    for name, fields in layouts.items():
        assert builder_members(code, name) == [f.name for f in fields], name
    for op, layout in op_layouts.items():
        ident = gen_kernels.op_identifier(op)
        assert f'params::EngineOpName<params::{layout}> {ident}{{"{op}"}};' in code, op
    assert gen_kernels.op_identifier("pow.Scalar") == "pow_Scalar"


def test_a_layout_a_builder_cannot_encode_is_refused(layout_table):
    layouts, _ = layout_table
    bad = {"Odd": [gen_kernels.Field("x", "int", True), gen_kernels.Field("y", "flag", False)]}
    with pytest.raises(SystemExit, match="the required field 'y' follows the optional 'x'"):
        gen_kernels.param_builders_code(bad, {"odd": "Odd"})
    bad = {"Odd": [gen_kernels.Field("x", "string", False)]}
    with pytest.raises(SystemExit, match="field 'x' has kind string"):
        gen_kernels.param_builders_code(bad, {"odd": "Odd"})
    with pytest.raises(SystemExit, match="names the unknown param layout Gone"):
        gen_kernels.param_builders_code(layouts, {"odd": "Gone"})


# A stand-in for `OpCall` (pjrt_backend.h needs the whole of ATen): its typed constructor is
# OpCall's, and it prints the params in the order they are appended.
FAKE_CALL = r"""
#include <cstdio>
#include "param_builders.h"
using namespace torch_pjrt;
struct Call {
  template <typename Layout>
  Call(params::EngineOp<Layout>, const Layout& p) { p.encode(*this); }
  void param(int64_t v) { std::printf("%lld ", static_cast<long long>(v)); }
  void params(c10::IntArrayRef vs) { for (int64_t v : vs) param(v); }
};
constexpr params::EngineOp<params::BatchNorm> batch_norm{0};
constexpr params::EngineOp<params::RandomIntDraw> random_draw{1};
constexpr params::EngineOp<params::MaxPool> max_pool{2};
constexpr params::EngineOp<params::NanToNum> nan_to_num{3};
int main() {
  const int64_t sizes[] = {2, 3};
  const int64_t kernel[] = {3, 3};
  const int64_t one[] = {1};
"""

# The hand-written call, as it is written against the catalogue's layouts.
BATCH_NORM_PARAMS = """{.has_weight = true, .has_bias = false, .has_running_mean = true,
                 .has_running_var = true, .training = false, .eps = 0.5}"""
BATCH_NORM_CALL = f"  Call(batch_norm, {BATCH_NORM_PARAMS});\n"

CALLS_THAT_FIT = BATCH_NORM_CALL + """
  std::printf("| ");
  Call(random_draw, {.dtype = c10::ScalarType::Long, .full_range = true, .sizes = sizes});
  std::printf("| ");
  Call(max_pool, {.ceil_mode = false, .kernel_size = kernel, .stride = one, .padding = one,
                  .dilation = one});
  std::printf("| ");
  Call(nan_to_num, {.given = 1, .nan = 0.5});
  std::printf("| ");
  Call(nan_to_num, {});
"""


def compile_cpp(tmp_path, header: str, body: str, run: bool):
    """Compiles FAKE_CALL + body against `header`; (ok, compiler messages or program output)."""
    import subprocess

    import torch
    import torch.utils.cpp_extension as ext

    (tmp_path / "param_builders.h").write_text(header)
    src = tmp_path / "call.cpp"
    src.write_text(FAKE_CALL + body + "\n  return 0;\n}\n")
    includes = [f"-I{p}" for p in ext.include_paths()] + [f"-I{tmp_path}"]
    cmd = ["c++", "-std=c++20", *includes, str(src)]
    if run:
        lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        exe = tmp_path / "call"
        cmd += ["-o", str(exe), f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}"]
    else:
        cmd.append("-fsyntax-only")
    # The C locale keeps the compiler's quotes plain.
    built = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    if built.returncode != 0 or not run:
        return built.returncode == 0, built.stderr
    ran = subprocess.run([str(exe)], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    return True, ran.stdout


def test_builders_append_each_param_where_its_layout_puts_it(tmp_path, layout_table):
    import struct

    layouts, op_layouts = layout_table
    ok, out = compile_cpp(tmp_path, gen_kernels.param_builders_code(layouts, op_layouts),
                          CALLS_THAT_FIT, run=True)
    assert ok, out
    half = struct.unpack("<q", struct.pack("<d", 0.5))[0]
    long_code = 4  # c10::ScalarType::Long
    assert [part.split() for part in out.split("|")] == [
        ["1", "0", "1", "1", "0", str(half)],
        [str(long_code), "1", "2", "3"],
        ["0", "2", "3", "3", "1", "1", "1", "1", "1", "1"],
        ["1", str(half)],
        [],
    ]


def _changed(layouts, name, change):
    changed = {k: list(v) for k, v in layouts.items()}
    changed[name] = change(list(changed[name]))
    return changed


RANDOM_DRAW = "random_draw", "RandomIntDraw"


@pytest.mark.parametrize(
    "case, op, params, reason",
    [
        # The catalogue's layout changes under a hand-written call: the call no longer compiles.
        ("fields swapped", ("batch_norm", "BatchNorm"), BATCH_NORM_PARAMS,
         "designator order for field 'torch_pjrt::params::BatchNorm::has_bias' does not match"),
        ("field renamed", ("batch_norm", "BatchNorm"), BATCH_NORM_PARAMS,
         "has no non-static data member named 'has_running_mean'"),
        ("field added", ("batch_norm", "BatchNorm"), BATCH_NORM_PARAMS,
         "to 'torch_pjrt::params::Required<double>'"),
        # A call that disagrees with an unchanged layout.
        ("another op's layout", RANDOM_DRAW, "{.has_weight = true}",
         "has no non-static data member named 'has_weight'"),
        ("required field left out", RANDOM_DRAW, "{.dtype = c10::ScalarType::Long, .sizes = sizes}",
         "to 'torch_pjrt::params::Required<bool>'"),
        ("integer for a flag", RANDOM_DRAW,
         "{.dtype = c10::ScalarType::Long, .full_range = 1, .sizes = sizes}",
         "'torch_pjrt::params::Required<bool>'"),
    ],
)
def test_a_builder_that_disagrees_with_its_layout_does_not_compile(
    tmp_path, layout_table, case, op, params, reason
):
    layouts, op_layouts = layout_table
    Field = gen_kernels.Field
    if case == "fields swapped":
        layouts = _changed(layouts, "BatchNorm", lambda f: [f[1], f[0], *f[2:]])
    elif case == "field renamed":
        layouts = _changed(
            layouts, "BatchNorm",
            lambda f: [Field("has_mean" if x.name == "has_running_mean" else x.name, x.kind, x.optional)
                       for x in f])
    elif case == "field added":
        layouts = _changed(layouts, "BatchNorm", lambda f: [*f, Field("momentum", "f64", False)])
    header = gen_kernels.param_builders_code(layouts, op_layouts)
    op_name, layout = op
    # Through the call, as the kernels write it: refused for the op's layout...
    ok, errors = compile_cpp(tmp_path, header, f"  Call({op_name}, {params});", run=False)
    assert not ok, f"{case}: compiled"
    assert f"'const torch_pjrt::params::{layout}" in errors, errors
    # ...and the builder on its own, for the compiler's reason.
    ok, errors = compile_cpp(tmp_path, header, f"  const params::{layout} p{params};", run=False)
    assert not ok, f"{case}: compiled"
    assert reason in errors, errors


def test_hand_written_kernels_name_their_params(layout_table):
    """Outside the generated kernels, params are built by name through the layout's builder:
    no positional `.param(...)` and no untyped op lookup."""
    offenders = []
    for name in sorted(os.listdir(CSRC)):
        if not name.endswith((".cpp", ".h")) or name == "pjrt_backend.h":
            continue
        with open(os.path.join(CSRC, name)) as f:
            for n, line in enumerate(f, 1):
                if re.search(r"\.params?\(|engine_op\(\"", line):
                    offenders.append(f"{name}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


# ----- hand-written kernels, registered from their rows -----------------------------------------


@pytest.fixture(scope="module")
def schemas():
    return gen_kernels.schemas()


def engine_overloads(schemas):
    found = set()
    for qualified, _, _ in gen_kernels.TABLE:
        found.update(o.qualified for o in schemas.variants_of(qualified))
    return found


def kernels_by_overload(schemas, rows):
    families = gen_kernels.hand_written_kernels(schemas, rows, engine_overloads(schemas))
    return {q: code for kernels in families.values() for q, _, code, _ in kernels}


def test_signatures_are_the_dispatchers(schemas):
    sig = schemas.signature("upsample_nearest2d")
    assert sig.struct == "upsample_nearest2d"
    assert sig.returns == "at::Tensor"
    assert sig.args == [
        ("const at::Tensor &", "self"),
        ("c10::SymIntArrayRef", "output_size"),
        ("::std::optional<double>", "scales_h"),
        ("::std::optional<double>", "scales_w"),
    ]
    # A written argument of an in-place overload is a mutable reference; a tensor list of a
    # structured op an ITensorListRef, as the dispatcher's headers have them.
    assert schemas.signature("add_.Tensor").args[0] == ("at::Tensor &", "self")
    assert schemas.signature("cat").args[0] == ("const at::ITensorListRef &", "tensors")
    assert schemas.signature("max.dim").returns == "::std::tuple<at::Tensor,at::Tensor>"


def test_variants_are_found_by_argument_lists(schemas):
    found = {o.qualified: o.kind for o in schemas.variants_of("hardtanh")}
    assert found == {"hardtanh": "functional", "hardtanh_": "inplace", "hardtanh.out": "out"}
    found = {o.qualified: (o.kind, o.outs) for o in schemas.variants_of("max.dim")}
    assert found == {"max.dim": ("functional", []), "max.dim_max": ("out", ["max", "max_values"])}


def test_every_hand_written_row_generates(schemas):
    families = gen_kernels.hand_written_kernels(schemas, gen_kernels.HAND_WRITTEN, engine_overloads(schemas))
    assert set(families) == set(gen_kernels.HAND_WRITTEN)
    registered = [q for kernels in families.values() for q, _, _, _ in kernels]
    assert len(registered) == len(set(registered))
    # Each family's C++ file compiles its include where it ends.
    for family in families:
        with open(os.path.join(CSRC, f"{family}.cpp")) as f:
            assert f'#include "generated/{family}_kernels.inc"' in f.read(), family


def test_a_functional_row_brings_its_out_and_in_place_forms(schemas):
    code = kernels_by_overload(schemas, {"activation": [("hardtanh", "pjrt_hardtanh", "")]})
    assert set(code) == {"hardtanh", "hardtanh_", "hardtanh.out"}
    assert "return pjrt_hardtanh(self, min_val, max_val);" in code["hardtanh"]
    assert "return write_in_place(pjrt_hardtanh(self, min_val, max_val), self);" in code["hardtanh_"]
    assert "return write_out(pjrt_hardtanh(self, min_val, max_val), out);" in code["hardtanh.out"]
    # Several results: each written into its own out tensor.
    code = kernels_by_overload(schemas, {"reduce": [("max.dim", "pjrt_max_dim", "")]})
    assert "write_out(std::get<1>(computed), max_values);" in code["max.dim_max"]
    assert "return ::std::tuple<at::Tensor &,at::Tensor &>(max, max_values);" in code["max.dim_max"]


def test_an_expression_row_names_the_schemas_arguments(schemas):
    rows = {"padding": [("reflection_pad2d", "pad(PadMode::Reflect, 2, self, ints(padding))", "")]}
    code = kernels_by_overload(schemas, rows)
    assert "return write_out(pad(PadMode::Reflect, 2, self, ints(padding)), out);" in code["reflection_pad2d.out"]


def test_options_shape_the_forms(schemas):
    # `real`: a complex self runs each form, as called, on the CPU.
    code = kernels_by_overload(schemas, {"elementwise": [("sinh", "pjrt_sinh", "real")]})
    assert "run_on_cpu<at::_ops::sinh_out>(self, out)" in code["sinh.out"]
    assert "run_on_cpu<at::_ops::sinh_>(self)" in code["sinh_"]
    # `only`, and a view (its result aliases its input): no derived form.
    assert set(kernels_by_overload(schemas, {"activation": [("hardtanh", "pjrt_hardtanh", "only")]})) == {"hardtanh"}
    assert set(kernels_by_overload(schemas, {"backend": [("as_strided", "pjrt_as_strided", "")]})) == {"as_strided"}
    # A row naming a form itself replaces the derived one.
    rows = {"indexing": [("index_add", "pjrt_index_add", ""), ("index_add_", "pjrt_index_add_", "")]}
    assert "return pjrt_index_add_(self, dim, index, source, alpha);" in kernels_by_overload(schemas, rows)["index_add_"]
    # `autograd` registers the row's own overload above autograd, not its out= form.
    families = gen_kernels.hand_written_kernels(
        schemas, {"resample": [("grid_sampler_2d", "pjrt_grid_sampler_2d", "autograd")]}, set())
    include = gen_kernels.hand_written_include("resample", families["resample"])
    above = include.split("AutogradPrivateUse1", 1)[1]
    assert '"grid_sampler_2d"' in above and "grid_sampler_2d.out" not in above


@pytest.mark.parametrize(
    "rows, message",
    [
        ({"a": [("mish_backward", "f", "")]}, "is CompositeImplicitAutograd"),
        ({"a": [("add.Tensor", "f", "")]}, "has an engine row and a hand-written row"),
        ({"a": [("hardtanh", "f", "")], "b": [("hardtanh", "g", "")]}, "has two hand-written rows"),
        ({"a": [("hardtanh", "f", "fast")]}, "unknown option"),
        ({"a": [("no_such_op", "f", "")]}, "does not exist in this PyTorch"),
    ],
)
def test_bad_rows_are_refused(schemas, rows, message):
    with pytest.raises(SystemExit, match=message):
        gen_kernels.hand_written_kernels(schemas, rows, engine_overloads(schemas))
