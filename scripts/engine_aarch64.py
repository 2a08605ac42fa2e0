"""The cpu backend's engine on aarch64, checked under qemu-aarch64 (docs/backend-cpu.md
"aarch64").

    python scripts/engine_aarch64.py [--work DIR] [--runtime PATH] [--programs mlp,cnn]

1. a sysroot of Debian 13 (trixie) arm64 packages in DIR/sysroot: oneDNN with the v3 API
   (``libdnnl-dev``, ``libdnnl3.6``) and the C/C++ runtime it was built against (glibc
   2.41, libstdc++ 14), fetched with a private apt configuration (nothing on this machine
   changes: no ``dpkg --add-architecture``, no new source list). Debian bookworm's arm64
   oneDNN is 2.6.3 (the v2 API the engine does not compile against) and PyPI's oneDNN
   wheels are x86-64 only, so this is the one packaged oneDNN 3 for arm64;
2. the engine cross-compiled from opforge/backends/cpu/native with the flags of
   engine_build.py (its x86 vector kernels are left out by ``#if defined(__x86_64__)``: the
   plain loops and oneDNN's primitives run instead) into DIR/libopforge_cpu.aarch64.<hash>.so;
3. an aarch64 ``opforge-run`` (``--runtime``, else built with CMake and
   opforge/native_runtime/cmake/aarch64-linux-gnu.cmake into DIR/runtime);
4. every zoo program (and QUANTIZED: three of them quantized 8a8w) exported with
   ``backends=["cpu"]`` here, run by that ``opforge-run``
   under ``qemu-aarch64 -L DIR/sysroot`` with ``OPFORGE_CPU_ENGINE`` set to the engine, its
   outputs compared with the lean runtime's on this machine (which runs the x86 engine):
   1e-5 relative and absolute, the native runtime's parity tolerance (the engines run other
   kernels: AVX-512 here, oneDNN's aarch64 code or plain loops there); and the parity
   suite's decoder (static and dynamic) delegated: ``opforge-generate``'s 10 greedy tokens
   under qemu equal to the lean runtime's. Exit 1 on a mismatch.

tests/backends/test_cpu_aarch64.py runs step 4 when OPFORGE_AARCH64_WORK names a DIR this
script has filled (it skips otherwise: steps 1-3 take minutes and the network).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Debian trixie's arm64 packages: oneDNN 3 and what it links (libc6 >= 2.38, libstdc++6 >= 14)
PACKAGES = ("libdnnl-dev", "libdnnl3.6", "libc6", "libstdc++6", "libgcc-s1", "libgomp1")
MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
CROSS = "aarch64-linux-gnu-"
TOLERANCE = 1e-5  # rtol and atol: tests/native_runtime/test_native_parity.py's


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if proc.returncode != 0:
        raise SystemExit(f"engine_aarch64: {' '.join(map(str, cmd[:4]))} ... failed "
                         f"(exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    return proc


def sysroot(work: Path) -> Path:
    """DIR/sysroot holding the trixie arm64 packages (made once); prints their versions."""
    root = work / "sysroot"
    if (root / "usr/include/oneapi/dnnl/dnnl.hpp").is_file():
        return root
    apt = work / "apt"
    for sub in ("state/lists/partial", "cache/archives/partial", "debs"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    (apt / "sources.list").write_text(f"deb [arch=arm64 signed-by={KEYRING}] {MIRROR} trixie main\n")
    opts = [f"-oDir::State={apt / 'state'}", f"-oDir::Cache={apt / 'cache'}",
            f"-oDir::Etc::SourceList={apt / 'sources.list'}", "-oDir::Etc::SourceParts=/nonexistent",
            "-oAPT::Architectures::=arm64", "-oDebug::NoLocking=1", "-oAPT::Sandbox::User=root"]
    _run(["apt-get", *opts, "update"])
    _run(["apt-get", *opts, "download", *(f"{p}:arm64" for p in PACKAGES)], cwd=apt / "debs")
    tmp = Path(tempfile.mkdtemp(prefix=".sysroot.", dir=work))
    for deb in sorted((apt / "debs").glob("*.deb")):
        print(f"  {deb.name}")
        _run(["dpkg-deb", "-x", str(deb), str(tmp)])
    (tmp / "lib").symlink_to("usr/lib")  # the interpreter's path, /lib/ld-linux-aarch64.so.1
    os.replace(tmp, root)
    return root


def engine(work: Path, root: Path) -> Path:
    """The engine cross-compiled against the sysroot's oneDNN (made once per source hash)."""
    from opforge.backends.cpu import engine_build as eb

    target = work / f"libopforge_cpu.aarch64.{eb.source_hash()}.so"
    if target.is_file():
        return target
    lib = root / "usr/lib/aarch64-linux-gnu"
    sources = [str(p) for p in eb.source_files() if p.suffix == ".cpp"]
    print(f"  compiling {len(sources)} sources with {CROSS}g++ (minutes)")
    built = eb.compile_into(target, lambda tmp: [
        f"{CROSS}g++", *eb.FLAGS, f"-I{root / 'usr/include'}", *(f"-I{d}" for d in eb.include_dirs()),
        "-o", tmp, *sources, f"-L{lib}", "-ldnnl"], SystemExit, "libopforge_cpu.aarch64.*.so")
    assert built is not None
    return built


