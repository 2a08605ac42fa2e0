"""Targets and platforms an op package can be built for, and this machine's platform
(standard library only: the run-time loader needs it)."""

from __future__ import annotations

import platform as _platform

__all__ = ["TARGETS", "PLATFORMS", "host_platform"]

TARGETS = ("cpu", "htp", "dsp", "gpu", "lpai")
PLATFORMS = ("x86_64", "aarch64_android", "aarch64")


def host_platform() -> str:
    """This machine's platform name as ``OpPackageInfo.platform`` spells it ("x86_64")."""
    machine = _platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
