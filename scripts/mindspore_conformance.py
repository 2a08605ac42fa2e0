"""Run the same MindSpore AOT custom-op cases through a real MindSpore and through opforge,
and diff what each gives (outputs, or that it refused). Run on demand, never in CI:
MindSpore (2.10: an 800 MB wheel, 2.8 GB installed, numpy<2) lives in its own virtual
environment and is never a dependency of opforge.

    python -m venv /tmp/msvenv && /tmp/msvenv/bin/pip install mindspore==2.10.0 "numpy<2"
    python scripts/mindspore_conformance.py --mindspore-python /tmp/msvenv/bin/python \\
        --out docs/mindspore_conformance.md

Each case runs in its own child process on each side (a case that crashes one side is
reported as a crash, and the others still run). The kernels are compiled by each side
itself from tests/mindspore/kernels (``file.cc:Name``), with the stand-in of MindSpore's
header beside them where a case reads attributes. ``--side mindspore|opforge --case NAME``
runs one case and prints its JSON (what the parent does).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "tests" / "mindspore" / "kernels"

F32 = [["float32", "DefaultFormat"]]


def _reg(name, inputs, outputs, rows, attrs=()):
    """A reg_info dict as CustomRegOp builds it (both sides accept the dict)."""
    return {"op_name": name,
            "inputs": [{"index": i, "name": n, "paramType": "required"} for i, n in enumerate(inputs)],
            "outputs": [{"index": i, "name": n, "paramType": "required"} for i, n in enumerate(outputs)],
            "attr": [{k: v for k, v in zip(("name", "paramType", "type", "defaultValue", "value"), a)
                     if v is not None} for a in attrs],
            "fusion_type": "", "dtype_format": [[tuple(p) for p in row] for row in rows],
            "target": "CPU"}


# name -> (func file:Name relative to the work folder, out_shape, out_dtype, reg_info,
#          inputs as (values, dtype), prim attrs)
CASES = {
    "add_lambdas_no_reg_info": ("plain_add.cc:PlainAdd", "same", "same", None,
                                [([1.5, 2.0, -3.0], "float32"), ([1.0, 1.0, 1.0], "float32")], {}),
    "add_fixed_out_shape_no_reg_info": ("plain_add.cc:PlainAdd", [3], "float32", None,
                                        [([1.5, 2.0, -3.0], "float32"), ([1.0, 1.0, 1.0], "float32")], {}),
    "add_float16_into_float32_row": ("plain_add.cc:PlainAdd", "same", "same",
                                     _reg("PlainAdd", ["x", "y"], ["z"], [F32 * 3]),
                                     [([1.5, 2.25], "float16"), ([1.0, 1.0], "float16")], {}),
    "add_wrong_input_count": ("plain_add.cc:PlainAdd", "same", "same",
                              _reg("PlainAdd", ["x", "y"], ["z"], [F32 * 3]),
                              [([1.0, 2.0], "float32")], {}),
    "attrs_string_defaults_mindspore_header": (
        "mindspore_layout/attrs_kernel.cc:AttrsKernel", "same", "same",
        _reg("AttrsKernel", ["x"], ["y"], [F32 * 2],
             [("scale", "required", "float", "2.5"), ("bias", "required", "int", "3"),
              ("flip", "required", "bool", "false"),
              ("mode", "required", "str", "a string longer than fifteen characters"),
              ("weights", "required", "listFloat", "0.5,1.5")]),
        [([0.0, 1.0, -2.0], "float32")], {"grid": [[1, 2], [3]]}),
    "attrs_typed_values": (
        "mindspore_layout/attrs_kernel.cc:AttrsKernel", "same", "same",
        _reg("AttrsKernel", ["x"], ["y"], [F32 * 2],
             [("scale", "required", "float", None, 2.5), ("bias", "required", "int", None, 3),
              ("flip", "required", "bool", None, False),
              ("mode", "required", "str", None, "a string longer than fifteen characters"),
              ("weights", "required", "listFloat", None, [0.5, 1.5])]),
        [([0.0, 1.0, -2.0], "float32")], {"grid": [[1, 2], [3]]}),
    "attrs_string_values": (
        "mindspore_layout/attrs_kernel.cc:AttrsKernel", "same", "same",
        _reg("AttrsKernel", ["x"], ["y"], [F32 * 2],
             [("scale", "required", "float", None, "2.5"), ("bias", "required", "int", None, "3"),
              ("flip", "required", "bool", None, "false"),
              ("mode", "required", "str", None, "a string longer than fifteen characters"),
              ("weights", "required", "listFloat", None, "0.5,1.5")]),
        [([0.0, 1.0, -2.0], "float32")], {"grid": [[1, 2], [3]]}),
    "attrs_add_prim_attr": (
        "mindspore_layout/attrs_kernel.cc:AttrsKernel", "same", "same",
        _reg("AttrsKernel", ["x"], ["y"], [F32 * 2]), [([0.0, 1.0, -2.0], "float32")],
        {"scale": 2.0, "bias": 1, "flip": True, "mode": "short", "weights": [1.0],
         "grid": [[1]]}),
    "attrs_missing_one": (
        "mindspore_layout/attrs_kernel.cc:AttrsKernel", "same", "same",
        _reg("AttrsKernel", ["x"], ["y"], [F32 * 2],
             [("scale", "required", "float", None, 2.5), ("flip", "required", "bool", None, False),
              ("mode", "required", "str", None, "m"),
              ("weights", "required", "listFloat", None, [0.5])]),
        [([0.0, 1.0, -2.0], "float32")], {"grid": [[1]]}),
    "kernel_writes_past_its_output": ("bad_writes.cc:OverCustom", "same", "same", None,
                                      [([1.0, 2.0, 3.0, 4.0, 5.0], "float32")], {}),
    "kernel_writes_half_its_output": ("bad_writes.cc:UnderCustom", "same", "same", None,
                                      [([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "float32")], {}),
}


# CustomRegOp chains, evaluated on each side with its CustomRegOp and DataType: the same
# dictionary from get_op_info(), or both refuse
CHAINS = [
    'CustomRegOp()',
    'CustomRegOp("A").input(0, "x").input(1, "y").output(0, "z")'
    '.dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default).target("CPU")',
    'CustomRegOp("A").input()',
    'CustomRegOp("A").input(0, "x", None)',
    'CustomRegOp("A").input(0, "x-1").output(0, "y 2")',
    'CustomRegOp("A").output(1, "y", "optional", shape="all")',
    'CustomRegOp("A").attr("s", "required", "float", "1.0")',
    'CustomRegOp("A").attr("s", "required", "float", "1.0", value="2")',
    'CustomRegOp("A").attr()',
    'CustomRegOp("A").fusion_type("OPAQUE")',
    'CustomRegOp("A").target()',
    'CustomRegOp("A").input(0, "x").output(0, "y")'
    '.dtype_format(DataType.F32_Default_Tuple, DataType.F16_5HD)',
    'CustomRegOp("A").target(3)',
    'CustomRegOp("A").attr("s", "required", "float", 1.0)',
    'CustomRegOp("A").input(0, "x").output(0, "y").dtype_format(DataType.F32_Default)',
    'CustomRegOp("A").dtype_format("float32")',
    'CustomRegOp(3)',
    'CustomRegOp("A").input(0, "x", "sometimes")',
    'CustomRegOp("A").input(True, "x")',
]


def run_registration(side: str) -> dict:
    """Every chain's get_op_info() (or its refusal) and every DataType name's value."""
    if side == "mindspore":
        from mindspore.ops import CustomRegOp, DataType
    else:
        from opforge.mindspore import CustomRegOp, DataType
    chains = {}
    for chain in CHAINS:
        try:
            info = eval(chain, {"CustomRegOp": CustomRegOp, "DataType": DataType}).get_op_info()
            chains[chain] = json.loads(json.dumps(info))
        except Exception as e:  # noqa: BLE001 - the refusal is the result
            chains[chain] = f"refused: {type(e).__name__}"
    names = {k: list(v) for k, v in vars(DataType).items() if not k.startswith("_")}
    return {"chains": chains, "data_types": names}


# two libraries exporting one kernel name (AddK: + in k1, * in k2), both defined, then
# both called: each must keep its own library
_ADDK = """#include <stdint.h>
extern "C" int AddK(int nparam, void** params, int* ndims, int64_t** shapes,
                    const char** dtypes, void* stream, void* extra) {
  int64_t n = 1;
  for (int d = 0; d < ndims[2]; ++d) n *= shapes[2][d];
  const float* a = static_cast<const float*>(params[0]);
  const float* b = static_cast<const float*>(params[1]);
  float* z = static_cast<float*>(params[2]);
  for (int64_t i = 0; i < n; ++i) z[i] = a[i] OP b[i];
  return 0;
}
"""
for _name, _files in (("same_symbol_two_libraries", ("addk1.cc", "addk2.cc")),
                      ("same_symbol_two_files_of_one_name", ("addk.cc", "addk.cc"))):
    CASES[_name] = (f"<two libraries {' '.join(_files)}>", "same", "same", None,
                    [([2.0, 3.0], "float32"), ([5.0, 5.0], "float32")], {})


def _two_libraries(func: str, make, work: Path, inputs):
    ops = []
    files = func.strip("<>").split()[2:]
    for folder, op, file in zip(("k1", "k2"), ("+", "*"), files):
        (work / folder).mkdir(exist_ok=True)
        (work / folder / file).write_text(_ADDK.replace("OP", op))
        ops.append(make(str(work / folder / file) + ":AddK"))
    return [op(*inputs) for op in ops]


def _case_opforge(case, work: Path):
    import numpy as np
    import torch

    from opforge.mindspore import Custom

    func, out_shape, out_dtype, reg, inputs, prim = case
    if func.startswith("<two libraries"):
        outs = _two_libraries(func, lambda f: Custom(f, out_shape=lambda *a: a[0],
                                               out_dtype=lambda *a: a[0], func_type="aot",
                                               cache_root=work / "cache"),
                              work, [torch.tensor(np.array(v, dtype=d)) for v, d in inputs])
        return {"values": [o.tolist() for o in outs], "dtype": "float32"}
    op = Custom(str(work / func), out_shape=(lambda *a: a[0]) if out_shape == "same" else out_shape,
                out_dtype=(lambda *a: a[0]) if out_dtype == "same" else out_dtype,
                func_type="aot", reg_info=reg, cache_root=work / "cache")
    for k, v in prim.items():
        op.add_prim_attr(k, v)
    out = op(*[torch.tensor(np.array(v, dtype=d)) for v, d in inputs])
    return {"values": out.tolist(), "dtype": str(out.dtype).removeprefix("torch.")}


def _case_mindspore(case, work: Path):
    import numpy as np
    import mindspore as ms
    from mindspore import ops

    ms.set_context(device_target="CPU")
    func, out_shape, out_dtype, reg, inputs, prim = case
    if func.startswith("<two libraries"):
        outs = _two_libraries(func, lambda f: ops.Custom(f, out_shape=lambda *a: a[0],
                                                   out_dtype=lambda *a: a[0], func_type="aot"),
                              work, [ms.Tensor(np.array(v, dtype=d)) for v, d in inputs])
        return {"values": [o.asnumpy().tolist() for o in outs], "dtype": "float32"}
    op = ops.Custom(str(work / func), out_shape=(lambda *a: a[0]) if out_shape == "same" else out_shape,
                    out_dtype=(lambda *a: a[0]) if out_dtype == "same" else getattr(ms, out_dtype),
                    func_type="aot", reg_info=reg)
    for k, v in prim.items():
        op.add_prim_attr(k, v)
    out = op(*[ms.Tensor(np.array(v, dtype=d)) for v, d in inputs])
    return {"values": out.asnumpy().tolist(), "dtype": str(out.dtype).lower()}


def run_one(side: str, name: str, work: Path) -> dict:
    """One case on one side, in this process: its result or its error."""
    case = CASES[name]
    try:
        os.chdir(work)
        result = (_case_mindspore if side == "mindspore" else _case_opforge)(case, work)
        return {"ok": True, **result}
    except Exception as e:  # noqa: BLE001 - the refusal is the result
        return {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}


def _child(python: str, side: str, name: str, work: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) if side == "opforge" else "")
    try:
        done = subprocess.run([python, __file__, "--side", side, "--case", name, "--work", str(work)],
                              capture_output=True, text=True, timeout=900, env=env)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": "timed out"}
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"ok": False, "error": f"crashed (exit {done.returncode}): {done.stderr.strip()[-300:]}"}
    return json.loads(lines[-1])


def _agree(a: dict, b: dict) -> str:
    if a["ok"] and b["ok"]:
        same = a["dtype"] == b["dtype"] and a["values"] == b["values"]
        return "same" if same else "DIFFERENT"
    if not a["ok"] and not b["ok"]:
        return "both refuse"
    return "only MindSpore refuses" if not a["ok"] else "only opforge refuses"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mindspore-python", default="/tmp/msvenv/bin/python")
    parser.add_argument("--opforge-python", default=sys.executable)
    parser.add_argument("--side", choices=("mindspore", "opforge"))
    parser.add_argument("--case", choices=sorted(CASES), help="one case (else, with --side: "
                        "the CustomRegOp chains and DataType names)")
    parser.add_argument("--work")
    parser.add_argument("--out", help="write the report (Markdown) here")
    args = parser.parse_args()
    if args.side:
        print(json.dumps(run_one(args.side, args.case, Path(args.work)) if args.case else
                         run_registration(args.side)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in CASES:
            results = {}
            for side, python in (("mindspore", args.mindspore_python),
                                 ("opforge", args.opforge_python)):
                work = Path(tmp) / side / name
                shutil.copytree(KERNELS, work)
                results[side] = _child(python, side, name, work)
            for result in results.values():  # stable text: no temporary folder names
                if not result["ok"]:
                    result["error"] = result["error"].replace(tmp, "<work>")
            rows.append((name, results["mindspore"], results["opforge"]))
    lines = ["| case | MindSpore | opforge | verdict |", "| --- | --- | --- | --- |"]
    for name, a, b in rows:
        show = lambda r: (f"{r['dtype']} {r['values']}" if r["ok"] else r["error"]).replace("|", "/")
        lines.append(f"| {name} | {show(a)} | {show(b)} | {_agree(a, b)} |")
    registration = {}
    for side, python in (("mindspore", args.mindspore_python), ("opforge", args.opforge_python)):
        env = dict(os.environ, PYTHONPATH=str(ROOT) if side == "opforge" else "")
        done = subprocess.run([python, __file__, "--side", side], capture_output=True,
                              text=True, timeout=900, env=env)
        registration[side] = json.loads([l for l in done.stdout.splitlines()
                                         if l.startswith("{")][-1])
    ms, of = registration["mindspore"], registration["opforge"]
    lines += ["", "| CustomRegOp chain | MindSpore | opforge | verdict |", "| --- | --- | --- | --- |"]
    for chain in CHAINS:
        a, b = ms["chains"][chain], of["chains"][chain]
        verdict = "same" if a == b else (
            "both refuse" if isinstance(a, str) and isinstance(b, str) else
            "only MindSpore refuses" if isinstance(a, str) else
            "only opforge refuses" if isinstance(b, str) else "DIFFERENT")
        show = lambda r: (r if isinstance(r, str) else "dict").replace("|", "/")
        lines.append(f"| `{chain}` | {show(a)} | {show(b)} | {verdict} |")
    same = sum(ms["data_types"].get(k) == v for k, v in of["data_types"].items())
    lines += ["", f"DataType: MindSpore has {len(ms['data_types'])} names, opforge "
              f"{len(of['data_types'])}; {same} have the same value on both; only in "
              f"MindSpore: {sorted(set(ms['data_types']) - set(of['data_types'])) or 'none'}; "
              f"only in opforge: {sorted(set(of['data_types']) - set(ms['data_types'])) or 'none'}."]
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(
            "# MindSpore conformance (scripts/mindspore_conformance.py)\n\n"
            "The same cases through MindSpore 2.10 (CPU) and opforge, each case in its own "
            "child process on each side; generated by the script, not edited by hand.\n\n"
            + report + "\n")


if __name__ == "__main__":
    main()
