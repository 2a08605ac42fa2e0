"""Post-training and quantization-aware quantization on torchao's PT2E (docs/quantization.md).

Imports torch and torchao: ``import opforge`` never imports this package.

>>> from opforge.quantize import quantize                              # doctest: +SKIP
>>> from opforge.examples.zoo import ZOO                              # doctest: +SKIP
>>> model, inputs = ZOO["mlp"]()                                      # doctest: +SKIP
>>> q = quantize(model, inputs, "8a8w", calibration=[inputs])         # doctest: +SKIP
>>> q.report.print_table(); program = q.export()                      # doctest: +SKIP
"""

import logging as _logging


class _QuietImport:
    """torchao warns at import about the CUDA/MX extensions a CPU machine cannot load
    ("Failed to load ..._C_mxfp8...") and torch about torchao's Enum constants
    (KernelPreference): neither concerns an opforge user. Their loggers are quiet for the
    import only, so later warnings still show."""

    names = ("torchao", "torch.utils._pytree")

    def __enter__(self):
        self.levels = [(_logging.getLogger(n), _logging.getLogger(n).level) for n in self.names]
        for logger, _ in self.levels:
            logger.setLevel(_logging.ERROR)

    def __exit__(self, *exc):
        for logger, level in self.levels:
            logger.setLevel(level)


with _QuietImport():
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

del _out_variants, _QuietImport
