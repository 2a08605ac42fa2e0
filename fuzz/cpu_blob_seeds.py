"""Seed programs for ``cpu_blob_fuzz.py``: real exports with ``backends=["cpu"]``, cached.

Every op kind the engine knows comes from a model that lowers to it (the zoo, small models
per op family, a custom native op called through the kernel ABI inside the delegate, an
op-package op, 8a8w-quantized zoo models, a debug build whose node results are extra
delegate outputs, program state written in place: the decoder's decode step and slice
assignment into a cache, and dynamic methods whose delegates carry size expressions).
Exporting needs torch and takes tens of
seconds, so the programs and the native libraries they need are written once to a cache
folder keyed by the hash of the cpu backend's ahead-of-time sources (another opforge on
PYTHONPATH, e.g. a hardened branch, gets its own entry). The worker that runs the cases
only reads the cache: it never imports torch.

    manifest.json  {"seeds": [{"name", "file", "kernels": [...], "packages": [...]}],
                    "trusted": [package libraries]}
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

CACHE_ROOT = Path(__file__).resolve().parent / ".cpu_blob_seeds"


@dataclass(frozen=True)
class Seed:
    name: str
    data: bytes
    kernels: tuple[str, ...] = ()  # kernel libraries `load` needs for it


def cache_key() -> str:
    """Hash of what decides the seeds' bytes: the imported opforge's cpu backend sources
    (lowering and blob writer among them, in any subfolder), and this file."""
    import opforge

    root = Path(opforge.__file__).resolve().parent / "backends" / "cpu"
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")) + [Path(__file__).resolve()]:
        name = path.relative_to(root) if root in path.parents else path.name
        h.update(str(name).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def load_seeds(cache_root: Path = CACHE_ROOT, log=print) -> tuple[list[Seed], list[str]]:
    """(seeds, trusted package libraries), built into the cache on first use."""
    folder = cache_root / cache_key()
    manifest = folder / "manifest.json"
    if not manifest.exists():
        log(f"building cpu blob seeds into {folder} (once; needs torch)")
        _build(folder)
    doc = json.loads(manifest.read_text())
    seeds = [Seed(s["name"], (folder / s["file"]).read_bytes(), tuple(s["kernels"]))
             for s in doc["seeds"]]
    return seeds, doc["trusted"]


# --- building (torch) -----------------------------------------------------------------------

def _models():
    """(name, model, inputs, extra export specs) of the op-family models."""
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)

    class Conv(nn.Module):  # conv + folded batch norm + residual add/relu post-ops, pools
        def __init__(self):
            super().__init__()
            self.c1, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.c2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2)
            self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)

        def forward(self, x):
            y = torch.relu(self.bn(self.c1(x)))
            y = torch.relu(self.c2(y) + y)
            p = nn.functional.max_pool2d(y, 2) + nn.functional.avg_pool2d(y, 2, ceil_mode=True)
            return self.up(p), nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)

    class Dense(nn.Module):  # matmul/bmm, eltwise, softmax, layer norm, reductions
        def __init__(self):
            super().__init__()
            self.fc, self.ln = nn.Linear(16, 16), nn.LayerNorm(16)

        def forward(self, x):
            a = torch.tanh(self.fc(x)) * torch.sigmoid(x)
            b = torch.softmax(a @ a.transpose(1, 2), -1) @ x
            n = self.ln(nn.functional.gelu(b)).clamp(-2, 2)
            return n.sum(-1), n.mean(1), n.amax(-1), torch.log_softmax(n, 1), n.pow(2)

    class Shapes(nn.Module):  # copies and generic elementwise: where, masked_fill, cat, pad
        def forward(self, x, m):
            w = torch.where(x > 0, x, -x * 0.5)
            f = x.masked_fill(m, 3.0)
            c = torch.cat([w, f.permute(0, 2, 1).reshape(w.shape)], 1)
            p = nn.functional.pad(c, (1, 2))
            r = torch.roll(p, 2, -1)
            s = torch.index_select(p, 1, torch.tensor([0, 3, 2]))
            return r.contiguous(), s, torch.maximum(x, f).abs() - torch.minimum(x, w)

    class Embed(nn.Module):  # embedding over int64 ids, group norm
        def __init__(self):
            super().__init__()
            self.emb, self.gn = nn.Embedding(20, 8), nn.GroupNorm(2, 4)

        def forward(self, ids):
            e = self.emb(ids)  # (2, 4, 8)
            return self.gn(e.reshape(2, 4, 2, 4)), e.exp().sum(-1)

    class Attention(nn.Module):  # sdpa with a mask that leaves a row fully masked: safe softmax
        def __init__(self):
            super().__init__()
            mask = torch.ones(1, 1, 4, 4, dtype=torch.bool).tril()
            mask[..., 2, :] = False
            self.register_buffer("mask", mask)

        def forward(self, x):
            q = x.reshape(2, 4, 2, 8).transpose(1, 2)
            return nn.functional.scaled_dot_product_attention(q, q * 0.5, q, attn_mask=self.mask)

    class Winograd(nn.Module):  # 3×3 stride-1 convolutions on the Winograd kernel (16+ channels)
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(16, 16, 3, padding=1)
            self.c2 = nn.Conv2d(16, 20, 3, padding=(0, 2), bias=False)

        def forward(self, x):
            y = torch.relu(self.c1(x) + x)        # a residual add and relu in its registers
            return nn.functional.gelu(self.c2(y))  # uneven padding, a GELU after it

    class Depthwise(nn.Module):  # depthwise 3×3 convolutions on the engine's own float kernel
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(20, 20, 3, padding=1, groups=20)
            self.c2 = nn.Conv2d(20, 20, 3, stride=2, padding=(2, 0), groups=20, bias=False)

        def forward(self, x):
            y = torch.clamp(self.c1(x), 0, 6)       # relu6 in its registers, a partial block
            return nn.functional.gelu(self.c2(y))  # stride 2, uneven padding, a GELU after it

    class Small(nn.Module):  # small convolutions on the engine's own direct kernel
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(8, 20, 3, stride=2, padding=(1, 2))
            self.c2 = nn.Conv2d(20, 9, (1, 3), bias=False)

        def forward(self, x):
            y = torch.relu(self.c1(x))                                   # relu in its registers
            return nn.functional.max_pool2d(torch.clamp(self.c2(y), -1, 1), 2)  # its bound read

    x3 = torch.randn(1, 3, 8, 8, generator=g)
    x16 = torch.randn(2, 4, 16, generator=g)
    xs = torch.randn(2, 6, 6, generator=g)
    mask = torch.rand(2, 6, 6, generator=g) > 0.5
    ids = torch.randint(0, 20, (2, 4), generator=g)
    return [("conv", Conv().eval(), (x3,), {}), ("dense", Dense().eval(), (x16,), {}),
            ("shapes", Shapes().eval(), (xs, mask), {}), ("embed", Embed().eval(), (ids,), {}),
            ("threads2", Dense().eval(), (x16,), {"num_threads": 2}),
            ("attention", Attention().eval(), (x16,), {}),
            ("winograd", Winograd().eval(), (torch.randn(2, 16, 7, 9, generator=g),), {}),
            ("depthwise", Depthwise().eval(), (torch.randn(2, 20, 9, 11, generator=g),), {}),
            ("small_conv", Small().eval(), (torch.randn(2, 8, 11, 13, generator=g),), {})]


def _quantized(name):
    import torch
    from opforge.examples.zoo import ZOO

    torch.manual_seed(0)
    return _quantized_model(*ZOO[name]())


def _depthwise64():
    """A 64-channel depthwise 3×3 convolution between two 1×1 ones, ReLU6 after each: in
    8a8w the engine's own int8 depthwise kernel (native/qdepthwise.cpp) runs it."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 64, 1), nn.ReLU6(),
                          nn.Conv2d(64, 64, 3, stride=2, padding=1, groups=64), nn.ReLU6(),
                          nn.Conv2d(64, 8, 1)).eval()
    return model, (torch.randn(1, 3, 7, 6, generator=torch.Generator().manual_seed(2)),)


