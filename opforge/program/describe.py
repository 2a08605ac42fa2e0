"""A JSON-able summary of a program, for ``opforge inspect`` and for humans."""

from __future__ import annotations

from collections import Counter

from opforge.program.encode import format_version_of
from opforge.program.model import DelegateCall, Free, KernelCall, Method, Move, Program
from opforge.program.symbolic import growing_values
from opforge.program.values import (
    ArenaStorage, ConstantStorage, NoneValue, OptionalTensorListValue, ScalarTypeValue,
    TensorListValue, TensorValue,
)

__all__ = ["describe", "data_sizes"]


def describe(program: Program) -> dict:
    """Summarize ``program``: methods (values, instructions, operator table with call counts,
    memory plan, constants), segments, delegates and user metadata. Only str/int/list/dict.

    >>> from opforge.program import Program, Method, IntValue
    >>> d = describe(Program(methods=(Method("forward", (IntValue(3),), (0,), (0,), ()),)))
    >>> d["methods"][0]["values"]
    ['%0: int 3']
    """
    named = {n.segment for n in program.named_data}
    return {
        "format_version": format_version_of(program),
        "methods": [_method(program, m) for m in program.methods],
        "segments": [{"index": i, "nbytes": s.nbytes} for i, s in enumerate(program.segments)],
        "delegates": [
            {"index": i, "id": d.id, "segment": d.segment,
             "compile_specs": {key: len(value) for key, value in d.compile_specs}}
            for i, d in enumerate(program.delegates)
        ],
        "named_data": [{"key": n.key, "segment": n.segment} for n in program.named_data],
        "user_metadata": dict(program.user_metadata),
        "constant_bytes": sum(s.nbytes for i, s in enumerate(program.segments)
                              if i not in {d.segment for d in program.delegates} | named),
        "delegate_bytes": sum(program.segments[d.segment].nbytes for d in program.delegates
                              if 0 <= d.segment < len(program.segments)),
        "named_bytes": sum(program.segments[i].nbytes for i in named
                           if 0 <= i < len(program.segments)),
    }


def data_sizes(described: dict) -> str:
    """What a program's data segments hold, from :func:`describe`'s summary: constants
    (the methods' own), named data (shared by delegates) and delegate blobs — one text for
    ``opforge inspect`` and ``opforge quantize``, so that the two never disagree.

    >>> data_sizes({"constant_bytes": 0, "named_bytes": 4096, "named_data": [{}, {}],
    ...             "delegate_bytes": 7208, "delegates": [{}]})
    'constants 0 bytes, named data 4,096 bytes in 2 segment(s) shared by the delegates, 1 delegate blob(s) 7,208 bytes'
    """
    text = f"constants {described['constant_bytes']:,} bytes"
    if described.get("named_data"):
        text += (f", named data {described['named_bytes']:,} bytes in "
                 f"{len(described['named_data'])} segment(s) shared by the delegates")
    if described.get("delegates"):
        text += (f", {len(described['delegates'])} delegate blob(s) "
                 f"{described['delegate_bytes']:,} bytes")
    return text

