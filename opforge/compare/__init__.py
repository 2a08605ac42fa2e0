"""``opforge compare``: find the first operator where two runs of a model diverge.

The reference is the exported graph run node by node in eager PyTorch (float64); each run
(eager, lean, ATen, the cpu backend's debug build, a quantized program) records its node
results by debug handle, and every node is measured against the reference (max abs error,
relative error, SQNR). See docs/compare.md.
"""

from opforge.compare.api import Comparison, CompareError, NodeRow, compare, compare_program
from opforge.compare.metrics import NodeError, Tolerance

__all__ = ["compare", "compare_program", "Comparison", "NodeRow", "NodeError", "Tolerance",
           "CompareError"]
