"""Quantization tests: need torch and torchao (the ``quantize`` extra)."""

import warnings

import pytest

pytest.importorskip("torchao")
