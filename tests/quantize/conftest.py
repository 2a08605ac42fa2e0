"""Quantization tests: need torch and torchao (the ``quantize`` extra)."""


import pytest

pytest.importorskip("torchao")
