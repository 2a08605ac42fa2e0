"""Which torch operators ATen mode may run: a program file is untrusted data.

In ATen mode the registry falls back to ``torch.ops.<ns>.<op>.<overload>`` for any key a
program names. Without a rule a 256-byte program could call ``aten::from_file.out`` and
return ``/etc/passwd`` as its output, or ``aten::save`` to write a file. So the fallback
serves a key only when this module allows it, and the loader refuses a program calling
anything else, at load, before any kernel runs.

# The rule
#
# A key ``"ns::op.overload"`` runs on torch's own kernel when it is not deny-listed and
#
#   1. it is an ``aten`` out overload (``Tensor(a!) out`` arguments) whose functional
#      twin in the same packet is core ATen (``torch.Tag.core``) or the ``_copy`` twin of
#      a view (``torch.Tag.view_copy``): what ``opforge.export`` emits after its core-ATen
#      decomposition and out-variant passes;
#   2. or it is an ``aten`` key the portable kernel library implements (``aten::linear.out``:
#      export keeps such an op whole when exporting for the portable kernel set);
#   3. or its operator was registered with PyTorch through ``opforge.torch_bridge`` (any
#      overload of ``"ns::op"``; this includes the ``.out`` overloads of the
#      ``quantized_decomposed`` / ``torchao`` quantize and dequantize ops that
#      ``opforge.torch_bridge.quantized_ops`` adds for quantized programs), or the caller allowed it (``AtenOps.allow``,
#      ``KernelRegistry.allow_ops``, ``load(..., allow_ops=[...])``): an exact key, or
#      ``"ns::op"`` for every overload of an operator.
#
# Exporting the zoo, the custom-op model and the portable test models for the default,
# ``"portable"`` and ``"aten"`` kernel sets gives 103 distinct keys; rules 1-3 admit all.
#
# The deny-list wins over all three, and ``allow`` refuses to add a denied key: operators
# that touch files, processes or the network, print, or change process-wide state. It is
# deny-listed namespaces (``DENIED_NAMESPACES``: profiler, distributed communication, ...),
# deny-listed operators, every overload (``DENIED_OPERATORS``: ``aten::from_file``,
# ``aten::save``, ``aten::_print``, ...), any operator with a string argument naming a file,
# path, directory, URL, host, socket or command (``PATH_ARGUMENT``), and what ``torch.fx``
# itself marks side-effectful (``_assert_async``, the record-function ops, ...).
#
# Everything else, an op torch knows that the rule does not admit, is refused with the
# reason and how to allow it; an op torch does not know is a missing kernel, as in lean
# mode. The verdict from torch's tables is cached per key; opforge registrations and the
# caller's allow-list are read at every check (an op registered later is found).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from opforge.errors import RegistrationError, shown

__all__ = [
    "AtenOps", "DENIED_NAMESPACES", "DENIED_OPERATORS", "PATH_ARGUMENT",
    "denial", "refusal",
]

# namespace -> why nothing in it may run from a program
DENIED_NAMESPACES: dict[str, str] = {
    "profiler": "it drives the process-wide profiler",
    "c10d": "it communicates with other processes over the network",
    "c10d_functional": "it communicates with other processes over the network",
    "_c10d_functional": "it communicates with other processes over the network",
    "_c10d_functional_autograd": "it communicates with other processes over the network",
    "_dtensor": "it communicates with other processes over the network",
    "symm_mem": "it maps memory shared with other processes",
    "debugprims": "it reads files (debugprims::load_tensor)",
    "debug_mode_ops": "it records into process-wide debugging state",
    "prim": "it is a TorchScript interpreter op (prints, raises, manipulates the interpreter)",
}

# "ns::op" (any overload) -> why it may never run from a program
DENIED_OPERATORS: dict[str, str] = {
    "aten::from_file": "it reads a file named by the program",
    "aten::save": "it writes a file named by the program",
    "aten::load": "it reads a file named by the program",
    "aten::_print": "it prints to the process's output",
    "aten::warn": "it writes to the process's warning stream",
    "aten::record_stream": "it changes allocator state outside its arguments",
    "torchvision::read_file": "it reads a file named by the program",
    "torchvision::write_file": "it writes a file named by the program",
    "inductor::resize_storage_bytes_": "it resizes storage outside its out arguments",
    "inductor::_alloc_from_pool": "it hands out memory outside its arguments",
    "inductor::accumulate_grad_": "it writes gradients outside its out arguments",
}

# A str / str? / str[] argument with such a name is a file, path, address or command.
PATH_ARGUMENT = re.compile(r"file|path|dir|url|uri|host|socket|command|cmd", re.IGNORECASE)

_verdicts: dict[str, tuple[str, str]] = {}  # key -> (kind, reason), for ops torch knows
_portable_keys: frozenset[str] | None = None


def denial(key: str) -> str | None:
    """Why ``key`` is deny-listed (no allow-list can admit it), or None.

    >>> denial("aten::from_file.out")
    'it reads a file named by the program'
    >>> denial("aten::add.out") is None
    True
    """
    name = key.partition(".")[0]
    namespace = name.partition("::")[0]
    if namespace in DENIED_NAMESPACES:
        return DENIED_NAMESPACES[namespace]
    if name in DENIED_OPERATORS:
        return DENIED_OPERATORS[name]
    verdict = _verdict(key)
    if verdict is not None and verdict[0] == "denied":
        return verdict[1]
    return None


def refusal(key: str, allowed: Iterable[str] = ()) -> str | None:
    """Why ATen mode refuses to run ``key``, or None when it may run (or torch has no such
    op: that is a missing kernel, not a refusal). ``allowed`` is the caller's allow-list.

    >>> refusal("aten::add.out") is None
    True
    >>> refusal("aten::save")
    'deny-listed: it writes a file named by the program'
    """
    reason = denial(key)
    if reason is not None:
        return f"deny-listed: {reason}"
    verdict = _verdict(key)
    if verdict is None or verdict[0] == "allowed":
        return None
    allowed = allowed if isinstance(allowed, (set, frozenset, dict)) else set(allowed)
    if key in allowed or key.partition(".")[0] in allowed or _registered_by_opforge(key):
        return None
    return f"not on the ATen-mode allow-list: {verdict[1]}"


class AtenOps:
    """The ATen-mode registry fallback: torch's kernel for a key the allow-list admits.

    Called with a key it returns the ``Kernel`` (or None: no such op, or refused);
    ``refusal(key)`` says why a key is refused; ``allow(keys)`` extends the allow-list
    with the caller's own torch ops (an exact ``"ns::op.overload"`` or ``"ns::op"`` for
    every overload); a deny-listed key is a ``RegistrationError``.

    >>> ops = AtenOps()
    >>> ops("aten::save") is None, ops.refusal("aten::save")
    (True, 'deny-listed: it writes a file named by the program')
    """

    def __init__(self, allow: Iterable[str] = ()) -> None:
        self.allowed: dict[str, None] = {}
        self.allow(allow)

    def allow(self, keys: Iterable[str], *, api: str = "AtenOps.allow") -> None:
        """Let each of ``keys`` run on torch's kernel (they stay subject to the deny-list)."""
        from opforge.runtime.registry import check_key

        if isinstance(keys, str):
            keys = [keys]
        for key in keys:
            check_key(key, api)
            reason = denial(key)
            if reason is not None:
                raise RegistrationError(
                    f"`{api}`: {shown(key)} — deny-listed: {reason} — valid: operators that "
                    "compute only from their arguments into their out arguments — fix: do not "
                    "allow it; a model that needs it cannot run from an untrusted program file")
            self.allowed[key] = None

    def refusal(self, key: str) -> str | None:
        """Why this fallback refuses ``key`` (None: allowed, or torch has no such op)."""
        return refusal(key, self.allowed)

    def __call__(self, key: str) -> Any:
        from opforge.kernels.aten import unchecked_aten_kernel

        if refusal(key, self.allowed) is not None:
            return None
        return unchecked_aten_kernel(key)

    def __repr__(self) -> str:
        return f"AtenOps(allow={list(self.allowed)!r})"


