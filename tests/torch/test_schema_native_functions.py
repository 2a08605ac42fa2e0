"""Every schema in the installed torch wheel's native_functions.yaml parses and round-trips,
and the derived out variants agree with the ones PyTorch registers."""

import pytest
import torch

from opforge.errors import SchemaError
from opforge.schema import FunctionSchema, SchemaKind, aten_schemas
from opforge.schema.native_functions import load_native_function_entries, native_functions_path
from opforge.schema.variants import check_exportable


def test_every_native_function_round_trips():
    path = native_functions_path()
    assert path is not None and "torchgen/packaged/ATen/native" in str(path)
    entries = load_native_function_entries(path)
    assert len(entries) > 2000
    for entry in entries:
        text = entry["func"]
        assert str(FunctionSchema.parse(text)) == text


@pytest.mark.parametrize(
    "functional",
    ["native_layer_norm", "_native_batch_norm_legit_no_training", "convolution", "_softmax",
     "add.Scalar", "embedding", "max_pool2d_with_indices", "native_dropout"],
)
def test_autogen_out_variants_match_torch(functional):
    out = aten_schemas()[functional].out_variant()
    ours = aten_schemas()[str(out.name)]
    theirs = getattr(getattr(torch.ops.aten, out.name.name), out.name.overload)._schema
    assert str(theirs) == f"aten::{ours}"


@pytest.mark.parametrize(
    "functional, out",
    [("add.Tensor", "add.out"), ("sum.dim_IntList", "sum.IntList_out"),
     ("var.correction", "var.correction_out"), ("where.self", "where.self_out"),
     ("arange.start_step", "arange.start_out"), ("_to_copy", "_to_copy.out"),
     ("unbind_copy.int", "unbind_copy.int_out")],
)
def test_signature_finds_atens_irregular_out_names(functional, out):
    table = aten_schemas()
    matches = [k for k, s in table.items()
               if s.kind() is SchemaKind.out and s.signature() == table[functional].signature()]
    assert matches == [out]


def test_add_inplace_refused_with_atens_out_name():
    with pytest.raises(SchemaError) as info:
        check_exportable(aten_schemas()["add_.Tensor"])
    assert "`aten::add.out`" in str(info.value)