def _method(program: Program, method: Method) -> dict:
    calls = Counter(i.op for i in method.instructions if type(i) is KernelCall)
    constants = [
        {"value": i, "dtype": v.dtype.name.lower(), "sizes": list(v.sizes),
         "segment": v.storage.segment, "offset": v.storage.offset, "nbytes": v.stored_nbytes,
         **({"packing": "int4"} if v.storage.packing else {})}
        for i, v in enumerate(method.values)
        if type(v) is TensorValue and type(v.storage) is ConstantStorage
    ]
    symbolic = {sv.value: sv.exprs for sv in method.symbolic_values}
    extra = {}
    if method.symbols or method.state:
        extra["dynamic"] = {
            "symbols": [{"name": s.name, "min": s.min, "max": s.max, "grow": s.grow}
                        for s in method.symbols],
            "growing_values": sorted(growing_values(method)),
            "guards": [str(g) for g in method.guards],
            "planned_at": "upper bound" if method.symbols else "static sizes",
        }
        produced = _produced(method)
        if produced:  # data-dependent sizes: which instruction binds each
            extra["dynamic"]["produced"] = produced
        extra["state"] = [{"name": slot.name, "value": slot.value} for slot in method.state]
    return {
        "name": method.name,
        "inputs": list(method.inputs),
        "outputs": list(method.outputs),
        "values": [f"%{i}: {_value_text(v)}" + (
            f" sizes=({', '.join(str(e) for e in symbolic[i])})" if i in symbolic else "")
            for i, v in enumerate(method.values)],
        **extra,
        "operators": [{"index": i, "key": op.key, "calls": calls.get(i, 0)}
                      for i, op in enumerate(method.operators)],
        "instructions": [_instruction(program, method, ins) for ins in method.instructions],
        "memory_plan": {"arena_sizes": list(method.memory_plan.arena_sizes),
                        "total_bytes": sum(method.memory_plan.arena_sizes)},
        "constants": constants,
    }


def _value_text(value) -> str:
    if type(value) is TensorValue:
        text = f"{value.dtype.name.lower()}{list(value.sizes)}"
        if value.dim_order != tuple(range(len(value.sizes))):
            text += f" dim_order={list(value.dim_order)}"
        storage = value.storage
        if type(storage) is ArenaStorage:
            return f"{text} arena {storage.mem_id} @ {storage.offset}"
        if type(storage) is ConstantStorage:
            packed = " int4-packed" if storage.packing else ""
            return f"{text} constant{packed} segment {storage.segment} @ {storage.offset}"
        return f"{text} unplanned"
    if type(value) in (TensorListValue, OptionalTensorListValue):
        items = ", ".join("None" if i is None else f"%{i}" for i in value.items)
        return f"tensor list [{items}]"
    if type(value) is ScalarTypeValue:
        return f"dtype {value.dtype.name.lower()}"
    if type(value) is NoneValue:
        return "none"
    field = value.values if hasattr(value, "values") else value.value
    kind = type(value).__name__.removesuffix("Value").replace("List", " list").lower()
    return f"{kind} {list(field) if isinstance(field, tuple) else repr(field)}"


def _instruction(program: Program, method: Method, ins) -> dict:
    kind = type(ins)
    if kind is KernelCall:
        key = method.operators[ins.op].key if 0 <= ins.op < len(method.operators) else "?"
        args = ", ".join(f"%{a}" for a in ins.args)
        return {"kind": "kernel", "op": key, "args": list(ins.args), "text": f"{key}({args})"}
    if kind is DelegateCall:
        blob = program.delegates[ins.delegate].id if 0 <= ins.delegate < len(
            program.delegates) else "?"
        args = ", ".join(f"%{a}" for a in ins.args)
        return {"kind": "delegate", "delegate": ins.delegate, "args": list(ins.args),
                "text": f"delegate {ins.delegate} ({blob})({args})"}
    if kind is Move:
        return {"kind": "move", "src": ins.src, "dst": ins.dst,
                "text": f"move %{ins.src} -> %{ins.dst}"}
    assert kind is Free, kind
    return {"kind": "free", "value": ins.value, "text": f"free %{ins.value}"}


def _produced(method) -> list[dict]:
    """The data-dependent symbols and where each is produced (``program/produced.py``)."""
    from opforge.program.symbolic import binding_plan
    from opforge.program.produced import producers

    bound = {step.symbol for step in binding_plan(method) if step.symbol is not None}
    unbound = [s.name for s in method.symbols if s.name not in bound]
    return [{"symbol": p.symbol, "instruction": p.instruction, "value": p.value,
             "from": "element" if p.dim < 0 else f"dimension {p.dim}"}
            for p in (producers(method, unbound) if unbound else ())]
