"""One module-lookup rule for every verb: the current directory first (issue 16, item 6),
`@opforge.op` modules accepted where a manifest is (item 3), and tables that keep whole
names when stdout is not a terminal (item 7).

The verbs run as the installed `opforge` console script in a temp directory holding the
user's module, with no PYTHONPATH: the console script's own directory is sys.path[0], so
before the rule, `opforge run --kernels localreg:register` could not import `localreg`.
The torch verbs (export) are in tests/torch, the compiler ones (build, check) in tests/native.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opforge.program import (ArenaStorage, KernelCall, MemoryPlan, Method, Operator, Program,
                             ScalarType, TensorValue, save)

LONG = "lookup::" + "a_rather_long_operator_name_that_a_table_would_cut_" * 2 + "end"

OPS = textwrap.dedent(f'''
    import opforge

    @opforge.op("lookup::twice(Tensor x) -> Tensor")
    def twice(x):
        return x * 2

    @opforge.op("{LONG}(Tensor x) -> Tensor")
    def long_name(x):
        return x
''')

REGISTRAR = textwrap.dedent('''
    def negate(x, out):
        out[...] = -x

    def register(registry):
        registry.register("lookup::negate.out", negate, origin=__name__, target="portable")
''')


def opforge_command() -> list[str]:
    script = Path(sys.executable).parent / "opforge"
    if not script.exists():
        found = shutil.which("opforge")
        if found is None:
            pytest.skip("the opforge console script is not installed")
        script = Path(found)
    return [str(script)]


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.pop("COLUMNS", None)
    return subprocess.run([*opforge_command(), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "localops.py").write_text(OPS)
    (tmp_path / "localreg.py").write_text(REGISTRAR)
    return tmp_path


def test_manifest_lists_the_ops_of_a_local_module(project):
    proc = run_cli(project, "manifest", "localops", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["op"] for r in rows] == ["lookup::twice", LONG]
    assert rows[0]["python"] == "localops:twice"


def test_manifest_lists_the_ops_of_a_python_file(project, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    proc = run_cli(elsewhere, "manifest", str(project / "localops.py"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert [r["op"] for r in json.loads(proc.stdout)][0] == "lookup::twice"


def test_manifest_table_keeps_long_names_in_a_pipe(project):
    proc = run_cli(project, "manifest", "localops")
    assert proc.returncode == 0, proc.stderr
    assert LONG in proc.stdout, proc.stdout
    assert "…" not in proc.stdout


def test_run_imports_a_registrar_from_the_current_directory(project):
    x = TensorValue(ScalarType.FLOAT32, (3,), storage=ArenaStorage(0, 0))
    y = TensorValue(ScalarType.FLOAT32, (3,), storage=ArenaStorage(0, 64))
    save(Program(methods=(Method("forward", (x, y), (0,), (1,), (KernelCall(0, (0, 1)),),
                                 (Operator("lookup::negate", "out"),), MemoryPlan((128,))),)),
         project / "negate.opf")
    proc = run_cli(project, "run", "negate.opf", "--kernels", "localreg:register")
    assert proc.returncode == 0, proc.stderr
    assert "float32" in proc.stdout


def test_the_rule_is_in_every_verbs_help():
    proc = run_cli(Path.cwd(), "--help")
    assert "current directory first" in " ".join(proc.stdout.split())


def test_signature_reads_a_local_module(project):
    (project / "cppops.py").write_text(textwrap.dedent('''
        import opforge
        from opforge.manifest import KernelBinding

        @opforge.op("lookup::thrice(Tensor x) -> Tensor",
                    kernels=[KernelBinding("custom::thrice_out")])
        def thrice(x):
            return x * 3
    '''))
    proc = run_cli(project, "signature", "cppops")
    assert proc.returncode == 0, proc.stderr
    assert "custom::native::thrice_out(" in proc.stdout
