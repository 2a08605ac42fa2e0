"""The ATen function-schema model and parser (no torch needed).

>>> from opforge.schema import FunctionSchema
>>> s = FunctionSchema.parse("my_ops::mul3(Tensor input) -> Tensor")
>>> str(s.out_variant())
'my_ops::mul3.out(Tensor input, *, Tensor(a!) out) -> Tensor(a!)'
>>> s.out_variant().functional_variant() == s
True
"""

from opforge.schema.model import (
    Annotation,
    Argument,
    Arguments,
    BaseType,
    FunctionSchema,
    ListType,
    OperatorName,
    OptionalType,
    Return,
    SchemaKind,
    Type,
    base_of,
)
from opforge.schema.model import is_tensor_like as is_tensor_like_type
from opforge.schema.native_functions import aten_schemas, lookup_aten
from opforge.schema.parser import parse_schema, parse_type
from opforge.schema.variants import check_exportable, functional_variant, out_variant, signature

__all__ = [
    "Annotation",
    "Argument",
    "Arguments",
    "BaseType",
    "FunctionSchema",
    "ListType",
    "OperatorName",
    "OptionalType",
    "Return",
    "SchemaKind",
    "Type",
    "aten_schemas",
    "base_of",
    "is_tensor_like_type",
    "check_exportable",
    "functional_variant",
    "lookup_aten",
    "out_variant",
    "parse_schema",
    "parse_type",
    "signature",
]
