"""What the numbers were measured on: CPU, cores, memory, load, and every peer's version."""

from __future__ import annotations

import importlib.metadata as md
import os
import pathlib
import platform
import re
import subprocess

__all__ = ["describe_machine", "machine_slug"]

PEERS = ("opforge", "numpy", "torch", "onnxruntime", "onnx", "onnxscript", "executorch", "matplotlib")


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# the instruction-set extensions that decide which kernels a runtime can pick
FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
         "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "asimd", "sve")


def _cpuinfo_field(name: str) -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == name:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def machine_slug(machine: dict) -> str:
    """A short name for the kind of machine, for per-machine result files: AMD's Zen
    generation from the CPU family and AVX-512 (a virtual machine often reports only
    "AMD EPYC"), else the model name's words."""
    cpu, flags = machine["cpu"].lower(), set(machine.get("flags", []))
    if "amd" in cpu and machine.get("cpu_family"):
        zen = {"23": "zen2", "25": "zen4" if "avx512f" in flags else "zen3", "26": "zen5"}
        if machine["cpu_family"] in zen:
            return "-".join(w for w in ("amd", "epyc" if "epyc" in cpu else "",
                                        zen[machine["cpu_family"]]) if w)
    words = re.findall(r"[a-z0-9]+", re.sub(r"\(r\)|\(tm\)|cpu|processor|@.*", "", cpu))
    return "-".join(words[:5]) or "unknown"


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
        "cpu_family": _cpuinfo_field("cpu family"),
        "flags": [f for f in FLAGS if f in _cpuinfo_field("flags").split()
                  or f in _cpuinfo_field("Features").split()],
        "cores": os.cpu_count(),
        "memory_gib": round(_memory_gib(), 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "opforge_commit": _git_commit(root),
        "versions": versions,
    }
