"""Operator definitions: YAML manifests (ExecuTorch-compatible) and Python decorators → OpDef.

>>> from opforge.manifest import parse_manifest
>>> [d.out_key for d in parse_manifest('''
... - func: my_ops::mul3.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)
...   kernels:
...     - arg_meta: null
...       kernel_name: custom::mul3_out_impl
... ''')]
['my_ops::mul3.out']
"""

from opforge.manifest.model import DTYPE_NAMES, KernelBinding, OpDef, TensorMeta, native_kernel_name
from opforge.manifest.python_api import CustomOp, op
from opforge.manifest.references import resolve_reference
from opforge.manifest.yaml_manifest import load_manifest, parse_manifest
from opforge.manifest.definitions import load_definitions

__all__ = [
    "DTYPE_NAMES",
    "CustomOp",
    "KernelBinding",
    "OpDef",
    "TensorMeta",
    "load_definitions",
    "load_manifest",
    "native_kernel_name",
    "op",
    "parse_manifest",
    "resolve_reference",
]
