"""Sizes of the native runtime as an app links it (issue 44's size target: a stripped core
of at most 300 KB on x86-64).

Three apps from `opforge bundle`, each built with CMake alone and stripped:

* core — a program with no kernel call (one Move): loader, verifier, executor, backend
  interface and main.c, no kernel;
* each zoo model (lean export, no delegation): the core plus the portable kernels it calls;
* all — the whole portable library (every family), as libopforge_runtime.a links.

With ``--delegated``, also a zoo model exported to the cpu backend: the app (runtime with
its cpu backend), the engine and oneDNN it carries in lib/, and the folder before building.

With ``--target aarch64-linux-gnu``, every app is cross-compiled (docs/arm.md) and stripped
with the target's own strip.

Prints bytes and the selected kernels' share (app minus core). Run:

    .venv/bin/python bench/native_runtime_size.py [--models mlp,cnn,...] [--target T]
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import tempfile
from pathlib import Path

from opforge.native_runtime.bundle import Bundle, bundle
from opforge.native_runtime.bundle_build import build_bundle, stripped_size
from opforge.program import ArenaStorage, MemoryPlan, Method, Move, Program, ScalarType, TensorValue, save


def _core_program() -> Program:
    x = TensorValue(ScalarType.FLOAT32, (4,), storage=ArenaStorage(0, 0))
    y = TensorValue(ScalarType.FLOAT32, (4,), storage=ArenaStorage(0, 64))
    return Program(methods=(Method("forward", (x, y), (0,), (1,), (Move(0, 1),), (), MemoryPlan((128,))),))


_OPTIONS: list[str] = []  # --cmake-arg


def _build(written: Bundle) -> int:
    return stripped_size(build_bundle(written, "MinSizeRel", options=_OPTIONS), written.target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn,transformer_layer,gpt_decoder")
    parser.add_argument("--delegated", default="", help="zoo models to bundle delegated to cpu")
    parser.add_argument("--target", default=None, help="cross-compile for this target")
    parser.add_argument("--cmake-arg", action="append", default=[],
                        help="a -D setting for every app, e.g. -DOPFORGE_MAX_PAGE_SIZE=4096")
    args = parser.parse_args()
    _OPTIONS.extend(args.cmake_arg)
    built_for = args.target or f"{platform.machine()} {platform.processor() or ''}"
    print(f"built for: {built_for}; CMAKE_BUILD_TYPE=MinSizeRel {' '.join(_OPTIONS)}, stripped")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        save(_core_program(), root / "core.opf")
        core = _build(bundle([root / "core.opf"], root / "core", target=args.target))
        print(f"{'app':<22} {'kernels':>8} {'bytes':>10} {'kernels bytes':>14}")
        print(f"{'core (no kernel)':<22} {0:>8} {core:>10,} {'-':>14}")
        from opforge.examples.zoo import ZOO
        from opforge.export import export

        for name in [m for m in args.models.split(",") if m]:
            model, example = ZOO[name]()
            save(export(model, example), root / f"{name}.opf")
            written = bundle([root / f"{name}.opf"], root / name, target=args.target)
            size = _build(written)
            print(f"{name:<22} {len(written.selected):>8} {size:>10,} {size - core:>14,}")
        for name in [m for m in args.delegated.split(",") if m]:
            _delegated(root, name, ZOO, export)


def _delegated(root: Path, name: str, zoo, export) -> None:
    model, example = zoo[name]()
    save(export(model.eval(), example, kernels="portable", backends=["cpu"]), root / f"{name}-cpu.opf")
    written = bundle([root / f"{name}-cpu.opf"], root / f"{name}-cpu")
    folder = sum(f.stat().st_size for f in written.path.rglob("*") if f.is_file())
    app = _build(written)
    engine, onednn = written.path / written.cpu.engine, written.path / written.cpu.onednn
    stripped = root / "engine.stripped"
    subprocess.run(["strip", "-o", str(stripped), str(engine)], check=True)
    print(f"{name} delegated to cpu ({len(written.selected)} portable kernels): app {app:,}; "
          f"engine {engine.stat().st_size:,} (stripped {stripped.stat().st_size:,}); "
          f"libdnnl.so.3 {onednn.stat().st_size:,}; folder before building {folder:,}")


if __name__ == "__main__":
    main()
