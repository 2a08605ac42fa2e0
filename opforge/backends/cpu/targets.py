"""Which machines the cpu backend delegates for: the export's target (``opforge export
--target``, ``CpuBackend(target=...)``) against the engines opforge builds.

The engine (native/) is built for the machine that runs opforge, against oneDNN 3 (the
``onednn-cpu-gomp`` wheels). For another target the export keeps every op on the
portable kernels and says why for each node (``--explain``). Today that is aarch64: opforge
neither builds nor bundles an arm64 engine, because the oneDNN with the v3 API it needs is
not packaged for arm64 where opforge builds (looked up on 2026-12-07; docs/backend-cpu.md
"aarch64"):

- Debian bookworm (12, this project's build machines; bookworm-backports has none): arm64
  ``libdnnl-dev`` 2.6.3-1, the v2 API: the engine's sources give 31 errors against its
  headers (v3 makes primitive descriptors from the engine, without v2's op descriptors);
- PyPI: ``onednn-cpu-gomp`` / ``onednn-devel-cpu-gomp`` publish x86-64 wheels only;
- Debian trixie (13): arm64 ``libdnnl-dev`` / ``libdnnl3.6`` 3.7.2+ds-2, the v3 API, built
  against glibc 2.38+ and libstdc++ 14, so not installable on bookworm. The engine does
  build and run against it: scripts/engine_aarch64.py cross-compiles it (its x86 vector
  kernels are chosen at run time and left out on aarch64, every one with a plain or oneDNN
  path) and runs the zoo's delegated programs under qemu-aarch64 within the native
  runtime's parity tolerance of the x86 lean outputs.
"""

from __future__ import annotations

import platform

from opforge.errors import BackendError

__all__ = ["TARGETS", "host_target", "check_target", "foreign_reason"]

# the targets an export may name (GNU triples, as `opforge bundle --target`)
TARGETS = ("x86_64-linux-gnu", "aarch64-linux-gnu")

_NO_ENGINE = {
    "aarch64-linux-gnu": (
        "target aarch64-linux-gnu: opforge ships no cpu engine for arm64 (it needs oneDNN's v3 "
        "API: Debian bookworm's arm64 libdnnl-dev is 2.6.3, v2; PyPI's onednn wheels are "
        "x86-64 only; trixie's 3.7.2 needs glibc >= 2.38)"),
    "x86_64-linux-gnu": (
        "target x86_64-linux-gnu: the cpu backend's engine is built for this machine "
        "({host}) only"),
}


def host_target() -> str:
    """This machine's triple: ``x86_64-linux-gnu``, ``aarch64-linux-gnu`` or ``<machine>-linux-gnu``."""
    machine = platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return f"{machine}-linux-gnu"


def check_target(target: str | None, api: str) -> str | None:
    """``target`` checked (None: this machine); ``BackendError`` names the valid ones."""
    if target is None or target == host_target():
        return None
    if target not in TARGETS:
        raise BackendError(f"{api}: target {target!r} — unknown — valid: {', '.join(TARGETS)} "
                           f"(or none: this machine, {host_target()}) — fix: name one of them")
    return target


def foreign_reason(target: str, *, every: bool = False) -> str:
    """Why the cpu backend delegates nothing for ``target`` (a checked foreign one): one
    node's reason, or (``every``) the export's summary line."""
    which = "every op stays" if every else "the op stays"
    return f"{_NO_ENGINE[target].format(host=host_target())} — {which} on the portable kernels"
