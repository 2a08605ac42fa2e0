"""What the numbers were measured on: CPU, cores, memory, load, and every peer's version."""

from __future__ import annotations

import importlib.metadata as md
import os
import pathlib
import platform
import subprocess

__all__ = ["describe_machine"]

PEERS = ("opforge", "numpy", "torch", "onnxruntime", "onnx", "onnxscript", "executorch", "matplotlib")


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def _git_commit(root: pathlib.Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def describe_machine(root: pathlib.Path) -> dict:
    versions = {}
    for name in PEERS:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(_memory_gib(), 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "opforge_commit": _git_commit(root),
        "versions": versions,
    }
