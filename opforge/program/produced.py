"""Data-dependent sizes: symbols whose values an instruction produces at run time.

# Design
#
# ``torch.export`` gives a size that depends on a tensor's *values* (``nonzero``,
# ``masked_select``, ``int(n.item())`` used as a size) an *unbacked* symbol (``u0``). A
# program keeps such a symbol like any other (``Symbol`` with its inclusive range; memory is
# planned at its ``max``), with no new table: a symbol that no input dimension determines
# (``binding_plan``) is *produced*, and the first instruction that can produce it binds it
# during the call:
#
# - a ``KernelCall`` one of whose arguments is a symbolic tensor with a dimension whose
#   expression is exactly the symbol (``nonzero.out``'s ``out`` of sizes ``(u0, 2)``): the
#   kernel gets that tensor at its upper bound (its whole slot), writes its result densely at
#   its actual sizes from the slot's start, and reports those sizes (the portable kernels
#   return the result's view; ATen's out overloads return the resized out; the native
#   kernels set the out's leading size); the symbol is the reported size of that dimension
#   (a kernel that reports nothing wrote its whole slot: the size at the bound);
# - a ``Move`` from a one-element integer tensor into an ``IntValue`` whose expression is
#   exactly the symbol (``item()`` used as a size): the symbol is the element's value.
#
# Every instruction before a producer reads no value whose sizes read the symbol (except
# the producing tensor itself, at the producer); every guard over it is checked once it is
# bound. A runtime checks each produced value against the symbol's range and refuses the
# call naming the symbol, the value and the bound (a bound comes from the graph's value
# ranges or the user's ``torch._check``). A symbol that grows (``Symbol.grow``) is never
# produced. Readers older than this rule refuse such a file ("bound by no input dimension");
# its layout is unchanged, so the format version is too.
"""

from __future__ import annotations

from dataclasses import dataclass

from opforge.program._errors import program_error

__all__ = ["Producer", "producers", "symbols_read"]

_INTEGER_DTYPES = frozenset({0, 1, 2, 3, 4, 27, 28, 29})  # uint8..int64, uint16..uint64
_CORRUPT = "the file is corrupt; re-export it"


@dataclass(frozen=True, slots=True)
class Producer:
    """``symbol`` is bound after ``instruction`` runs: from dimension ``dim`` of tensor
    ``value`` (a kernel call's result), or, with ``dim == -1``, from the element of tensor
    ``value`` (the source of a ``Move``)."""

    symbol: str
    instruction: int
    value: int
    dim: int


def symbols_read(method) -> dict[int, frozenset[str]]:
    """Value index → the symbols its size expressions read (symbolic values only)."""
    return {sv.value: frozenset().union(*(e.symbols() for e in sv.exprs))
            for sv in method.symbolic_values}


def producers(method, unbound: list[str]) -> tuple[Producer, ...]:
    """How each of the ``unbound`` symbols (no input dimension determines them) is produced,
    in instruction order; ProgramError naming the first symbol that no instruction produces,
    or an instruction that reads a symbol before it is produced."""
    from opforge.program.values import IntValue, TensorValue  # (values imports symbolic)
    from opforge.program.model import KernelCall, Move

    where = f"method {method.name!r}"
    pending = set(unbound)
    grow = {s.name for s in method.symbols if s.grow}
    if pending & grow:
        raise program_error(f"{where} symbols", f"{sorted(pending & grow)} growing and bound by "
                            "no input dimension", "a growing symbol is an input dimension",
                            _CORRUPT)
    exprs = {sv.value: sv.exprs for sv in method.symbolic_values}
    reads = symbols_read(method)
    for position, index in enumerate(method.inputs):  # an input's sizes are the caller's
        if reads.get(index, frozenset()) & pending:
            raise program_error(
                f"{where} symbols", f"{sorted(reads[index] & pending)} bound by no input "
                f"dimension, yet input {position} is sized by them", "every symbol an input's "
                "sizes read is the size (or a*size+b) of some input dimension", _CORRUPT)
    values = method.values
    found: list[Producer] = []
    for i, ins in enumerate(method.instructions):
        if not pending:
            break
        kind = type(ins)
        made: list[Producer] = []
        if kind is KernelCall:
            for a in ins.args:
                if a < len(values) and type(values[a]) is TensorValue:
                    for d, e in enumerate(exprs.get(a, ())):
                        if e.op == "sym" and e.args[0] in pending and \
                                all(p.symbol != e.args[0] for p in made):
                            made.append(Producer(e.args[0], i, a, d))
            args = ins.args
        elif kind is Move:
            dst, src = ins.dst, ins.src
            e = exprs.get(dst, ())
            if dst < len(values) and src < len(values) and type(values[dst]) is IntValue \
                    and len(e) == 1 and e[0].op == "sym" and e[0].args[0] in pending:
                source = values[src]
                if type(source) is not TensorValue or source.numel != 1 or \
                        int(source.dtype) not in _INTEGER_DTYPES or src in exprs:
                    raise program_error(
                        f"{where} instruction {i} (Move)", f"symbol {e[0].args[0]} read from "
                        f"value {src}", "a static one-element integer tensor", _CORRUPT)
                made.append(Producer(e[0].args[0], i, src, -1))
                args = (src,)
            else:
                args = (src, dst)
        else:
            args = getattr(ins, "args", ())
        for a in args:  # nothing reads a symbol before it is produced
            early = reads.get(a, frozenset()) & pending
            early -= {p.symbol for p in made if p.dim >= 0 and p.value == a}
            if early:
                raise program_error(
                    f"{where} instruction {i}", f"value {a} sized by {sorted(early)} before "
                    "an instruction produces it", "data-dependent sizes read after the "
                    "instruction that produces them", _CORRUPT)
        for p in made:
            pending.discard(p.symbol)
        found.extend(made)
    if pending:
        raise program_error(
            f"{where} symbols", f"{', '.join(sorted(pending))} bound by no input dimension "
            "and produced by no instruction",
            "every symbol is the size (or a*size+b) of some input dimension, or a size an "
            "instruction produces (a kernel's result dimension, or a Move of a one-element "
            "integer tensor into an int)", _CORRUPT)
    return tuple(found)
