"""Mutation testing: put one small bug at a time into a copy of opforge and check that the
tests covering that code fail. A mutant the tests let through is a blind spot (add a test
that kills it) or an equivalent mutant (it computes the same thing; list it in
``EQUIVALENT``, scripts/mutation_equivalent.py, with the reason). See docs/testing.md.

    .venv/bin/python scripts/mutation_test.py                    # every target (~2 h on 1 busy core)
    .venv/bin/python scripts/mutation_test.py --target verifier  # one target (repeatable)
    .venv/bin/python scripts/mutation_test.py --list             # the mutants, not run
    .venv/bin/python scripts/mutation_test.py --target softmax --function _bind_softmax
    .venv/bin/python scripts/mutation_test.py --mutant 'KEY' --mutant 'KEY'  # reruns
    .venv/bin/python scripts/mutation_test.py --operators semantic --target engine_guard

# Design
#
# Mutants are made from the AST of the chosen functions (one mutation each: a comparison
# flipped at its boundary, + and - or * and / swapped, an integer off by one, ``and`` /
# ``or`` swapped, a ``not`` or a unary minus dropped, True / False flipped, a NumPy
# function swapped for its twin (maximum / minimum, add / subtract, ...), ``a - b`` reduced
# to ``a`` (a dropped max subtraction), a call statement or augmented assignment dropped,
# a step dropped from a list of steps), and the semantic operators of issue 45
# (mutation_semantic.py; --operators picks). Error messages, docstrings and annotations are
# never mutated: a wrong message is not a wrong result. Each mutant replaces just the
# source span of its node, so the rest of the file keeps its text.
#
# Mutants never touch the checkout: opforge/, tests/, fuzz/ and pyproject.toml are copied into a
# temporary directory once; each mutant rewrites one file there, runs its target's tests
# (``pytest -x``: the first failure kills it) and puts the file back. PyTorch, NumPy and
# pytest are imported once in this process, which then forks one child per mutant (the
# child imports opforge afresh, so it sees the mutant): ~2 s of torch import saved per
# mutant. Bytecode is never written, so a mutant of the same size and mtime as the
# original cannot be served from a stale .pyc. A child that runs past its timeout
# (4x the clean run, at least 20 s) is killed with its process group: "timeout".
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.dont_write_bytecode = True  # before anything imports opforge or the tests
ROOT = Path(__file__).resolve().parent.parent

from mutation_equivalent import EQUIVALENT  # noqa: E402  (beside this script, on sys.path)
from mutation_semantic import SEMANTIC, semantic  # noqa: E402


@dataclass(frozen=True)
class Target:
    """Functions of one file to mutate (``None``: every function and method) and the
    pytest arguments of the tests that cover them, fastest-failing first."""

    path: str
    functions: tuple[str, ...] | None
    tests: tuple[str, ...]


PORTABLE = "opforge/kernels/portable"
NATIVE = "opforge/backends/cpu/native"
# tests/torch/test_kernels_unary.py::test_special_values and the bound GELU special-value
# tests fail on AVX-512 machines before any mutation (torch's vectorised float32 GELU of
# +inf is nan there, inf elsewhere): deselected so that the clean run passes everywhere.
_NOT_SPECIAL = ("-k", "not special_values")
TARGETS: dict[str, Target] = {
    "softmax": Target(f"{PORTABLE}/normalization.py", (
        "_shifted", "softmax_out", "log_softmax_out", "_row_sum", "_row_max",
        "_softmax_workspace", "_bind_softmax", "_bind_log_softmax"), (
        "tests/torch/test_kernels_softmax_extreme.py", "tests/torch/test_kernels_norm_small.py",
        "tests/torch/test_kernels_reduction.py", "-k", "softmax")),
    "normalization": Target(f"{PORTABLE}/normalization.py", (
        "native_layer_norm_out", "_per_channel", "batch_norm_no_training_out",
        "_inference_affine", "batch_norm_batch_stats_out", "native_group_norm_out",
        "_floating_same", "_bind_layer_norm", "_bind_batch_stats", "_bind_batch_norm"), (
        "tests/torch/test_kernels_norm_binder_paths.py", "tests/torch/test_kernels_norm_small.py",
        "tests/torch/test_kernels_reduction.py", "tests/torch/test_kernels_norm_float16.py",
        "tests/torch/test_kernels_bound.py",
        "tests/torch/test_kernels_more.py", "-k", "norm")),
    "activation": Target(f"{PORTABLE}/activation.py", (
        "relu_out", "_clamp", "gelu_out", "silu_out", "leaky_relu_out", "elu_out",
        "hardsigmoid_out", "hardswish_out", "softplus_out", "_bind_relu", "_bound",
        "_bind_clamp", "_gelu_tanh_steps"), (
        "tests/torch/test_kernels_activation_edges.py", "tests/torch/test_kernels_unary.py",
        "tests/torch/test_kernels_gelu.py", *_NOT_SPECIAL)),
    "reduction": Target(f"{PORTABLE}/reduction.py", None, (
        "tests/torch/test_kernels_reduction_edges.py",
        "tests/torch/test_kernels_reduction_binder_paths.py", "tests/torch/test_kernels_reduction.py",
        "tests/torch/test_kernels_more.py::test_max_min_dim",
        "tests/torch/test_kernels_more.py::test_max_min_dim_zero_size_and_scalar",
        "tests/torch/test_kernels_more.py::test_linalg_vector_norm",
        "tests/torch/test_kernels_more.py::test_linalg_vector_norm_dtype_nan_and_empty")),
    "binding": Target(f"{PORTABLE}/_binding.py", (
        "read_only", "separate", "fold_scalar", "constant_operand", "_chunkable", "_slice",
        "_chunks", "steps", "ufunc_step"), (
        "tests/pure/test_binding_helpers.py", "tests/torch/test_kernels_norm_binder_paths.py",
        "tests/torch/test_kernels_activation_edges.py", "tests/torch/test_kernels_bound.py",
        "tests/torch/test_kernels_softmax_extreme.py", "tests/torch/test_kernels_unary.py",
        "-k", "not zoo_method and not special_values")),
    "verifier": Target("opforge/program/verify.py", None, (
        "tests/pure/test_program_verify_limits.py", "tests/pure/test_program_verify.py",
        "tests/pure/test_program_bad_inputs.py", "tests/pure/test_runtime_memory_limits.py",
        "tests/pure/test_program_symbolic.py", "tests/pure/test_program_splat.py",
        "tests/pure/test_program_debug_table.py")),
    "memory_planning": Target("opforge/export/memory_planning.py", None, (
        "tests/torch/test_export_memory_plan_exact.py",
        "tests/torch/test_export_memory_planning.py")),
    "plan_memory": Target("opforge/export/passes/plan_memory.py", None, (
        "tests/torch/test_export_memory_plan_exact.py", "tests/torch/test_dynamic_shapes.py",
        "tests/torch/test_dynamic_growth.py")),
    # the second stage: the cpu backend (lowering and engine), quantization, MindSpore
    "cpu_batch_norm": Target("opforge/backends/cpu/lowering/normalization.py", (
        "lower_batch_norm",), (
        "tests/backends/test_cpu_batchnorm.py",)),
    "cpu_fusion": Target("opforge/backends/cpu/lowering/fusion.py", (
        "_root", "_last_write", "_readers", "_starts_chain", "_fuse"), (
        "tests/backends/test_cpu_fusion.py", "tests/backends/test_cpu_positions.py",
        "tests/backends/test_cpu_batchnorm.py", "tests/backends/test_cpu_models.py")),
    "quantize_ranges": Target("opforge/quantize/specs.py", ("activation_range", "weight_range"), (
        "tests/quantize/test_ranges.py", "-k", "mlp")),
    "mindspore_fake": Target("opforge/mindspore/custom.py", ("_fake",), (
        "tests/mindspore/test_shapes_and_dtypes.py",)),
    "engine_bounds": Target("opforge/backends/cpu/native/validate.cpp", (
        "row_major", "dense", "injective", "check_reach", "count_of", "need_rank", "need_count"), (
        "tests/backends/test_cpu_hostile_plans.py", "tests/backends/test_cpu_contract.py")),
    # issue 45: the NaN guard, the engine's own kernels, state writes, MindSpore's guard zones
    # (run with --operators semantic; docs/testing.md)
    "engine_guard": Target(f"{NATIVE}/guard.cpp", (
        "max_magnitude", "operand", "walk", "guard_run", "special_input", "input_bound",
        "guard_note"), (
        "tests/backends/test_cpu_nan_post_ops.py", "tests/backends/test_cpu_nan_guard.py",
        "tests/backends/test_cpu_nan.py")),
    "engine_winograd": Target(f"{NATIVE}/winograd.cpp", ("emit", "run"), (
        "tests/backends/test_cpu_nan_post_ops.py", "tests/backends/test_cpu_winograd.py",
        "tests/backends/test_cpu_own_kernels_shared.py")),
    "engine_small_conv": Target(f"{NATIVE}/smallconv.cpp", ("output_row", "run"), (
        "tests/backends/test_cpu_own_kernels_shared.py", "tests/backends/test_cpu_small_conv.py",
        "tests/backends/test_cpu_differential.py::"
        "test_own_kernels_of_different_shapes_in_one_engine_agree")),
    "engine_softmax_rows": Target(f"{NATIVE}/softmax.cpp", ("scan_row", "exact_row", "fast_row"), (
        "tests/backends/test_cpu_softmax_rows.py", "tests/backends/test_cpu_safe_softmax.py",
        "tests/backends/test_cpu_masked_softmax_rows.py")),
    "state": Target("opforge/runtime/loader.py", (
        "LoadedProgram.read_state", "LoadedProgram.write_state", "LoadedProgram.reset_state",
        "LoadedProgram._state_array"), (
        "tests/pure/test_program_state_writes.py", "tests/pure/test_program_symbolic.py",
        "-k", "state")),
    "mindspore_guard_zones": Target("opforge/mindspore/op.py", (
        "AotKernel._aot_call", "_GuardedBuffer.__init__", "_GuardedBuffer.checks",
        "_GuardedBuffer.check"), (
        "tests/mindspore/test_guard_zones.py", "tests/mindspore/test_converted_calls.py",
        "tests/mindspore/test_aot_lean.py")),
}

# Calls whose arguments only build an error message.
_MESSAGE_CALLS = {"program_error", "with_api", "KernelError", "ProgramError", "ValueError",
                  "TypeError", "RuntimeError"}
_COMPARE_FLIPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
                  ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
                  ast.In: ast.NotIn, ast.NotIn: ast.In}
_BINOP_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
                ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
_TWINS = {"maximum": "minimum", "minimum": "maximum", "max": "min", "min": "max",
          "amax": "amin", "amin": "amax", "argmax": "argmin", "argmin": "argmax",
          "add": "subtract", "subtract": "add", "multiply": "divide", "divide": "multiply",
          "exp": "expm1", "expm1": "exp", "log": "log1p", "log1p": "log", "sum": "mean",
          "mean": "sum", "any": "all", "all": "any", "logical_or": "logical_and",
          "logical_and": "logical_or", "c_contiguous": "f_contiguous"}


@dataclass
class Mutant:
    path: str
    function: str
    line: int
    operator: str
    what: str  # the mutation, e.g. "compare: `a < b` -> `a <= b`"
    start: int  # byte span of the replaced source
    end: int
    replacement: str
    status: str = "not run"
    seconds: float = 0.0
    twin: int = 0  # earlier mutants of this function with the same ``what``

    @property
    def key(self) -> str:
        suffix = f" #{self.twin + 1}" if self.twin else ""
        return f"{self.path}::{self.function}::{self.what}{suffix}"


def _short(node: ast.AST) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= 70 else text[:67] + "..."


@dataclass
class _Collector:
    path: str
    source: bytes
    line_starts: list[int] = field(default_factory=list)
    mutants: list[Mutant] = field(default_factory=list)
    operators: str = "all"  # "mechanical", "semantic" or "all"

    def __post_init__(self) -> None:
        offset = 0
        for line in self.source.splitlines(keepends=True):
            self.line_starts.append(offset)
            offset += len(line)
        self.line_starts.append(offset)

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.line_starts[node.lineno - 1] + node.col_offset,
                self.line_starts[node.end_lineno - 1] + node.end_col_offset)

    def add(self, function: str, node: ast.AST, operator: str, new: ast.AST | str) -> None:
        if isinstance(new, str):
            replacement, shown = new, new
        else:
            ast.fix_missing_locations(new)
            shown = _short(new)
            replacement = ast.unparse(new)
            if isinstance(node, ast.expr):
                replacement = f"({replacement})"
        start, end = self.span(node)
        self.mutants.append(Mutant(self.path, function, node.lineno, operator,
                                   f"{operator}: `{_short(node)}` -> `{shown}`",
                                   start, end, replacement))

    def visit(self, function: str, node: ast.AST) -> None:
        """Every mutant of ``node``'s subtree, skipping messages and annotations."""
        if isinstance(node, (ast.Raise, ast.JoinedStr)):
            return
        if isinstance(node, ast.Call) and _called_name(node) in _MESSAGE_CALLS:
            return
        if self.operators != "semantic":
            self.mutate(function, node)
        if self.operators != "mechanical":
            for operator, new in semantic(node):
                if isinstance(new, tuple):  # a part of the node: (field, its new value)
                    self.add(function, getattr(node, new[0]), operator, new[1])
                else:
                    self.add(function, node, operator, new)
        for name, value in ast.iter_fields(node):
            if name in ("annotation", "returns", "decorator_list", "type_comment"):
                continue
            if name == "body" and isinstance(value, list) and value and _is_docstring(value[0]):
                value = value[1:]
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    self.visit(function, child)

    def mutate(self, function: str, node: ast.AST) -> None:
        def add(operator: str, new: ast.AST | str) -> None:
            self.add(function, node, operator, new)

        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                flip = _COMPARE_FLIPS.get(type(op))
                if flip:
                    new = copy.deepcopy(node)
                    new.ops[i] = flip()
                    add("compare", new)
        elif isinstance(node, ast.BinOp):
            swap = _BINOP_SWAPS.get(type(node.op))
            if swap:
                new = copy.deepcopy(node)
                new.op = swap()
                add("arithmetic", new)
            if isinstance(node.op, (ast.Sub, ast.Add)):
                add("drop operand", copy.deepcopy(node.left))
        elif isinstance(node, ast.AugAssign):
            swap = _BINOP_SWAPS.get(type(node.op))
            if swap:
                new = copy.deepcopy(node)
                new.op = swap()
                add("arithmetic", new)
            add("drop statement", "pass")
        elif isinstance(node, ast.BoolOp):
            new = copy.deepcopy(node)
            new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            add("and/or", new)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            add("drop unary", copy.deepcopy(node.operand))
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            add("flip bool", ast.Constant(not node.value))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            add("off by one", ast.Constant(node.value + 1))
            add("off by one", ast.Constant(node.value - 1))
        elif isinstance(node, ast.Attribute) and node.attr in _TWINS and \
                isinstance(node.ctx, ast.Load):
            new = copy.deepcopy(node)
            new.attr = _TWINS[node.attr]
            add("twin function", new)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            add("drop statement", "pass")
        elif isinstance(node, ast.List) and len(node.elts) >= 2:
            for i, item in enumerate(node.elts):
                if isinstance(item, (ast.Tuple, ast.Call)):
                    new = copy.deepcopy(node)
                    del new.elts[i]
                    self.add(function, node, "drop step", new)
                    self.mutants[-1].what = f"drop step: `{_short(item)}`"


