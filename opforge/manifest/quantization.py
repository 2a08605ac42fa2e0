"""A custom operator's quantization contract: how ``opforge.quantize`` treats the op.

Written once, in the op's manifest entry (key ``quantization:``) or ``@opforge.op(...,
quantization=...)``, and checked against the op's functional schema when the manifest is
read. Forms (docs/manifest.md has the full reference):

* ``float`` — the op stays in floating point (its inputs are dequantized before it).
* ``passthrough`` — every tensor input is quantized; every output shares the qparams of
  the first tensor input (ops that select, move or reorder values: min/max, gather...).
* ``integer`` — ``passthrough``, and the op's kernel runs on the integer tensors
  themselves (no dequantize before it, no quantize after it): exact for ops that only
  select or move values, since dequantization is increasing. Its kernels must accept the
  scheme's integer dtypes (uint8, int8, int32).
* a mapping ``{inputs: {NAME: RULE}, outputs: {NAME_OR_INDEX: RULE}}``:

  - input rules: ``quantized`` (own observer), ``float``, ``{shared: OTHER_INPUT}``;
  - output rules: ``quantized``, ``float``, ``{shared: INPUT}``,
    ``{fixed: {min: LO, max: HI}}`` (a fixed real range, e.g. ``[0, 1]`` for a sigmoid;
    the scheme's bit width turns it into a scale and zero point).

  Inputs left out of ``inputs`` are quantized when they are tensors; outputs left out of
  ``outputs`` are quantized.

Pure Python (no torch): the quantizer in ``opforge.quantize.contracts`` turns a contract
into torchao annotations.

>>> from opforge.schema import FunctionSchema
>>> s = FunctionSchema.parse("my_ops::minmax(Tensor input, int dim) -> (Tensor min, Tensor max)")
>>> QuantContract.parse("passthrough", s).outputs
(('min', SharedRule('input')), ('max', SharedRule('input')))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from opforge.errors import ManifestError
from opforge.schema import FunctionSchema
from opforge.schema.model import base_of, is_tensor_like

__all__ = ["QuantContract", "SharedRule", "FixedRule", "Rule"]


@dataclass(frozen=True)
class SharedRule:
    """Same scale and zero point as the tensor input ``input``."""

    input: str


@dataclass(frozen=True)
class FixedRule:
    """A fixed real range ``[min, max]`` mapped onto the scheme's integer range."""

    min: float
    max: float

    def __post_init__(self) -> None:
        if not self.min < self.max or not self.min <= 0.0 <= self.max:
            raise ManifestError(
                f"`quantization: fixed`: range [{self.min}, {self.max}] — valid: min < max "
                "and 0 inside the range (zero must be exactly representable) — fix the range"
            )


Rule = Union[str, SharedRule, FixedRule]  # str: "quantized" | "float"


def _tensor_inputs(schema: FunctionSchema) -> list[str]:
    return [a.name for a in schema.arguments.flat
            if is_tensor_like(a.type) and str(base_of(a.type)) == "Tensor"
            and type(a.type).__name__ != "ListType"]


def _output_names(schema: FunctionSchema) -> list[str]:
    return [r.name or str(i) for i, r in enumerate(schema.returns)]