def _registered_by_opforge(key: str) -> bool:
    try:
        from opforge.torch_bridge import is_registered
        from opforge.torch_bridge.library_ops import has_library_out
    except ImportError:  # pragma: no cover - torch_bridge needs only torch, present here
        return False
    # the out overloads opforge adds to other libraries' ops (quantize/dequantize, transformers)
    return is_registered(key.partition(".")[0]) or has_library_out(key)


def _verdict(key: str) -> tuple[str, str] | None:
    """``("allowed" | "denied" | "refused", reason)`` from torch's tables, or None when
    torch has no such operator; cached per key."""
    verdict = _verdicts.get(key)
    if verdict is not None:
        return verdict
    from opforge.kernels.aten import torch_op

    op = torch_op(key)
    if op is None:
        return None  # not cached: an op defined later must be judged, not waved through
    verdict = _verdicts[key] = _judge(key, op)
    return verdict


def _judge(key: str, op: Any) -> tuple[str, str]:
    import torch

    schema = op._schema
    for argument in schema.arguments:
        if "str" in str(argument.type) and PATH_ARGUMENT.search(argument.name):
            return "denied", (f"its string argument {argument.name!r} names a file, path, "
                              "address or command")
    if _side_effectful(op):
        return "denied", "torch.fx marks it side-effectful (it acts outside its arguments)"
    namespace = key.partition("::")[0]
    if namespace != "aten":
        return "refused", ("a torch operator that was not registered through "
                           "opforge.torch_bridge")
    if key in _portable():
        return "allowed", "exported by opforge"
    if not any(a.is_out for a in schema.arguments):
        return "refused", "not an out variant (programs call out overloads)"
    functional = _functional_twin(op)
    if functional is not None:
        tags = functional.tags
        if torch.Tag.core in tags or torch.Tag.view_copy in tags:
            return "allowed", "the out variant of a core ATen op"
    return "refused", "not the out variant of a core ATen operator"


def _side_effectful(op: Any) -> bool:
    try:
        from torch.fx.node import _side_effectful_functions
    except ImportError:  # pragma: no cover - a torch without the set
        return False
    return op in _side_effectful_functions


def _functional_twin(out: Any) -> Any | None:
    """The functional overload of ``out``'s packet whose non-out arguments match (the
    out variant may drop the tensor-options keywords of a factory op)."""
    import torch

    name = out._schema.name.split("::", 1)
    try:
        packet = getattr(getattr(torch.ops, name[0]), name[1])
    except (AttributeError, RuntimeError):
        return None
    wanted = _signature(out._schema)
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        schema = candidate._schema
        if any(a.is_out for a in schema.arguments):
            continue
        if _signature(schema) == wanted or _signature(schema, _OPTIONS) == wanted:
            return candidate
    return None


_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})


def _signature(schema: Any, drop: frozenset[str] = frozenset()) -> tuple:
    return tuple((a.name, str(a.type), a.kwarg_only) for a in schema.arguments
                 if not a.is_out and not (a.kwarg_only and a.name in drop))


def _portable() -> frozenset[str]:
    global _portable_keys
    if _portable_keys is None:
        from opforge.kernels.portable import portable_kernels

        _portable_keys = frozenset(k for k in portable_kernels() if k.startswith("aten::"))
    return _portable_keys
