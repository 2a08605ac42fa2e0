"""Manifest YAML: ExecuTorch's formats load; bad input gets ManifestError with file:line."""

import textwrap

import pytest

from opforge.errors import ManifestError
from opforge.manifest import load_manifest, native_kernel_name, parse_manifest

EXECUTORCH_CUSTOM_OPS = """\
# important to keep the namespace
- func: my_ops::mul3.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)
  kernels:
    - arg_meta: null
      kernel_name: custom::mul3_out_impl # sub-namespace native:: is auto-added

- func: my_ops::mul4.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)
  kernels:
    - arg_meta: null
      kernel_name: custom::mul4_out_impl
"""


def test_executorch_custom_ops_yaml():
    defs = parse_manifest(EXECUTORCH_CUSTOM_OPS, "custom_ops.yaml")
    assert [d.name for d in defs] == ["my_ops::mul3", "my_ops::mul4"]
    mul3 = defs[0]
    assert str(mul3.functional) == "my_ops::mul3(Tensor input) -> Tensor"
    assert str(mul3.out) == "my_ops::mul3.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)"
    assert mul3.out_key == "my_ops::mul3.out"
    assert [k.cpp_name for k in mul3.kernels] == ["custom::native::mul3_out_impl"]
    assert mul3.kernels[0].arg_meta is None and mul3.fallback_kernel is mul3.kernels[0]
    assert mul3.source == "custom_ops.yaml:2" and defs[1].source == "custom_ops.yaml:7"


def test_functional_func_gets_a_derived_out_variant():
    (d,) = parse_manifest("- func: my_ops::f(Tensor x, int[] dims, Scalar s=1) -> (Tensor, Tensor)\n")
    assert str(d.out) == ("my_ops::f.out(Tensor x, int[] dims, Scalar s=1, *, Tensor(a!) out0, "
                          "Tensor(b!) out1) -> (Tensor(a!), Tensor(b!))")


def test_native_namespace_rule():
    assert native_kernel_name("custom::mul3_out_impl") == "custom::native::mul3_out_impl"
    assert native_kernel_name("torch::executor::add_out") == "torch::executor::native::add_out"
    assert native_kernel_name("mul3_out_impl") == "native::mul3_out_impl"
    assert native_kernel_name("custom::native::f") == "custom::native::f"


FUNCTIONS_YAML = """\
- op: add.out
  type_alias:
    T0: [Double, Float]
  dim_order_alias:
    D0: [[0, 1, 2, 3], [0, 2, 3, 1]]
  kernels:
    - arg_meta:
        self: [T0, D0]
        other: [T0, D0]
        out: [T0, D0]
      kernel_name: torch::executor::add_out_float
    - arg_meta: null
      kernel_name: torch::executor::add_out

- op: native_layer_norm.out
  kernels:
    - arg_meta: null
      kernel_name: torch::executor::native_layer_norm_out

- op: full_like.out
  dispatch: {}
  cpp_no_default_args: ['min']
  kernels:
    - arg_meta: null
      kernel_name: torch::executor::full_like_out

- func: mul.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)
  variants: function
  dispatch:
    CPU: torch::executor::mul_out
"""


def test_executorch_functions_yaml_with_aliases_and_legacy_dispatch():
    pytest.importorskip("torchgen", reason="op: lookups read torch's native_functions.yaml")
    add, ln, full_like, mul = parse_manifest(FUNCTIONS_YAML, "functions.yaml")
    assert add.is_aten and str(add.functional.name) == "aten::add.Tensor"
    assert str(add.out.name) == "aten::add.out"
    # 2 dtypes x 2 dim orders = 4 concrete kernels, plus the fallback.
    keys = [k.dtype_key for k in add.kernels]
    assert keys == ["v1/7;0,1,2,3|7;0,1,2,3|7;0,1,2,3", "v1/7;0,2,3,1|7;0,2,3,1|7;0,2,3,1",
                    "v1/6;0,1,2,3|6;0,1,2,3|6;0,1,2,3", "v1/6;0,2,3,1|6;0,2,3,1|6;0,2,3,1",
                    "default"]
    assert [a for a, _ in add.kernels[0].arg_meta] == ["self", "other", "out"]
    assert [a.name for a in ln.out.arguments.out] == ["out0", "out1", "out2"]
    assert full_like.kernels[0].cpp_name == "torch::executor::native::full_like_out"
    assert ("cpp_no_default_args", ["min"]) in full_like.extra
    assert str(mul.functional.name) == "aten::mul.Tensor"
    assert mul.kernels[0].cpp_name == "torch::executor::native::mul_out"