@dataclass(frozen=True)
class QuantContract:
    """The parsed contract: a rule per tensor input and per output, in schema order."""

    kind: str  # "float" | "passthrough" | "integer" | "explicit"
    inputs: tuple[tuple[str, Rule], ...]
    outputs: tuple[tuple[str, Rule], ...]

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def on_integers(self) -> bool:
        """The op's kernel runs on the quantized integers (kind ``integer``)."""
        return self.kind == "integer"

    def describe(self) -> str:
        if self.kind != "explicit":
            return self.kind
        def rule(r: Rule) -> str:
            if isinstance(r, SharedRule):
                return f"shared:{r.input}"
            if isinstance(r, FixedRule):
                return f"fixed:[{r.min:g},{r.max:g}]"
            return r
        ins = ",".join(f"{n}={rule(r)}" for n, r in self.inputs)
        outs = ",".join(f"{n}={rule(r)}" for n, r in self.outputs)
        return f"in({ins}) out({outs})"

    @classmethod
    def parse(cls, raw: Any, schema: FunctionSchema, where: str = "quantization") -> "QuantContract":
        """Check ``raw`` (YAML data or a ready contract) against ``schema``."""
        if isinstance(raw, QuantContract):
            return raw
        op = str(schema.name)
        tensors, outs = _tensor_inputs(schema), _output_names(schema)

        def fail(found: str, valid: str, fix: str) -> ManifestError:
            return ManifestError(f"`{where}` of {op}: {found} — valid: {valid} — fix: {fix}")

        if raw == "float":
            return cls("float", tuple((n, "float") for n in tensors), tuple((n, "float") for n in outs))
        if raw in ("passthrough", "integer"):
            if not tensors:
                raise fail(f"{raw!r} but the op has no tensor input", "an op with a tensor input",
                           "use 'float' or an explicit mapping")
            first = tensors[0]
            inputs = [(n, "quantized" if n == first or raw == "passthrough" else SharedRule(first))
                      for n in tensors]
            return cls(raw, tuple(inputs), tuple((n, SharedRule(first)) for n in outs))
        if not isinstance(raw, dict):
            raise fail(f"{raw!r}", "'float', 'passthrough', 'integer' or a mapping with 'inputs'/'outputs'",
                       "write e.g. {inputs: {input: quantized}, outputs: {0: {shared: input}}}")
        unknown = sorted(str(k) for k in raw if k not in ("inputs", "outputs"))
        if unknown:
            raise fail(f"unknown key {unknown[0]!r}", "inputs, outputs", "remove or rename it")
        in_raw, out_raw = raw.get("inputs") or {}, raw.get("outputs") or {}
        if not isinstance(in_raw, dict) or not isinstance(out_raw, dict):
            raise fail("'inputs'/'outputs' is not a mapping", "NAME: RULE mappings",
                       "write e.g. inputs: {input: quantized}")
        inputs: dict[str, Rule] = {n: "quantized" for n in tensors}
        for name, rule in in_raw.items():
            if name not in tensors:
                raise fail(f"input {name!r} is not a tensor input of the op",
                           ", ".join(tensors) or "(no tensor inputs)",
                           "name one of the schema's tensor arguments")
            inputs[name] = cls._rule(rule, tensors, fail, output=False, name=name)
        outputs: dict[str, Rule] = {n: "quantized" for n in outs}
        for key, rule in out_raw.items():
            name = outs[key] if isinstance(key, int) and 0 <= key < len(outs) else key
            if name not in outs:
                raise fail(f"output {key!r} is not an output of the op",
                           ", ".join(outs) + f" (or an index 0..{len(outs) - 1})",
                           "name a return of the schema (returns are named like 'Tensor min')")
            outputs[name] = cls._rule(rule, tensors, fail, output=True, name=name)
        for name, rule in [*inputs.items(), *outputs.items()]:
            if isinstance(rule, SharedRule) and inputs.get(rule.input) != "quantized":
                raise fail(f"{name!r} shares the qparams of {rule.input!r}, which is not a quantized input",
                           "a tensor input whose own rule is 'quantized'",
                           f"make {rule.input!r} quantized or share another input")
        return cls("explicit", tuple(inputs.items()), tuple(outputs.items()))

    @staticmethod
    def _rule(rule: Any, tensors: list[str], fail, *, output: bool, name: str) -> Rule:
        if rule in ("quantized", "float"):
            return rule
        if isinstance(rule, dict) and len(rule) == 1:
            (key, value), = rule.items()
            if key == "shared":
                if value not in tensors:
                    raise fail(f"{name!r}: shared with {value!r}, which is not a tensor input",
                               ", ".join(tensors), "name a tensor input of the schema")
                if value == name:
                    raise fail(f"{name!r} shares with itself", "another input", "use 'quantized'")
                return SharedRule(value)
            if key == "fixed" and output:
                if not isinstance(value, dict) or set(value) != {"min", "max"}:
                    raise fail(f"{name!r}: fixed {value!r}", "{fixed: {min: LO, max: HI}}",
                               "give the real range the output always lies in")
                return FixedRule(float(value["min"]), float(value["max"]))
        kinds = "quantized, float, {shared: INPUT}" + (", {fixed: {min, max}}" if output else "")
        raise fail(f"{name!r}: rule {rule!r}", kinds, "use one of these rules")
