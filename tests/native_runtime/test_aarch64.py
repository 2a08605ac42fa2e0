"""The native runtime, its portable kernels, custom kernel libraries (manifest-style and
ExecuTorch-style sources) and a bundled app cross-compiled for aarch64 and run under
qemu-aarch64, against the lean runtime on this x86-64 machine (docs/arm.md).

Skipped, naming what is missing, without Debian's g++-aarch64-linux-gnu or qemu-user
(scripts/setup-cross.sh, run by scripts/test.sh, installs them where apt can). One cross
build of the runtime and its tools (build_runtime(target=...), cached like the x86 one)
serves every test; the bundle test builds its own app and is marked slow.

Tolerances, as test_native_parity.py's: float programs on the portable kernels sum their
matmuls, convolutions and reductions in another order than NumPy's BLAS (and aarch64's
GEMM is the 16-byte-vector copy with fused multiply-adds), float32 rounding of O(1) values:
rtol/atol 1e-5 (a wrong kernel moves them by O(0.1)); programs whose kernels do the same
element operations in the same order (the custom kernels, add, leaky_relu) give the same
bits; a decoder's greedy tokens are equal.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from opforge.errors import BuildError
from opforge.native_runtime.build import build_runtime, source_dir
from opforge.native_runtime.targets import FALLBACKS, find_target
from opforge.program import DoubleValue, IntValue, KernelCall, Method, Operator, Program, save
from opforge.runtime import load
from tests.native_runtime._native_programs import F32, _Arena

TARGET = "aarch64-linux-gnu"
_EM_AARCH64 = 183  # ELF e_machine of AArch64
_HERE = Path(__file__).resolve().parent
_ET = _HERE.parent / "native" / "executorch_kernels"
_X86_ONLY = re.compile(r"__x86_64__|__i386__|__SSE2__|__AVX|immintrin|target_clones")


@pytest.fixture(scope="session")
def arm():
    target = find_target(TARGET)
    reason = target.missing()
    if reason:
        pytest.skip(f"no aarch64 cross toolchain or emulator: {reason}")
    return target


@pytest.fixture(scope="session")
def arm_runtime(arm):
    """The runtime, its libraries and tools for aarch64 (one cached cross build)."""
    return build_runtime(target=TARGET)


@pytest.fixture(scope="session")
def qemu(arm):
    def run(*args, cwd=None, check=True):
        done = subprocess.run([*arm.emulator(), *map(str, args)], capture_output=True, text=True,
                              cwd=cwd, timeout=300, env={**os.environ, "OPFORGE_NUM_THREADS": "1"})
        if check:
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done
    return run


def _machine(path: Path) -> int:
    head = Path(path).read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and head[5] == 1  # little-endian ELF
    return int.from_bytes(head[18:20], "little")


def _close(want, got) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# --- the build report: no x86-only code without its portable path named -----------------------

def test_every_x86_only_source_is_in_the_build_report():
    """A source file with x86-only code (intrinsics, per-ISA copies, target_clones) must have
    its aarch64 path in targets.FALLBACKS, which the build reports print."""
    found = set()
    for part in ("src", "kernels"):
        for f in (source_dir() / part).rglob("*"):
            if f.suffix in (".cpp", ".h") and _X86_ONLY.search(f.read_text()):
                found.add(str(f.relative_to(source_dir())))
    assert found == {f.source for f in FALLBACKS}


def test_unknown_targets_and_host_only_inputs_are_refused(tmp_path):
    from opforge.native import build_library
    from opforge.native_runtime.bundle import bundle
    from tests.native_runtime._native_programs import add_program

    with pytest.raises(BuildError, match=r"target 'riscv64' — unknown — valid: aarch64-linux-gnu"):
        build_runtime(target="riscv64")
    save(add_program(), tmp_path / "add.opf")
    with pytest.raises(BuildError, match=r"libraries built for this machine .* --kernel-sources"):
        bundle([tmp_path / "add.opf"], tmp_path / "app", kernels=[tmp_path / "add.opf"],
               target=TARGET, portable_keys=())
    with pytest.raises(BuildError, match=r"-march=native — describes this machine"):
        build_library(_ET / "custom_ops.yaml", [_ET / "custom_ops_1_out.cpp"],
                      tmp_path / "lib.so", extra_flags=("-march=native",), target=TARGET)
    assert not (tmp_path / "app").exists()


def test_cross_built_runtime_is_aarch64_and_reports_its_paths(arm_runtime):
    for f in (arm_runtime.runtime_library, arm_runtime.portable_library,
              arm_runtime.tool("opforge-run"), arm_runtime.tool("opforge-generate")):
        assert _machine(f) == _EM_AARCH64, f
    report = arm_runtime.report.read_text()
    assert report.startswith(f"target: {TARGET}")
    for fallback in FALLBACKS:
        assert fallback.line() in report
    assert "slower than on x86-64" in report and "kernels/ops/quantized_common.h" in report


# --- programs under qemu against the lean runtime ---------------------------------------------

@pytest.fixture(scope="session")
def zoo_programs():
    """Every zoo model exported for the portable kernels (no delegate), with its inputs."""
    torch = pytest.importorskip("torch")
    from opforge.examples.zoo import ZOO
    from opforge.export import export

    programs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, factory in ZOO.items():
            model, example = factory()
            inputs = [np.asarray(a.numpy() if isinstance(a, torch.Tensor) else a) for a in example]
            programs[name] = (export(model, example), inputs)
    return programs


def _run_program(qemu, runtime, program, inputs, folder: Path, *libraries) -> list[np.ndarray]:
    folder.mkdir()
    save(program, folder / "model.opf")
    args = []
    for i, a in enumerate(inputs):
        np.save(folder / f"in{i}.npy", a)
        args += ["--input", folder / f"in{i}.npy"]
    for lib in libraries:
        args += ["--kernels", lib]
    qemu(runtime.tool("opforge-run"), folder / "model.opf", *args, "--output-dir", folder / "out")
    count = len(list((folder / "out").glob("output_*.npy")))
    return [np.load(folder / "out" / f"output_{j}.npy") for j in range(count)]


def test_every_zoo_program_matches_lean_under_qemu(tmp_path, qemu, arm_runtime, zoo_programs):
    for name, (program, inputs) in zoo_programs.items():
        want = [np.asarray(w) for w in load(program).method("forward")(*inputs)]
        got = _run_program(qemu, arm_runtime, program, inputs, tmp_path / name)
        assert len(got) == len(want), name
        for w, g in zip(want, got):
            _close(w, g)


def test_quantized_zoo_programs_give_lean_bits_under_qemu(tmp_path, qemu, arm_runtime):
    """8a8w and 16a4w programs on the portable kernels: integer Q/DQ around the float ops,
    the same bits as on x86-64 (the quantize kernel's scalar aarch64 path included)."""
    pytest.importorskip("torch")
    from opforge.examples.zoo import ZOO
    from tests.quantize.quantize_support import quantized_zoo

    for name in ("mlp",):  # cnn's quantized programs too, measured once: the same bits
        inputs = [x.numpy() for x in ZOO[name]()[1]]
        for scheme in ("8a8w", "16a4w"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                program = quantized_zoo(name, scheme).export(backends=[])
            want = [np.asarray(w) for w in load(program).method("forward")(*inputs)]
            got = _run_program(qemu, arm_runtime, program, inputs, tmp_path / f"{name}-{scheme}")
            assert [g.tobytes() for g in got] == [w.tobytes() for w in want], (name, scheme)


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_decoder_greedy_tokens_under_qemu(tmp_path, qemu, arm_runtime, kind):
    pytest.importorskip("torch")
    from opforge.runtime.generate import Generator
    from tests.native_runtime.test_native_parity import PROMPT, _export_decoder

    program = _export_decoder(kind, [])
    save(program, tmp_path / "decoder.opf")
    done = qemu(arm_runtime.tool("opforge-generate"), tmp_path / "decoder.opf", "--tokens",
                ",".join(map(str, PROMPT)), "--max-new-tokens", 10, "--json")
    tokens = json.loads(done.stdout)["tokens"]
    want = Generator(load(program)).generate(PROMPT, 10).tokens
    assert tokens == list(want) and len(want) == 10


# --- custom kernels: a manifest library and ExecuTorch-style sources ----------------------------

def _custom_program(shape=(3, 5)) -> Program:
    """y = leaky_relu(mul3(x), 0.125) + x: my_ops::mul3 (manifest kernels), et_ops::leaky_relu
    (ExecuTorch-style sources) and the portable aten::add."""
    arena = _Arena()
    x, a, b, y = (arena.tensor(F32, shape) for _ in range(4))
    values = (x, a, DoubleValue(0.125), b, IntValue(1), y)
    ops = (Operator("my_ops::mul3", "out"), Operator("et_ops::leaky_relu", "out"),
           Operator("aten::add", "out"))
    code = (KernelCall(0, (0, 1)), KernelCall(1, (1, 2, 3)), KernelCall(2, (3, 0, 4, 5)))
    return Program(methods=(Method("forward", values, (0,), (5,), code, ops, arena.plan()),))


def _kernel_sources():
    from opforge.examples.my_ops import manifest_path
    from opforge.native_runtime.bundle import KernelSources

    return [KernelSources(manifest_path(), (manifest_path().with_name("kernels") / "mul.cpp",)),
            KernelSources(_ET / "custom_ops.yaml", (_ET / "op_leaky_relu.cpp",))]


def _host_libraries(folder: Path, target: str | None = None) -> list[Path]:
    from opforge.native import build_library

    folder.mkdir(exist_ok=True)
    ops = (["my_ops::mul3"], ["et_ops::leaky_relu"])  # the ops whose sources are given
    return [build_library(spec.manifest, spec.sources, folder / f"lib{i}.so", ops=ops[i],
                          target=target, progress=False).path
            for i, spec in enumerate(_kernel_sources())]


def _custom_input() -> np.ndarray:
    return np.random.default_rng(5).standard_normal((3, 5)).astype(np.float32)


def test_custom_kernel_libraries_cross_built_match_lean_under_qemu(tmp_path, qemu, arm_runtime):
    program, x = _custom_program(), _custom_input()
    (want,) = load(program, kernels=_host_libraries(tmp_path / "host")).method("forward")(x)
    arm_libs = _host_libraries(tmp_path / "arm", TARGET)
    assert [_machine(lib) for lib in arm_libs] == [_EM_AARCH64] * 2
    (got,) = _run_program(qemu, arm_runtime, program, [x], tmp_path / "run", *arm_libs)
    assert got.tobytes() == np.asarray(want).tobytes()  # the same float32 operations


@pytest.mark.slow  # CMake cross-compiles the app's runtime and kernels (~2-4 min on 2 busy cores)
def test_bundle_cross_compiles_and_its_app_matches_lean_under_qemu(tmp_path, qemu, arm):
    from opforge.native_runtime.bundle import bundle
    from opforge.native_runtime.bundle_build import build_bundle, stripped_size

    program, x = _custom_program(), _custom_input()
    save(program, tmp_path / "custom.opf")
    written = bundle([tmp_path / "custom.opf"], tmp_path / "app", target=TARGET,
                     kernel_sources=_kernel_sources())
    assert written.selected == ("aten::add.out",) and len(written.libraries) == 2
    assert "SLOWER" in written.report.read_text()
    app = build_bundle(written, "MinSizeRel")
    assert _machine(app) == _EM_AARCH64
    assert [_machine(written.path / lib) for lib in written.libraries] == [_EM_AARCH64] * 2
    assert 0 < stripped_size(app, TARGET) < app.stat().st_size

    x.tofile(tmp_path / "x.bin")
    qemu(app, tmp_path / "x.bin", cwd=tmp_path)
    got = np.fromfile(tmp_path / "output_0.bin", np.float32).reshape(x.shape)
    (want,) = load(program, kernels=_host_libraries(tmp_path / "host")).method("forward")(x)
    assert got.tobytes() == np.asarray(want).tobytes()
    text = app.read_bytes()  # selective: kernels nobody calls are not in the app
    assert b"aten::add.out" in text and b"aten::convolution.out" not in text


def test_bundle_for_aarch64_refuses_cpu_delegates(tmp_path):
    pytest.importorskip("torch")
    from opforge.backends import get_backend
    from opforge.native_runtime.bundle import bundle
    from tests.native_runtime.test_native_bundle import _ConvLinear

    if get_backend("cpu").unavailable() is not None:
        pytest.skip("the cpu backend cannot export here")
    program, _ = _ConvLinear.program()
    save(program, tmp_path / "net.opf")
    with pytest.raises(BuildError, match=r"--target aarch64-linux-gnu — the programs hold cpu "
                                         r"delegates"):
        bundle([tmp_path / "net.opf"], tmp_path / "app", target=TARGET, portable_keys=())
    assert not (tmp_path / "app").exists()