def _quantized_model(model, inputs):
    import torch
    from opforge.quantize import quantize

    gen = torch.Generator().manual_seed(1)
    calibration = [tuple(torch.randn(t.shape, generator=gen) if t.is_floating_point() else t
                         for t in inputs) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize(model.eval(), inputs, "8a8w", calibration=calibration)


def _build(folder: Path) -> None:
    from opforge.examples.custom_model import custom_op_model
    from opforge.examples.my_ops import manifest_path
    from opforge.examples.zoo import ZOO
    from opforge.export import export
    from opforge.native import build_library
    from opforge.program import to_bytes

    folder.mkdir(parents=True, exist_ok=True)
    entries, trusted = [], []

    def add(name, program, kernels=()):
        (folder / f"{name}.program").write_bytes(to_bytes(program))
        entries.append({"name": name, "file": f"{name}.program", "kernels": list(kernels)})

    for name, factory in ZOO.items():
        model, inputs = factory()
        add(f"zoo-{name}", export(model, inputs, kernels="portable", backends=["cpu"]))
    for name, model, inputs, specs in _models():
        add(name, export(model, inputs, kernels="portable", backends=[("cpu", specs)]))
    for name in ("mlp", "cnn"):
        add(f"8a8w-{name}", _quantized(name).export(backends=["cpu"]))
    add("8a8w-depthwise64", _quantized_model(*_depthwise64()).export(backends=["cpu"]))
    # a debug build (opforge compare): unfused, every node result an extra delegate output
    from opforge.backends.cpu import CpuBackend

    for (name, model, inputs, _), mode in zip(_models()[:2], ("groups", "nodes")):
        add(f"debug-{mode}-{name}", export(model, inputs, kernels="portable",
                                           backends=[(CpuBackend(debug=mode), {})]))

    # program state written in place inside the delegate: the decoder's one-token decode
    # (index gathers of the rotary tables, index_put into four KV caches), and slice and
    # select assignment into a state
    import torch

    from opforge.examples.decoder import TinyDecoder, export_decoder

    decoder = TinyDecoder(max_len=16, seed=1).eval()
    add("state-decoder", export(decoder, (torch.tensor([3]), torch.tensor([2])),
                                kernels="portable", backends=["cpu"]))
    add("state-slices", export(_state_slices_model(), (torch.randn(2, 4),), kernels="portable",
                               backends=["cpu"]))
    # dynamic methods: size expressions and symbols in the plans (cpu/dynamic.py)
    model, inputs = ZOO["transformer_layer"]()
    add("dynamic-transformer_layer", export(
        model, inputs, kernels="portable", backends=["cpu"],
        dynamic_shapes=({1: torch.export.Dim("seq", min=1, max=24)},)))
    add("dynamic-decoder", export_decoder(TinyDecoder(max_len=12).eval(), kernels="portable",
                                          backends=["cpu"]))

    sources = sorted((manifest_path().parent / "kernels").glob("*.cpp"))
    library = build_library(manifest_path(), sources, folder / "libmy_ops.so",
                            cache_root=folder / "build")
    model, inputs = custom_op_model(0)
    custom = ["my_ops::mul3", "my_ops::mul4", "my_ops::minmax", "my_ops::scaled_sum"]
    add("custom-kernel", export(model, inputs, kernels=["portable", set(library.ops)],
                                backends=[("cpu", {"custom_ops": custom})]), [str(library.path)])

    package = _package(folder)
    trusted.append(str(package))
    add("oppackage", _package_program(package))
    (folder / "manifest.json").write_text(json.dumps({"seeds": entries, "trusted": trusted},
                                                     indent=1))


def _state_slices_model():
    import torch

    class StateSlices(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("keys", torch.zeros(6, 4))
            self.register_buffer("values", torch.zeros(3, 5, 4))

        def forward(self, k):
            self.keys[1:3].copy_(k * 2)
            self.values[:, 4] = k[0]
            return self.keys.sum(0) + self.values.sum((0, 1)) + k

    return StateSlices().eval()


def _package(folder: Path) -> Path:
    from opforge.backends.oppackage import build_package
    from opforge.backends.oppackage.runtime import trust_packages
    import opforge.examples

    source = Path(opforge.examples.__file__).parent / "oppackage" / "ExampleOpPackage"
    library = build_package(source, target="cpu", output=folder / "libQnnExampleOpPackage.so",
                            cache_root=folder / "build")
    trust_packages([library])
    return Path(library)


def _package_program(library: Path):
    import torch
    from opforge.backends.oppackage import parse_op_package_infos
    from opforge.examples.my_ops import register_examples
    from opforge.export import export

    register_examples()

    class Model(torch.nn.Module):
        def forward(self, x, y):
            b = torch.ops.my_ops.mul3(x) + y  # ExampleCustomOp, then ElementWiseAdd
            return torch.sin(b), torch.relu(b) * 2

    infos = parse_op_package_infos([
        {"op_package_name": "ExampleOpPackage", "op_package_path": str(library),
         "custom_op_name": op, "op_type_name": t}
        for op, t in (("my_ops.mul3.default", "ExampleCustomOp"),
                      ("aten.add.Tensor", "ElementWiseAdd"))])
    g = torch.Generator().manual_seed(0)
    inputs = (torch.randn(4, 5, generator=g), torch.randn(5, generator=g))
    return export(Model(), inputs, kernels="portable",
                  backends=[("cpu", {"op_packages": [i.as_dict() for i in infos]})])
