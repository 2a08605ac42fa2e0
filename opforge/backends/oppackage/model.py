"""The op-package description as data: Qualcomm's OpDef model, as frozen dataclasses.

An ``OpPackage`` is one ``OpDefCollection`` (from XML, ``xml_reader``, or from the YAML
manifest, ``yaml_reader``): its identity, its ``OpDefinition``s and, per backend, the
supplemental definitions that override parts of an op for that backend. ``for_backend``
folds a backend's supplements into the ops it lists: that is the op a backend checks nodes
against.

Field names follow the XML elements (``Mandatory`` → ``mandatory``, ``IsStaticTensor`` →
``is_static_tensor``); every object keeps ``line``, the line of its element in its source,
so a later check can still say ``file:line``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["DATATYPES", "RANKS", "LAYOUTS", "CONSTRAINT_TYPES", "Constraint", "TensorDef",
           "OpDefinition", "Supplement", "OpPackage", "rank_number", "datatype_matches_dtype"]

# QNN_DATATYPE_* names; BACKEND_SPECIFIC accepts any
DATATYPES = (
    "QNN_DATATYPE_INT_8", "QNN_DATATYPE_INT_16", "QNN_DATATYPE_INT_32", "QNN_DATATYPE_INT_64",
    "QNN_DATATYPE_UINT_8", "QNN_DATATYPE_UINT_16", "QNN_DATATYPE_UINT_32", "QNN_DATATYPE_UINT_64",
    "QNN_DATATYPE_FLOAT_16", "QNN_DATATYPE_FLOAT_32", "QNN_DATATYPE_FLOAT_64",
    "QNN_DATATYPE_SFIXED_POINT_4", "QNN_DATATYPE_SFIXED_POINT_8", "QNN_DATATYPE_SFIXED_POINT_16",
    "QNN_DATATYPE_SFIXED_POINT_32", "QNN_DATATYPE_UFIXED_POINT_4", "QNN_DATATYPE_UFIXED_POINT_8",
    "QNN_DATATYPE_UFIXED_POINT_16", "QNN_DATATYPE_UFIXED_POINT_32", "QNN_DATATYPE_BOOL_8",
    "QNN_DATATYPE_STRING", "BACKEND_SPECIFIC",
)
# Package and op type names become C identifiers, file names (src/ops/<Op>.cpp,
# libQnn<Package>.so) and symbols: a name the file system cannot hold (255 bytes) must be
# refused where it is read, not by an OSError from the skeleton writer.
C_NAME_MAX = 128


def is_c_name(name: str) -> bool:
    """A C identifier of at most ``C_NAME_MAX`` characters."""
    return len(name) <= C_NAME_MAX and name.isidentifier() and name.isascii()


RANKS = ("SCALAR", "1D", "2D", "3D", "4D", "5D", "ND")
LAYOUTS = ("NHWC", "NHCW", "UNDEFINED", "BACKEND_SPECIFIC")
CONSTRAINT_TYPES = ("Number", "Shape", "Value", "Datatype", "Description")

# opforge dtype name (torch's) -> the QNN datatypes a tensor of it may be declared as
_DTYPE_TO_QNN = {
    "float32": ("QNN_DATATYPE_FLOAT_32",),
    "float16": ("QNN_DATATYPE_FLOAT_16",),
    "float64": ("QNN_DATATYPE_FLOAT_64",),
    "int8": ("QNN_DATATYPE_INT_8", "QNN_DATATYPE_SFIXED_POINT_8", "QNN_DATATYPE_SFIXED_POINT_4"),
    "uint8": ("QNN_DATATYPE_UINT_8", "QNN_DATATYPE_UFIXED_POINT_8", "QNN_DATATYPE_UFIXED_POINT_4"),
    "int16": ("QNN_DATATYPE_INT_16", "QNN_DATATYPE_SFIXED_POINT_16"),
    "uint16": ("QNN_DATATYPE_UINT_16", "QNN_DATATYPE_UFIXED_POINT_16"),
    "int32": ("QNN_DATATYPE_INT_32", "QNN_DATATYPE_SFIXED_POINT_32"),
    "uint32": ("QNN_DATATYPE_UINT_32", "QNN_DATATYPE_UFIXED_POINT_32"),
    "int64": ("QNN_DATATYPE_INT_64",),
    "uint64": ("QNN_DATATYPE_UINT_64",),
    "bool": ("QNN_DATATYPE_BOOL_8",),
}


def datatype_matches_dtype(datatypes: tuple[str, ...], dtype: str) -> bool:
    """Whether a tensor of torch dtype ``dtype`` ("float32") fits one of ``datatypes``."""
    if "BACKEND_SPECIFIC" in datatypes or not datatypes:
        return True
    return any(d in datatypes for d in _DTYPE_TO_QNN.get(dtype, ()))


def rank_number(rank: str) -> int | None:
    """``"SCALAR"`` → 0, ``"3D"`` → 3, ``"ND"`` → None (any)."""
    if rank == "SCALAR":
        return 0
    return None if rank == "ND" else int(rank[:-1])


@dataclass(frozen=True)
class Constraint:
    """``<Constraint id=".." Type="Number|Shape|Value|Datatype|Description">text</Constraint>``."""

    type: str
    text: str
    id: str = ""

    def __post_init__(self) -> None:
        if self.type not in CONSTRAINT_TYPES:
            raise ValueError(f"Constraint.type {self.type!r} not in {CONSTRAINT_TYPES}")


@dataclass(frozen=True)
class TensorDef:
    """One ``<Input>``, ``<Output>`` or ``<Parameter>`` (``role``)."""

    role: str  # "input" | "output" | "parameter"
    name: str
    description: str = ""
    mandatory: bool = True
    datatypes: tuple[str, ...] = ()
    rank: str = "ND"
    layout: str = "UNDEFINED"
    shape_text: str = ""
    default: str | None = None
    enumeration: tuple[str, ...] = ()
    repeated: bool = False
    is_static_tensor: bool = False
    constraints: tuple[Constraint, ...] = ()
    line: int = 0

    def __post_init__(self) -> None:
        if self.role not in ("input", "output", "parameter"):
            raise ValueError(f"TensorDef.role {self.role!r}")
        bad = [d for d in self.datatypes if d not in DATATYPES]
        if bad:
            raise ValueError(f"TensorDef {self.name!r}: datatypes {bad} not in DATATYPES")
        if self.rank not in RANKS or self.layout not in LAYOUTS:
            raise ValueError(f"TensorDef {self.name!r}: rank {self.rank!r} / layout {self.layout!r}")


@dataclass(frozen=True)
class OpDefinition:
    """One ``<OpDef>``: the op type ``name`` and its tensors and parameters, in order."""

    name: str
    description: str = ""
    references: tuple[tuple[str, str], ...] = ()  # (Source, Url)
    inputs: tuple[TensorDef, ...] = ()
    outputs: tuple[TensorDef, ...] = ()
    parameters: tuple[TensorDef, ...] = ()
    supported_backends: tuple[str, ...] = ()
    use_default_translation: bool = False
    only_default_supported: bool = False
    line: int = 0

    def __post_init__(self) -> None:
        for group in (self.inputs, self.outputs, self.parameters):
            names = [t.name for t in group]
            dup = next((n for n in names if names.count(n) > 1), None)
            if dup is not None:
                raise ValueError(f"OpDef {self.name!r}: {group[0].role} {dup!r} declared twice")

    def parameter(self, name: str) -> TensorDef | None:
        return next((p for p in self.parameters if p.name == name), None)


@dataclass(frozen=True)
class Supplement:
    """One ``<SupplementalOpDef>`` of a backend: the fields it gives replace the op's.

    ``tensors`` holds per-tensor overrides (role, name) → (datatypes, layout, shape_text,
    constraints), each None/empty when not given.
    """

    name: str
    constraints: tuple[Constraint, ...] = ()
    tensors: tuple[tuple[str, str, tuple[str, ...], str | None, str | None,
                         tuple[Constraint, ...]], ...] = ()
    only_default_supported: bool | None = None
    line: int = 0


@dataclass(frozen=True)
class OpPackage:
    """One ``<OpDefCollection>``: ``supplements`` maps a backend ("CPU") to the names of the
    ops it supports (``SupportedOps``) and its ``Supplement``s."""

    name: str
    domain: str = ""
    version: str = ""
    ops: tuple[OpDefinition, ...] = ()
    supplements: tuple[tuple[str, tuple[str, ...], tuple[Supplement, ...]], ...] = ()
    source: str = "<opdef>"

    def __post_init__(self) -> None:
        names = [op.name for op in self.ops]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ValueError(f"OpDefCollection {self.name!r}: OpDef {dup!r} declared twice")

    def op(self, name: str) -> OpDefinition | None:
        return next((op for op in self.ops if op.name == name), None)

    def for_backend(self, backend: str) -> "OpPackage":
        """The package as ``backend`` ("CPU") sees it: its supplements applied."""
        found = [s for s in self.supplements if s[0].upper() == backend.upper()]
        if not found:
            return self
        by_op = {s.name: s for entry in found for s in entry[2]}
        return replace(self, ops=tuple(_apply(op, by_op.get(op.name)) for op in self.ops))


def _apply(op: OpDefinition, sup: Supplement | None) -> OpDefinition:
    if sup is None:
        return op
    overrides = {(role, name): rest for role, name, *rest in sup.tensors}

    def fold(t: TensorDef) -> TensorDef:
        o = overrides.get((t.role, t.name))
        if o is None:
            return t
        datatypes, layout, text, constraints = o
        return replace(t, datatypes=datatypes or t.datatypes, layout=layout or t.layout,
                       shape_text=text if text is not None else t.shape_text,
                       constraints=constraints or t.constraints)

    return replace(op, inputs=tuple(map(fold, op.inputs)), outputs=tuple(map(fold, op.outputs)),
                   parameters=tuple(map(fold, op.parameters)),
                   only_default_supported=(sup.only_default_supported
                                           if sup.only_default_supported is not None
                                           else op.only_default_supported))
