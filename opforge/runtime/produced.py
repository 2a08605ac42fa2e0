"""Calls of a method with data-dependent sizes: bind each produced symbol mid-call.

# Design
#
# A symbol no input determines is produced by an instruction (``opforge/program/produced.py``:
# ``nonzero.out``'s result rows, ``item()`` used as a size). A dynamic ``Method`` binds its
# instructions per shape before running them (``runtime/rebinding.py``); with produced
# symbols the shape is only fully known partway through the call. So a call runs in
# segments:
#
#     bind at the input shapes, each produced symbol not known yet at its upper bound
#     run up to and including the next producer (its out is its whole slot)
#     read the produced size (the kernel's returned result, or the Move's element),
#     check it against the symbol's range, then the guards it completes
#     bind again with it known; go on with the next instruction
#
# Every binding is over the same arenas (the slots are planned at the upper bound), so what
# the first segments computed is where the later ones read it: a producer writes its result
# densely from its slot's start, which is its view at the actual sizes. Bindings are cached
# per input shape and produced values (the method's LRU of shapes). A symbol not known yet
# is never read before its producer (the verifier checks it), so its provisional value at the
# upper bound only sizes the producer's own out.
"""

from __future__ import annotations

from opforge.errors import OpforgeError, ProgramError
from opforge.program.produced import producers
from opforge.program.symbolic import binding_plan

__all__ = ["ProducedSizes"]


