"""Binding a dynamic method at a new input shape: a plan made once per instance, run per shape.

# Design
#
# A ``Method`` with symbolic sizes keeps one bound instruction list per input shape
# (``runtime/method.py``); this module makes one. What can be decided without the sizes is
# decided once, when the instance is made (``RebindPlan``):
#
# - each distinct size expression becomes a closure (no tree walk per shape), and each
#   symbolic value knows which of their results are its sizes;
# - each symbolic tensor that is a contiguous view of an arena slot (nearly all) becomes
#   ``(index, sizes getter, dtype, arena, offset)``: one ``np.ndarray(...)`` per shape,
#   no lookups; the rest (other dim orders, growing tensors, ints, ``int[]``) go through
#   ``ValueTable.set_sizes`` as before; tensor lists holding them are made on first use;
# - each instruction becomes one entry: a kernel call none of whose arguments depend on
#   the symbols is bound at the first shape and shared by all; a dependent kernel call
#   keeps its kernel's ``bind`` (or None), its argument indices, and the objects of its
#   arguments that do not depend on the symbols, fetched once; a ``Move`` and a delegate
#   call likewise.
#
# A new shape then costs: the ``ShapeBinder``'s checks (every range, input dimension and
# guard, unchanged), the closures, one view per symbolic tensor, and per dependent
# instruction an argument tuple and its kernel's own ``bind``: the portable binders
# specialise per shape (views of the actual sizes, scratch buffers), and that is most of
# what is left (bench/dynamic_shapes.py). Except for a *shape-generic* binder
# (``kernels/portable/_binding.py``): where its pair at the first shape is one ufunc (or
# ``np.copyto``) call on the instruction's own arguments and size-free objects, that pair
# is a template, and a new shape puts its arguments in place without calling the binder:
# one ``itemgetter`` over the shape's argument table, where the template's size-free
# objects sit under keys of their own (below zero). Not where a dependent argument is a
# symbolic int or ``int[]`` (a binder folds their values), nor for a call that reads a
# scalar input (rebound per call anyway). And except
# for a *prepared* binder (``_binding``: prepared binders): its ``prepare`` runs once, here,
# on the arguments at the upper bound (the base table's views), and per shape its
# ``rebind`` does only the size-dependent part, falling back to the binder when it declines;
# scratch buffers are prefixes of ones made at the upper bound (one instance runs one shape
# at a time). Symbolic ints and ``int[]``s are picked from the evaluated sizes, like the
# views' shapes. On the transformer zoo model (47 instructions, 52 symbolic tensors) a new
# shape costs ~50 µs (bench/dynamic_shapes.py): ~15 for the views, ~30 for the
# instructions, the rest the checks and tables.
"""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np

from opforge.errors import KernelError, ProgramError
from opforge.program import (
    ArenaStorage, Free, IntListValue, IntValue, KernelCall, Move, TensorValue,
)
from opforge.program.symbolic import _EVAL, SizeExpr
from opforge.runtime.arena import ValueTable, _numpy_dtype
from opforge.runtime.limits import memory_limit

if TYPE_CHECKING:
    from opforge.runtime.method import Method

__all__ = ["RebindPlan", "ShapeBinding"]

_ndarray = np.ndarray
_PREPARED_KINDS = (TensorValue, IntValue, IntListValue)
# entry kinds: a kernel call through its binder (or with no binder), through its prepared
# rebind, by its template (or its shape-generic binder until the first shape makes one); a
# shape-free kernel call; a move; a delegate call
_BIND, _REBIND, _GENERIC, _TEMPLATE, _SHARED, _MOVE, _DELEGATE = range(7)


class ShapeBinding(NamedTuple):
    """What a call at one input shape runs on (see ``Method._call_dynamic``)."""

    values: ValueTable
    bound: list
    instruction_index: list
    op_names: list
    kernels: list
    fast_inputs: tuple
    input_shapes: tuple
    output_views: tuple
    copy_outputs: Callable[[], tuple]