def runtime(work: Path) -> Path:
    """opforge-run for aarch64, built with the native runtime's toolchain file."""
    build = work / "runtime"
    toolchain = ROOT / "opforge/native_runtime/cmake/aarch64-linux-gnu.cmake"
    if not toolchain.is_file():
        raise SystemExit(f"engine_aarch64: {toolchain} is missing — pass --runtime PATH to an "
                         "aarch64 opforge-run")
    _run(["cmake", "-S", str(ROOT / "opforge/native_runtime"), "-B", str(build), "-G", "Ninja",
          f"-DCMAKE_TOOLCHAIN_FILE={toolchain}", "-DCMAKE_BUILD_TYPE=Release"])
    _run(["cmake", "--build", str(build), "--target", "opforge-run", "opforge-generate"])
    return build / "opforge-run"


# quantized zoo programs (NAME@SCHEME, quantized as tests/quantize does): the engine's
# int8 kernels and its quantize loops, which aarch64 runs without their SSE2/AVX-512 paths
QUANTIZED = ("mlp@8a8w", "cnn@8a8w", "depthwise_separable@8a8w")


def delegated_program(name: str):
    """(program exported with backends=["cpu"], example inputs) for zoo NAME or NAME@SCHEME."""
    import warnings

    from opforge.examples.zoo import ZOO
    from opforge.export import export

    base, _, scheme = name.partition("@")
    module, inputs = ZOO[base]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if scheme:
            from tests.quantize.quantize_support import quantized_zoo

            return quantized_zoo(base, scheme).export(backends=["cpu"]), inputs
        return export(module.eval(), inputs, backends=["cpu"]), inputs


