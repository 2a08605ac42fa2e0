"""Post-training and quantization-aware quantization on torchao's PT2E (docs/quantization.md).

Imports torch and torchao: ``import opforge`` never imports this package.

>>> from opforge.quantize import quantize                              # doctest: +SKIP
>>> from opforge.examples.zoo import ZOO                              # doctest: +SKIP
>>> model, inputs = ZOO["mlp"]()                                      # doctest: +SKIP
>>> q = quantize(model, inputs, "8a8w", calibration=[inputs])         # doctest: +SKIP
>>> q.report.print_table(); program = q.export()                      # doctest: +SKIP
"""

from opforge.quantize import out_variants as _out_variants  # registers the Q/DQ out overloads
from opforge.quantize.api import QuantizedModel, capture, convert, prepare, prepare_qat, quantize
from opforge.quantize.annotate import Decision
from opforge.quantize.quantizer import Quantizer, module_name, module_type
from opforge.quantize.report import QuantReport, sqnr_db
from opforge.quantize.schemes import OBSERVERS, SCHEMES, QuantConfig, QuantizeError

__all__ = [
    "quantize", "prepare", "prepare_qat", "convert", "capture", "QuantizedModel",
    "Quantizer", "QuantConfig", "QuantizeError", "QuantReport", "Decision",
    "module_type", "module_name", "sqnr_db", "SCHEMES", "OBSERVERS",
]

del _out_variants