def _called_name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) and \
        isinstance(statement.value.value, str)


def _functions(tree: ast.Module):
    """``(qualified name, node)`` of every top-level function and method."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def make_mutants(target: Target, only: set[str] | None = None,
                 operators: str = "all") -> list[Mutant]:
    """``operators``: "mechanical", "semantic" or "all" (the semantic ones: ``SEMANTIC``)."""
    if target.path.endswith(".cpp"):
        from mutation_cpp import make_cpp_mutants

        return make_cpp_mutants(target, only, ROOT, Mutant, operators)
    source = (ROOT / target.path).read_bytes()
    tree = ast.parse(source)
    collector = _Collector(target.path, source, operators=operators)
    functions = dict(_functions(tree))
    missing = set(target.functions or ()) - set(functions)
    if missing:
        raise SystemExit(f"mutation_test.py: {target.path} has no function(s) "
                         f"{sorted(missing)}: update TARGETS")
    for name, node in functions.items():
        if (target.functions is None or name in target.functions) and \
                (not only or name in only):
            collector.visit(name, node)
    # a semantic mutant that makes the same source as an earlier mutant is left out (`a + b`
    # -> `a` is also the mechanical drop operand): the mechanical mutants keep their keys
    made: set[bytes] = set()
    kept = []
    for mutant in collector.mutants:
        mutated = source[:mutant.start] + mutant.replacement.encode() + source[mutant.end:]
        if mutant.operator in SEMANTIC and mutated in made:
            continue
        made.add(mutated)
        kept.append(mutant)
    collector.mutants = kept
    seen: dict[str, int] = {}
    for mutant in collector.mutants:
        base = mutant.key  # twin is still 0: no suffix
        mutant.twin = seen.get(base, 0)
        seen[base] = mutant.twin + 1
    return collector.mutants


# --- running ----------------------------------------------------------------------------------

def _copy_tree(into: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.so", ".opforge-cache")
    for name in ("opforge", "tests", "fuzz"):  # fuzz/: the differential tester's tests use it
        shutil.copytree(ROOT / name, into / name, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", into / "pyproject.toml")


def _run_tests(tests: tuple[str, ...], timeout: float, log: Path) -> tuple[str, float]:
    """Fork a child running pytest on ``tests`` in the copy; its verdict and duration."""
    import pytest

    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: its own process group, so a timeout kills what it started
        code = 3
        try:
            os.setpgid(0, 0)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            code = pytest.main([*tests, "-x", "-q", "-p", "no:cacheprovider"])
        finally:
            os._exit(int(code))
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() - start > timeout:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return "timeout", time.perf_counter() - start
        time.sleep(0.01)
    seconds = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    # 0: every test passed; 1: a test failed; 2: collection failed (the mutant broke an
    # import); a signal (< 0: SIGSEGV, SIGABRT): the mutant crashed the tests, which kills it
    # too; 5: no test ran (a bad -k); anything else: pytest itself went wrong.
    verdict = {0: "survived", 1: "killed", 2: "killed"}.get(code)
    return verdict or ("killed" if code < 0 else f"error (exit {code})"), seconds


def run(targets: dict[str, Target], mutants: dict[str, list[Mutant]], results: Path) -> int:
    # Imported once here, shared by every forked child: torch alone takes ~2 s, and
    # pytest's hypothesis plugin imports hypothesis at the end of every session (~1 s).
    for name in ("numpy", "torch", "hypothesis", "hypothesis.strategies"):
        try:
            __import__(name)
        except ImportError:
            pass
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still remove the copy
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="opforge-mutants-"))
    try:
        _copy_tree(work)
        os.chdir(work)
        sys.path.insert(0, str(work))
        # child processes the tests start (hostile plans, sanitizer runs) import the copy too
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(work), *filter(None, [os.environ.get("PYTHONPATH")])])
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        log = work / "pytest.log"
        report: dict = {"command": " ".join(["scripts/mutation_test.py", *sys.argv[1:]]),
                        "commit": _commit(), "targets": {}, "mutants": []}
        total = sum(len(m) for m in mutants.values())
        try:
            _run_targets(targets, mutants, work, log, report, total)
        except (KeyboardInterrupt, SystemExit):  # SIGTERM too: what ran so far is written
            report["interrupted"] = True
    finally:
        os.chdir(ROOT)
        shutil.rmtree(work, ignore_errors=True)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    code = _summarise(report, results)
    return 143 if report.get("interrupted") else code


def _run_targets(targets: dict[str, Target], mutants: dict[str, list[Mutant]], work: Path,
                 log: Path, report: dict, total: int) -> int:
    """Each target: its clean run, then its mutants, each verdict added to ``report`` as
    it comes; how many mutants ran."""
    count = 0
    for name, target in targets.items():
        engine = None
        if target.path.endswith(".cpp"):  # the unmutated engine, for the clean run
            from mutation_cpp import EngineBuilder

            engine = EngineBuilder(work, work / target.path)
            engine.build()
        clean, seconds = _run_tests(target.tests, 600, log)
        if clean != "survived":
            print(f"{name}: the clean run does not pass ({clean}); skipped. pytest "
                  f"{' '.join(target.tests)}:\n{log.read_text()[-3000:]}", flush=True)
            report["targets"][name] = {"clean_run": clean}
            continue
        timeout = max(20.0, 4 * seconds)
        original = (work / target.path).read_bytes()
        for mutant in mutants[name]:
            count += 1
            mutated = original[:mutant.start] + mutant.replacement.encode() + \
                original[mutant.end:]
            (work / target.path).write_bytes(mutated)
            began = time.perf_counter()  # a C++ mutant's time includes its build
            try:
                if engine is not None and not engine.build():
                    mutant.status = "stillborn"
                else:
                    mutant.status, _ = _run_tests(target.tests, timeout, log)
                mutant.seconds = time.perf_counter() - began
            finally:
                (work / target.path).write_bytes(original)
            if mutant.status == "survived" and mutant.key in EQUIVALENT:
                mutant.status = "equivalent"
            print(f"[{count}/{total}] {mutant.status:10} {mutant.seconds:5.1f}s "
                  f"{mutant.path}:{mutant.line}  {mutant.key}", flush=True)
            report["mutants"].append({"target": name, "key": mutant.key, "line": mutant.line,
                                      "status": mutant.status,
                                      "seconds": round(mutant.seconds, 1)})
        if engine is not None:
            engine.build()  # the unmutated engine again, for the targets after this one
        statuses = [m.status for m in mutants[name]]
        report["targets"][name] = {
            "path": target.path, "tests": list(target.tests), "clean_run_s": seconds,
            **{s: statuses.count(s) for s in ("killed", "survived", "equivalent",
                                              "timeout", "stillborn")},
            "mutants": len(statuses),
        }
    return count


def _commit() -> str:
    """The checkout's commit, with "+changes" when its files differ from it."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                              text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain",
                                                                   "opforge", "tests") else "")