class RebindPlan:
    """How one dynamic ``Method`` instance binds itself at a new input shape."""

    def __init__(self, method: "Method") -> None:
        self.method = method
        definition, binder = method._def, method._binder
        self.evaluators = tuple(_compile(e) for e in binder._distinct)
        self.distinct = binder._distinct
        self.gather = binder._gather
        base = method._base_values
        growing = method._growing.buffers if method._growing is not None else {}
        self.views, self.ints, self.others = [], [], []
        for index, where in binder._gather:
            value = definition.values[index]
            storage = getattr(value, "storage", None)
            if type(value) is TensorValue and type(storage) is ArenaStorage and where and \
                    index not in growing and value.dim_order == tuple(range(len(where))):
                self.views.append((index, itemgetter(*where), _numpy_dtype(value.dtype),
                                   method._arenas[storage.mem_id], storage.offset))
            elif type(value) is IntValue and len(where) == 1:
                self.ints.append((index, itemgetter(where[0])))
            elif type(value) is IntListValue and len(where) > 1:  # a tuple, as set_sizes
                self.ints.append((index, itemgetter(*where)))
            else:
                self.others.append((index, where))
        # the instruction list: one entry per bound position (Free has none); calls that
        # read a scalar input are rebound per call (``Method._rebind_scalar_users``)
        scalars = {s.index for s in method.inputs if not s.is_tensor}
        dependent = binder.dependent | scalars
        self.dependent = binder.dependent
        self.entries, names, indices = [], [], []
        # per shape, every argument comes from one dict: ``fixed`` (shape-free objects)
        # updated with the shape's own; ``late`` are the dependent values made on demand
        # (tensor lists holding symbolic tensors, scalar inputs)
        self.fixed: dict[int, object] = {}
        self.late: set[int] = set()
        made = {index for index, _ in binder._gather}
        for i, instruction in enumerate(definition.instructions):
            kind = type(instruction)
            if kind is Free:
                continue
            indices.append(i)
            if kind is KernelCall:
                kernel = method._kernel_table[i]
                names.append(kernel.key)
                args = instruction.args
                if not dependent.intersection(args):
                    self.entries.append([_SHARED, i, kernel, None, None])
                    continue
                for a in args:  # the arguments shared by all shapes: fetched once, here
                    if a not in dependent:
                        self.fixed[a] = base.get(a)
                    elif a not in made:
                        self.late.add(a)
                bind = getattr(kernel.fn, "bind", None)
                # every argument tuple comes from one picker (one argument: a 1-tuple)
                pick = itemgetter(*args) if len(args) > 1 else \
                    (lambda table, a=args[0]: (table[a],))
                # a shape-generic binder (kernels/portable/_binding.py) whose arguments
                # change only in their tensors' sizes: rebound from a template
                generic = getattr(bind, "shape_generic", False) and all(
                    type(definition.values[a]) is TensorValue
                    for a in args if a in dependent)
                rebind = None if generic else self._prepare(i, bind, args, dependent, growing)
                if kernel.target != "portable":  # may need its crash label: the binder
                    entry = [_BIND, i, kernel, pick, bind]
                elif generic:
                    entry = [_GENERIC, i, kernel, pick, (bind, args)]
                elif rebind is not None:
                    entry = [_REBIND, i, kernel, pick, (rebind, bind)]
                else:
                    entry = [_BIND, i, kernel, pick, bind]
                self.entries.append(entry)
            elif kind is Move:
                names.append("move")
                self.entries.append([_MOVE, i, None, None, (instruction.dst, instruction.src)])
            else:  # DelegateCall: one call into its backend, bound per shape
                delegates = method._delegates
                if delegates is None:
                    raise ProgramError(
                        f"`{method._api}`: instruction {i} — {kind.__name__} without the "
                        "program's delegates — fix: load the program with "
                        "opforge.runtime.load")
                kernel = delegates.kernel(instruction.delegate)
                names.append(kernel.key)
                self.entries.append([_DELEGATE, i, kernel, None, instruction])
        self.instruction_index = indices
        self.op_names = names
        self.kernels = [e[2] for e in self.entries]
        self.shared: dict[int, tuple] = {}  # shape-free kernel calls, bound at the first shape

    def _prepare(self, i: int, bind, args: tuple, dependent, growing) -> object:
        """A prepared binder's ``rebind`` for instruction ``i`` (kernels/portable/_binding.py:
        prepared binders), from its arguments at the upper bound; None where it has none,
        where a dependent argument is neither a planned tensor nor an int or ``int[]``,
        or where ``prepare`` declines (or fails: the binder then runs, and reports)."""
        prepare = getattr(bind, "prepare", None)
        if prepare is None:
            return None
        values = self.method._def.values
        for a in args:
            if a in dependent and (a in growing or type(values[a]) not in _PREPARED_KINDS):
                return None
        base = self.method._base_values  # symbolic tensors there: views at the upper bound
        try:
            return prepare(tuple(base.get(a) for a in args))
        except Exception:  # noqa: BLE001 (an optimisation: the binder's own errors name it)
            return None

    def sizes(self, env: dict[str, int]) -> list[int]:
        """Each distinct size expression's value under ``env`` (ProgramError on a zero
        divisor, naming the expression and the symbols' values)."""
        try:
            return [evaluate(env) for evaluate in self.evaluators]
        except ZeroDivisionError:
            for expr in self.distinct:  # which one: the slow way, once
                try:
                    expr.evaluate(env)
                except ZeroDivisionError:
                    bound = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
                    raise ProgramError(
                        f"`{self.method._binder.api}`: size expression {expr} — divides by "
                        f"zero at {bound} — valid: sizes the exported guards admit — fix: "
                        "pass other sizes, or re-export") from None
            raise

    def bind(self, shapes: dict[int, tuple[int, ...]], inputs: tuple,
             produced: dict[str, int] | None = None) -> ShapeBinding:
        """The binding at the tensor inputs' ``shapes`` (checked by the ShapeBinder), with
        the values of the symbols instructions produce (``runtime/produced.py``)."""
        method = self.method
        env = method._binder.bind(shapes)
        if produced:
            env.update(produced)
        found = self.sizes(env)
        growing = method._growing
        if growing is not None:
            sizes = {index: tuple([found[j] for j in where]) for index, where in self.gather}
            if growing.ensure(sizes, env):
                method._shapes.clear()  # their views are over the replaced buffers
                method._current = None
        objects = {index: _ndarray(shape(found), dtype, arena, offset)
                   for index, shape, dtype, arena, offset in self.views}
        for index, size in self.ints:
            objects[index] = size(found)
        values = ValueTable(method._api, method._program, method._def, method._arenas,
                            base=method._base_values, dependent=self.dependent,
                            growing=growing, objects=objects)
        for index, where in self.others:
            values.set_sizes(index, tuple([found[j] for j in where]))
        for spec, given in zip(method.inputs, inputs):
            if not spec.is_tensor and type(given) in (int, float, bool):
                values.set(spec.index, spec.dtype(given))  # checked by the call
        get = values.get
        for index in self.late:
            get(index)  # into ``objects``
        table = self.fixed.copy()
        table.update(objects)
        with memory_limit(method._max_memory):
            bound = self._bind_instructions(values, table)
        views = tuple([get(i) for i in method._def.outputs])
        return ShapeBinding(
            values, bound, self.instruction_index, self.op_names, self.kernels,
            tuple([(get(s.index), s.dtype, shapes[p]) for p, s in enumerate(method.inputs)
                   if s.is_tensor]),
            tuple([shapes.get(p) for p in range(len(method.inputs))]),
            views, output_copier(views))

    def _bind_instructions(self, values: ValueTable, table: dict[int, object]) -> list[tuple]:
        method, get, shared = self.method, values.get, self.shared
        bound = []
        append = bound.append
        for entry in self.entries:
            kind, i, kernel, pick, data = entry
            if kind is _TEMPLATE:
                append((data, pick(table)))
                continue
            if kind is _REBIND:
                rebind, bind = data
                try:
                    pair = rebind(pick(table))
                    append(pair if pair is not None else bind(pick(table)))
                except Exception as e:
                    raise bind_error(method, i, kernel, e) from e
            elif kind is _BIND or kind is _GENERIC:
                args = pick(table)
                bind = data if kind is _BIND else data[0]
                if bind is None:  # no binder
                    append((kernel.fn, args))
                    continue
                try:
                    fn, bound_args = bind(args)
                except Exception as e:
                    raise bind_error(method, i, kernel, e) from e
                if kind is _GENERIC:  # the first shape: a template for the others?
                    template = self._template(fn, bound_args, args, data[1])
                    entry[0], entry[4] = (_BIND, bind) if template is None else \
                        (_TEMPLATE, fn)
                    if template is not None:
                        entry[3] = template
                elif kernel.target != "portable" and \
                        getattr(fn, "crash_label", None) is not None:
                    from opforge.runtime.native import label_crash_frame

                    fn = label_crash_frame(fn, f"instruction {i} of method {method.name!r}",
                                           kernel.origin)
                append((fn, bound_args))
            elif kind is _SHARED:
                pair = shared.get(i)
                if pair is None:
                    saved, method._values = method._values, values
                    try:
                        pair = shared[i] = method._bind(i, kernel,
                                                        method._def.instructions[i])
                    finally:
                        method._values = saved
                append(pair)
            elif kind is _MOVE:
                dst, src = data
                append((np.copyto, (get(dst), get(src))))
            else:
                saved, method._values = method._values, values
                try:
                    append((method._bind_delegate(i, method._delegates, data), ()))
                finally:
                    method._values = saved
        return bound

    def templated(self) -> list[int]:
        """The instructions rebound from a template at a new shape (known after the first)."""
        return [entry[1] for entry in self.entries if entry[0] is _TEMPLATE]

    def _template(self, fn, bound_args, args: tuple, keys: tuple):
        """A picker of ``bound_args`` at any shape from the shape's argument table, or None:
        where ``fn`` is one ufunc (or ``np.copyto``) call whose arguments are the call's
        own (``args``, at table ``keys``) or objects that do not depend on the sizes (0-d
        arrays, scalars: added to every table under keys of their own, below zero)."""
        if not (isinstance(fn, np.ufunc) or fn is np.copyto) or \
                type(bound_args) is not tuple or not bound_args:
            return None
        picks, constants = [], []
        for obj in bound_args:
            position = next((p for p, a in enumerate(args) if obj is a), None)
            if position is not None:
                picks.append(keys[position])
                continue
            if type(obj) is np.ndarray and obj.ndim or isinstance(obj, (list, tuple, dict)):
                return None  # an array of its own (a view, a buffer): depends on the sizes
            constants.append(obj)
            picks.append(-len(self.fixed) - len(constants))
        for key, obj in zip((k for k in picks if k < 0), constants):
            self.fixed[key] = obj
        if len(picks) == 1:
            return lambda table, key=picks[0]: (table[key],)
        return itemgetter(*picks)