def check_program(name: str, work: Path, root: Path, engine_path: Path, run: Path) -> tuple[bool, str]:
    """Zoo program ``name`` delegated to cpu: lean here vs opforge-run under qemu-aarch64."""
    import numpy as np

    from opforge.export import delegation_report
    from opforge.program import save
    from opforge.runtime import load

    program, inputs = delegated_program(name)
    delegated = sum(d["nodes"] for d in delegation_report(program)["forward"]["delegates"])
    folder = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=work))
    save(program, folder / "program.opf")
    arrays = [x.numpy() for x in inputs]
    args = []
    for i, a in enumerate(arrays):
        np.save(folder / f"in{i}.npy", a)
        args += ["--input", str(folder / f"in{i}.npy")]
    want = [np.asarray(o) for o in load(program).method("forward")(*arrays)]
    env = dict(os.environ, OPFORGE_CPU_ENGINE=str(engine_path))
    proc = subprocess.run(["qemu-aarch64", "-L", str(root), str(run), str(folder / "program.opf"), *args,
                           "--output-dir", str(folder / "out")], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        return False, f"{name}: opforge-run failed (exit {proc.returncode}): {proc.stdout[-1500:]}"
    got = [np.load(folder / "out" / f"output_{i}.npy") for i in range(len(want))]
    worst = max(float(np.max(np.abs(g.astype(np.float64) - w), initial=0)) for g, w in zip(got, want))
    same = all(g.tobytes() == w.tobytes() for g, w in zip(got, want))
    ok = all(g.shape == w.shape and g.dtype == w.dtype and
             np.allclose(g, w, rtol=TOLERANCE, atol=TOLERANCE) for g, w in zip(got, want))
    shutil.rmtree(folder, ignore_errors=True)
    return ok, (f"{name:26s} {delegated:4d} nodes delegated  max |aarch64 - x86 lean| {worst:.3g}"
                f"{'  (same bits)' if same else ''}  {'ok' if ok else 'MISMATCH'}")


def check_decoder(kind: str, work: Path, root: Path, engine_path: Path, run: Path) -> tuple[bool, str]:
    """The native-runtime parity suite's decoder (``kind``: static or dynamic) delegated to
    cpu: 10 greedy tokens from ``opforge-generate`` (beside ``run``) under qemu-aarch64
    against the lean runtime's ``Generator`` here; the tokens must be equal."""
    import json

    from opforge.program import save
    from opforge.runtime import load
    from opforge.runtime.generate import Generator
    from tests.native_runtime.test_native_parity import PROMPT, _export_decoder

    program = _export_decoder(kind, ["cpu"])
    folder = Path(tempfile.mkdtemp(prefix=f"decoder-{kind}.", dir=work))
    save(program, folder / "decoder.opf")
    env = dict(os.environ, OPFORGE_CPU_ENGINE=str(engine_path))
    proc = subprocess.run(["qemu-aarch64", "-L", str(root), str(run.parent / "opforge-generate"),
                           str(folder / "decoder.opf"), "--tokens", ",".join(map(str, PROMPT)),
                           "--max-new-tokens", "10", "--json"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    shutil.rmtree(folder, ignore_errors=True)
    if proc.returncode != 0:
        return False, f"decoder ({kind}): opforge-generate failed (exit {proc.returncode}): {proc.stderr[-1500:]}"
    got = json.loads(proc.stdout)["tokens"]
    want = list(Generator(load(program)).generate(PROMPT, 10).tokens)
    ok = got == want and len(want) == 10
    return ok, f"{'decoder@' + kind:26s} greedy tokens {got} {'ok' if ok else f'MISMATCH: lean {want}'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache/opforge/aarch64")
    parser.add_argument("--runtime", type=Path, help="an aarch64 opforge-run (default: build one)")
    parser.add_argument("--programs", default="", help="zoo programs (NAME or NAME@SCHEME, "
                        "comma-separated; default: all and QUANTIZED)")
    args = parser.parse_args(argv)
    from opforge.examples.zoo import ZOO

    missing = [t for t in (f"{CROSS}g++", "qemu-aarch64", "apt-get", "dpkg-deb") if not shutil.which(t)]
    if missing:
        raise SystemExit(f"engine_aarch64: {', '.join(missing)} not on PATH — fix: scripts/setup-cross.sh "
                         "(g++-aarch64-linux-gnu, qemu-user) on Debian or Ubuntu")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    print("1. sysroot (Debian trixie arm64)")
    root = sysroot(work)
    print("2. engine")
    engine_path = engine(work, root)
    print(f"  {engine_path} ({engine_path.stat().st_size:,} bytes)")
    print("3. opforge-run")
    run = args.runtime.resolve() if args.runtime else runtime(work)
    print("4. zoo programs delegated to cpu, under qemu-aarch64")
    names = [n for n in args.programs.split(",") if n] or [*ZOO, *QUANTIZED]
    results = [check_program(n, work, root, engine_path, run) for n in names]
    if not args.programs:
        results += [check_decoder(k, work, root, engine_path, run) for k in ("static", "dynamic")]
    for _, line in results:
        print("  " + line)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