def _as_json(report: dict) -> str:
    """The report as JSON with one line per mutant (small, and diffs well)."""
    head = {k: v for k, v in report.items() if k != "mutants"}
    lines = ",\n".join("  " + json.dumps(m, ensure_ascii=False) for m in report["mutants"])
    return json.dumps(head, indent=1, ensure_ascii=False)[:-2] + \
        f',\n "mutants": [\n{lines}\n ]\n}}\n'


def _summarise(report: dict, results: Path) -> int:
    statuses = [m["status"] for m in report["mutants"]]
    verdicts = ("killed", "survived", "equivalent", "timeout", "stillborn")
    report["totals"] = {s: statuses.count(s) for s in verdicts}
    report["totals"]["mutants"] = len(statuses)
    report["totals"]["errors"] = len(statuses) - sum(report["totals"][s] for s in verdicts)
    report["equivalent_reasons"] = {m["key"]: EQUIVALENT[m["key"]] for m in report["mutants"]
                                     if m["status"] == "equivalent"}
    results.write_text(_as_json(report))
    print("\ntarget            mutants  killed  survived  equivalent  timeout")
    for name, t in report["targets"].items():
        if "mutants" in t:
            print(f"{name:17} {t['mutants']:7} {t['killed']:7} {t['survived']:9} "
                  f"{t['equivalent']:11} {t['timeout']:8}")
        else:
            print(f"{name:17} clean run: {t['clean_run']}")
    t = report["totals"]
    print(f"{'total':17} {t['mutants']:7} {t['killed']:7} {t['survived']:9} "
          f"{t['equivalent']:11} {t['timeout']:8}   ({report['wall_s'] / 60:.1f} min) -> {results}")
    for m in report["mutants"]:
        if m["status"] == "survived":
            print(f"  survived: line {m['line']}  {m['key']}")
    clean_failed = any("mutants" not in t for t in report["targets"].values())
    return 1 if t["survived"] or t["errors"] or clean_failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", action="append", choices=list(TARGETS),
                        help="a target to mutate (repeatable; default: all)")
    parser.add_argument("--function", action="append",
                        help="only these functions of the chosen targets (repeatable)")
    parser.add_argument("--mutant", action="append", metavar="KEY",
                        help="only the mutant with this key, as printed (repeatable): rerun "
                             "a survivor after adding the test that should kill it")
    parser.add_argument("--operators", choices=("all", "mechanical", "semantic"), default="all",
                        help="which mutation operators (default: all; semantic: the mistakes "
                             "of issue 45's kinds, see SEMANTIC)")
    parser.add_argument("--list", action="store_true", help="print the mutants; run nothing")
    parser.add_argument("--json", type=Path, default=Path("mutation-results.json"),
                        help="where the results go (default: ./mutation-results.json)")
    args = parser.parse_args(argv)
    targets = {name: TARGETS[name] for name in (args.target or TARGETS)}
    only = set(args.function) if args.function else None
    mutants = {name: make_mutants(t, only, args.operators) for name, t in targets.items()}
    if args.mutant:
        mutants = {name: [m for m in found if m.key in args.mutant]
                   for name, found in mutants.items()}
        unknown = set(args.mutant) - {m.key for found in mutants.values() for m in found}
        if unknown:
            raise SystemExit(f"mutation_test.py: no such mutant in the chosen targets: "
                             f"{sorted(unknown)}")
        targets = {name: t for name, t in targets.items() if mutants[name]}
    if not args.target and not only and not args.mutant and args.operators == "all":
        keys = {m.key for found in mutants.values() for m in found}
        for stale in sorted(set(EQUIVALENT) - keys):
            print(f"mutation_test.py: EQUIVALENT names no mutant (the code changed?): {stale}")
    if args.list:
        for name, found in mutants.items():
            for m in found:
                print(f"{name:16} {m.path}:{m.line}  {m.key}")
            print(f"{name}: {len(found)} mutants")
        return 0
    return run(targets, mutants, args.json.resolve())


if __name__ == "__main__":
    sys.exit(main())