class ProducedSizes:
    """The segmented call of one dynamic ``Method`` instance with produced symbols."""

    def __init__(self, method) -> None:
        self.method = method
        definition = method._def
        inputs_bind = {s.symbol for s in binding_plan(definition) if s.symbol is not None}
        unbound = [s.name for s in definition.symbols if s.name not in inputs_bind]
        self.producers = producers(definition, unbound)
        self.ranges = {s.name: (s.min, s.max) for s in definition.symbols}
        self.upper = {p.symbol: self.ranges[p.symbol][1] for p in self.producers}
        position = {i: p for p, i in enumerate(method._rebind.instruction_index)}
        # (bound position, producers at it), in order; guards each producer completes
        steps: dict[int, list] = {}
        for p in self.producers:
            steps.setdefault(position[p.instruction], []).append(p)
        self.steps = tuple(sorted(steps.items()))
        known = set(inputs_bind)
        self.guards = {}
        for p in self.producers:
            known.add(p.symbol)
            self.guards[p.symbol] = [g for g in definition.guards
                                     if p.symbol in g.lhs.symbols() | g.rhs.symbols()
                                     and g.lhs.symbols() | g.rhs.symbols() <= known]

    # --- one call ---------------------------------------------------------------------------

    def call(self, inputs: tuple, views: bool, tracer=None) -> tuple:
        method = self.method
        file = method._file
        if file is not None:
            file.check(method._call_api, now=tracer is not None)
        key = self._key(inputs)
        known: tuple = ()
        self._use(key, known, inputs)
        method._load_inputs_slow(inputs)
        threads = method._threads
        saved = threads.enter() if threads is not None else None
        try:
            start = 0
            for position, made in self.steps:
                self._run(start, position, tracer)
                known = known + self._produce(position, made, dict(known), tracer)
                self._use(key, known, inputs)
                start = position + 1
            self._run(start, len(method._bound), tracer)
        finally:
            if saved:
                threads.exit(saved)
        return method._finish(views)

    def _key(self, inputs: tuple) -> tuple:
        method = self.method
        try:
            return method._shape_key(inputs)
        except TypeError:  # unhashable (nested lists): the binding converts them
            return None

    def _use(self, key, known: tuple, inputs: tuple) -> None:
        """Make the binding at the inputs' shapes and the ``known`` produced values
        current (cached in the method's LRU of shapes)."""
        method = self.method
        full = (key, known) if key is not None else None
        binding = method._shapes.get(full) if full is not None else None
        if binding is None:
            binding = method._bind_shape(full, inputs, produced={**self.upper, **dict(known)})
        elif full is not None:
            method._shapes.move_to_end(full)
        if binding is not method._current:
            method._use(binding)
            if known and method._scalar_users:  # scalar inputs of this call, not the cached
                for spec, given in zip(method.inputs, inputs):
                    if not spec.is_tensor:
                        method._values.set(spec.index, spec.dtype(given))
                method._rebind_scalar_users()

    def _run(self, start: int, stop: int, tracer) -> None:
        method = self.method
        bound = method._bound
        if tracer is None:
            try:
                for fn, args in bound[start:stop]:
                    fn(*args)
            except Exception as e:
                raise method._kernel_error(fn, args, e) from e  # noqa: F821
            return
        from time import perf_counter_ns as clock

        for position in range(start, stop):
            fn, args = bound[position]
            begin = clock()
            try:
                fn(*args)
            except Exception as e:
                raise method._kernel_error(fn, args, e) from e
            tracer.record(method.name, method._instruction_index[position],
                          method._op_names[position], begin, clock() - begin)

    def _produce(self, position: int, made: list, env: dict, tracer) -> tuple:
        """Run the producer at bound ``position``; its symbols' values, checked."""
        method = self.method
        fn, args = method._bound[position]
        i, key = method._instruction_index[position], method._op_names[position]
        what = ", ".join(f"{p.symbol} in [{self.ranges[p.symbol][0]}, "
                         f"{self.ranges[p.symbol][1]}]" for p in made)
        result = None
        if any(p.dim >= 0 for p in made):
            try:
                result = fn(*args)
            except OpforgeError as e:
                raise self._over(i, key, what, f"{type(e).__name__}: {e}") from e
            except Exception as e:  # noqa: BLE001 - ATen: a result past the slot's storage
                if "resiz" in str(e):
                    raise self._over(i, key, what, f"{type(e).__name__}: {e}") from e
                raise method._kernel_error(fn, args, e) from e
            if tracer is not None:
                tracer.record(method.name, i, key, 0, 0)
        values = []
        for p in made:
            if p.dim < 0:  # a Move of one integer element: item() as a size
                value = int(method._values.get(p.value).reshape(-1)[0])
                source = f"the value of tensor {p.value}"
            else:
                # a kernel that reports no result wrote its whole out (as native kernels
                # that leave the out's sizes alone): the size at the bound
                sizes = getattr(result, "shape", None) or method._values.get(p.value).shape
                if len(sizes) <= p.dim:
                    raise ProgramError(
                        f"`{method._call_api}`: instruction {i} ({key}) — returned a result "
                        f"of rank {len(sizes)} — valid: the result it wrote, whose dimension "
                        f"{p.dim} is the data-dependent size {p.symbol} — fix: the kernel "
                        "must return its result (a data-dependent size's producer)")
                value = int(sizes[p.dim])
                source = f"dimension {p.dim} of its result"
            low, high = self.ranges[p.symbol]
            if not low <= value <= high:
                raise ProgramError(
                    f"`{method._call_api}`: data-dependent size {p.symbol} ({source}, "
                    f"instruction {i}, {key}) — found {value} — valid: [{low}, {high}], the "
                    "range the program was exported and planned with — fix: re-export with a "
                    f"bound that covers it: torch._check(n <= K) where the size is made (K the "
                    "largest size a call needs)")
            env[p.symbol] = value
            values.append((p.symbol, value))
            for guard in self.guards[p.symbol]:
                if not guard.holds(env):
                    raise ProgramError(
                        f"`{method._call_api}`: data-dependent size {p.symbol} = {value} "
                        f"(instruction {i}, {key}) — breaks the guard {guard} that "
                        "torch.export recorded — valid: values for which it holds — fix: "
                        "check the inputs' values")
        return tuple(values)

    def _over(self, i: int, key: str, what: str, error: str) -> ProgramError:
        return ProgramError(
            f"`{self.method._call_api}`: instruction {i} ({key}) — its result is larger than "
            f"its data-dependent size's bound ({what}): {error} — valid: results within the "
            "range the program was exported and planned with — fix: re-export with a larger "
            "bound: torch._check(n <= K) where the size is made (K the largest size a call "
            "needs)")
