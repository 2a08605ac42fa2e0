"""The portable kernels import and run with NumPy alone: torch is made unimportable."""

from __future__ import annotations

import textwrap

_PROGRAM = textwrap.dedent(
    """
    import sys

    import math
    import numpy as np
    from opforge.kernels.portable import portable_kernels

    kernels = portable_kernels()
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = np.empty((2, 3), np.float32)
    kernels["aten::add.out"](a, a.T.copy().T, 2, out)
    assert out.tolist() == [[0, 3, 6], [9, 12, 15]], out

    mm = np.empty((2, 2), np.float32)
    kernels["aten::mm.out"](a, a.T, mm)
    assert np.allclose(mm, a @ a.T)

    gelu = np.empty(3, np.float64)
    x = np.array([-1.0, 0.0, 2.0])
    kernels["aten::gelu.out"](x, "none", gelu)
    expected = [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x]
    assert np.abs(gelu - expected).max() < 1e-14, gelu

    from opforge.kernels.portable._erf import erf
    grid = np.linspace(-7, 7, 2001)
    assert np.abs(erf(grid) - [math.erf(v) for v in grid]).max() < 1e-14

    soft = np.empty((2, 3), np.float32)
    kernels["aten::_softmax.out"](a, 1, False, soft)
    assert np.allclose(soft.sum(axis=1), 1)

    assert "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m)
    print("ok", len(kernels))
    """
)


def test_portable_kernels_run_without_torch(python_without_torch):
    result = python_without_torch(_PROGRAM)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ")