def bind_error(method: "Method", i: int, kernel, error: Exception) -> KernelError:
    """The error for a kernel whose ``bind`` raised (at load, or at a new shape)."""
    return KernelError(
        f"`{method._api}({method.name!r})`: instruction {i} ({kernel.key}, "
        f"{kernel.target} kernel from {kernel.origin}) — cannot bind its arguments: "
        f"{type(error).__name__}: {error} — valid: arguments matching the op's schema — fix: "
        "re-export the program for this kernel set")


def output_copier(views: tuple) -> Callable[[], tuple]:
    """A call's outputs copied out of their views (``views=False``), as a tuple; one
    output (the common case) skips the loop, a third of a small model's output cost."""
    copies = tuple(o.copy if type(o) is np.ndarray else (lambda o=o: o) for o in views)
    if len(copies) == 1:
        only = copies[0]
        return lambda: (only(),)
    return lambda: tuple([c() for c in copies])


def _compile(expr: SizeExpr):
    """``expr`` as a closure of the symbol environment: what ``SizeExpr.evaluate`` gives,
    ZeroDivisionError included, without walking the tree per call."""
    op, args = expr.op, expr.args
    if op == "int":
        value = args[0]
        return lambda env: value
    if op == "sym":
        return itemgetter(args[0])
    a, b = _compile(args[0]), _compile(args[1])
    if op == "+":
        return lambda env: a(env) + b(env)
    if op == "-":
        return lambda env: a(env) - b(env)
    if op == "*":
        return lambda env: a(env) * b(env)
    function = _EVAL[op]  # floordiv, mod, min, max: the evaluator's own (0 divisor raises)
    return lambda env: function(a(env), b(env))