def _error(text, filename="ops.yaml"):
    with pytest.raises(ManifestError) as info:
        parse_manifest(textwrap.dedent(text), filename)
    return str(info.value)


def test_func_without_namespace_for_a_custom_op():
    msg = _error("""\
        - func: mul3(Tensor input) -> Tensor
        """)
    assert "ops.yaml:1" in msg and "no namespace" in msg and "my_ops::mul3" in msg


def test_op_naming_an_unknown_aten_op():
    pytest.importorskip("torchgen")
    msg = _error("""\
        - func: my_ops::a(Tensor x) -> Tensor
        - op: addd.out
          kernels:
            - arg_meta: null
              kernel_name: custom::add_out
        """)
    assert "ops.yaml:2" in msg and "'addd.out' is not an ATen operator" in msg
    assert "add.out" in msg  # the near name


@pytest.mark.parametrize("name", ["custom::3mul", "custom:mul3", "custom::mul-3", "class::f", ""])
def test_kernel_name_that_is_not_a_cpp_qualified_name(name):
    msg = _error(f"""\
        - func: my_ops::mul3(Tensor input) -> Tensor
          kernels:
            - arg_meta: null
              kernel_name: "{name}"
        """)
    assert "ops.yaml:2" in msg and "kernel" in msg and "custom::mul3_out_impl" in msg


def test_both_func_and_op():
    msg = _error("""\
        - func: my_ops::mul3(Tensor input) -> Tensor
          op: add.out
        """)
    assert "ops.yaml:1" in msg and "exactly one of 'func:'" in msg and "both" in msg


def test_unknown_key_with_suggestion():
    msg = _error("""\
        - func: my_ops::mul3(Tensor input) -> Tensor
          kernal:
            - arg_meta: null
              kernel_name: custom::f
        """)
    assert "ops.yaml:2" in msg and "unknown key 'kernal'" in msg and "did you mean 'kernels'" in msg


def test_tab_indented_file():
    msg = _error("- func: my_ops::mul3(Tensor input) -> Tensor\n\tkernels: []\n")
    assert "ops.yaml:2" in msg and "tab" in msg and "spaces" in msg


def test_truncated_file():
    full = EXECUTORCH_CUSTOM_OPS
    cut = full[: full.index("kernel_name: custom::mul4")] + 'kernel_name: "custom::mul4_ou'
    msg = _error(cut)
    assert "ops.yaml:" in msg and ("truncated" in msg or "YAML syntax error" in msg)
    # A cut right after a key leaves an empty value: caught by validation, with its line.
    msg = _error(full[: full.index("    - arg_meta: null\n      kernel_name: custom::mul4")])
    assert "ops.yaml:8" in msg and "'kernels:' must be a non-empty list" in msg


def test_schema_error_inside_manifest_carries_line_and_caret():
    msg = _error("""\
        - func: my_ops::ok(Tensor x) -> Tensor
        - func: my_ops::bad(Tensor x -> Tensor
        """)
    assert "ops.yaml:2" in msg and "^" in msg


def test_out_variant_not_derivable():
    msg = _error("- func: my_ops::count(Tensor x) -> int\n")
    assert "ops.yaml:1" in msg and "return type 'int' cannot be an out argument" in msg


def test_duplicate_operator_and_duplicate_key():
    msg = _error("- func: my_ops::a(Tensor x) -> Tensor\n- func: my_ops::a.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)\n")
    assert "defined twice" in msg and "ops.yaml:1" in msg
    msg = _error("- func: my_ops::a(Tensor x) -> Tensor\n  doc: a\n  doc: b\n")
    assert "ops.yaml:3" in msg and "duplicate key 'doc'" in msg


def test_bad_python_reference_and_not_a_list(tmp_path):
    msg = _error("- func: my_ops::a(Tensor x) -> Tensor\n  python: not a ref\n")
    assert "ops.yaml:2" in msg and "module:function" in msg
    msg = _error("func: my_ops::a(Tensor x) -> Tensor\n")
    assert "YAML list of entries" in msg


def test_load_manifest_missing_file(tmp_path):
    with pytest.raises(ManifestError, match="no such file"):
        load_manifest(tmp_path / "nope.yaml")
