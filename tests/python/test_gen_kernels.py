"""The kernel generator's recipes against the engine ops' typed param layouts.

`python/torch_pjrt/csrc/param_layouts.json` is written from the op catalogue by
`ops/tests/param_layouts.rs`; the generator places every param a recipe names where the op's
layout puts it, and refuses a recipe that disagrees with the layout."""

import os
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
