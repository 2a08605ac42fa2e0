"""The delegate contract every backend implements.

Ahead of time (needs torch; see ``opforge.backends.partition``)::

    partition(graph, specs)   -> PartitionResult   the node groups it takes, and for every
                                                   node it leaves out a Rejection (why)
    preprocess(subgraph, specs) -> bytes           one group, compiled to the blob stored
                                                   in the program; large constants may go
                                                   to ``subgraph.named_data`` instead (stored
                                                   once per program, see named_data.py)

At run time (NumPy only; a backend's run-time module must not import torch)::

    init(blob, specs, context) -> handle           once per delegate, at load
    execute(handle, inputs, outputs)               once per call: fills ``outputs``
    destroy(handle)                                when the loaded program goes away

``specs`` are the typed compile specs (``compile_specs.resolve_specs``): a dict with every
key the backend declares in ``compile_spec_defs``. The blob is untrusted data: ``init`` must
refuse a malformed one with a ``BackendError`` (never crash, never read out of bounds).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

from opforge.backends.compile_specs import SpecDef

__all__ = ["Backend", "BackendContext", "Rejection", "PartitionResult", "PreprocessRefused",
           "REJECTION_KINDS"]

# What a Rejection may say a node was refused for.
REJECTION_KINDS = ("op", "dtype", "shape", "layout", "compile_spec", "partition")


class PreprocessRefused(Exception):
    """Raised by ``preprocess`` for a group it cannot compile after all (what the partition
    check saw differs from what the group receives: values the check folded as constants
    can reach a group at run time). Export then leaves the group's nodes on the kernels,
    each with a ``Rejection`` of ``kind`` and this ``reason``, instead of failing."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind if kind in REJECTION_KINDS else "partition"
        self.reason = reason


@dataclass(frozen=True)
class Rejection:
    """Why ``backend`` left node ``node`` (its op ``op``) out of every partition."""

    backend: str
    node: str
    op: str
    kind: str
    reason: str
    source: str = ""  # the user's line (from the node's stack trace), when known

    def __post_init__(self) -> None:
        if self.kind not in REJECTION_KINDS:
            raise ValueError(f"Rejection.kind {self.kind!r} not in {REJECTION_KINDS}")

    def as_dict(self) -> dict[str, str]:
        return {"backend": self.backend, "node": self.node, "op": self.op, "kind": self.kind,
                "reason": self.reason, "source": self.source}


@dataclass
class PartitionResult:
    """``partitions``: lists of ``torch.fx.Node`` (call_function nodes of the graph given to
    ``partition``), each list one delegate; ``rejected``: one Rejection per node left out."""

    partitions: list[list[Any]] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)


@dataclass
class BackendContext:
    """What the runtime gives ``init`` beside the blob: the kernel registry the program was
    resolved against (for custom ops a backend calls through the kernel ABI), the memory
    limit in bytes, the runtime mode, the program's named data (``named_data.NamedDataMap``:
    bytes a blob refers to by key, stored once for all delegates) and the objects the
    program's delegates share (``named_data.SharedResources``, closed after every handle)."""

    registry: Any = None
    max_memory: int = 0
    mode: str = "lean"
    named_data: Any = None
    shared: Any = None


class Backend(abc.ABC):
    """Subclass and register (``opforge.backends.register_backend`` or the
    ``opforge.backends`` entry-point group) to add a backend."""

    name: ClassVar[str]
    compile_spec_defs: ClassVar[tuple[SpecDef, ...]] = ()
    # ops ("aten::linear") export keeps out of decomposition for this backend; a preserved
    # op the backend then leaves out runs on kernels, which must cover it
    preserve_ops: ClassVar[tuple[str, ...]] = ()
    # whether ``preprocess`` honours ``Subgraph.state``: a cache write whose new value is a
    # delegate output goes into the state input itself (the program passes the state as
    # that output). A backend that does not leaves state read-only; the runtime copies its
    # new value back after the call.
    writes_state_in_place: ClassVar[bool] = False
    # whether ``partition``/``preprocess`` take a dynamic method's graph (symbolic sizes,
    # the symbol table on ``ExportGraph.symbols``); a backend that does not is offered
    # nothing from such a method
    dynamic_shapes: ClassVar[bool] = False

    def preserved_ops(self, specs: dict[str, Any]) -> tuple[str, ...]:
        """Ops export keeps out of decomposition for these specs (default: ``preserve_ops``;
        e.g. ops an op package registered through the specs overrides)."""
        return tuple(self.preserve_ops)

    def unavailable(self) -> str | None:
        """None when the backend can run here; otherwise what is missing and how to fix it
        (checked at export and at load, so neither fails halfway)."""
        return None

    # --- ahead of time ---------------------------------------------------------------------
    @abc.abstractmethod
    def partition(self, graph: Any, specs: dict[str, Any]) -> PartitionResult:
        """Pick the node groups this backend takes from ``graph``
        (``opforge.backends.partition.ExportGraph``)."""

    @abc.abstractmethod
    def preprocess(self, subgraph: Any, specs: dict[str, Any]) -> bytes:
        """Compile one group (``opforge.backends.partition.Subgraph``) to its blob; raise
        ``PreprocessRefused`` to leave the group on the kernels (with the reason)."""

    # --- run time ----------------------------------------------------------------------------
    @abc.abstractmethod
    def init(self, blob: memoryview, specs: dict[str, Any], context: BackendContext) -> Any:
        """Parse and prepare ``blob`` (weights reordered, kernels picked): a handle."""

    @abc.abstractmethod
    def execute(self, handle: Any, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        """Run on ``inputs`` (C-contiguous NumPy arrays, read them only) and write every array
        of ``outputs`` (C-contiguous, preallocated, in the subgraph's output order)."""

    def bind(self, handle: Any, inputs: Sequence[Any], outputs: Sequence[Any]) -> Any:
        """A no-argument callable running ``execute(handle, inputs, outputs)`` on these very
        arrays (the runtime's arena views, fixed for a Method's life). Override to check the
        arrays against the blob once (shapes, dtypes: a ``BackendError`` naming the mismatch)
        and to prepare what makes each call cheap (pointer arrays).

        The callable may carry ``direct(inputs, outputs)``: one call on other arrays of the
        same shapes and dtypes (C-contiguous, aligned; inputs only read), the bound ones
        again afterwards. A method that is this one call then skips copying its inputs
        into the arena and its outputs out of it (``runtime/method.py``)."""
        return lambda: self.execute(handle, inputs, outputs)

    def destroy(self, handle: Any) -> None:
        """Release what ``init`` made (called once per handle)."""

    def own_threads(self, handle: Any) -> bool:
        """True when every thread a call of ``handle`` starts is sized by the backend itself
        and no BLAS or OpenMP pool of the caller's is reached: the runtime then holds no pools
        around a method whose other instructions reach none either (~1 µs a call)."""
        return False

    def describe_blob(self, blob: memoryview, specs: dict[str, Any]) -> dict[str, Any]:
        """What ``opforge inspect`` shows for one blob: at least ``{"ops": [...]}``."""
        return {}
