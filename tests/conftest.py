"""Shared test fixtures. Tests are split by what they need: pure/ (NumPy only), torch/,
native/ (a C++ compiler)."""

import subprocess
import sys
import textwrap

import pytest

# Prepended to code run by `python_without_torch`: `import torch` fails, as on a device
# that has only NumPy (the lean runtime's promise).
_BLOCK_TORCH = textwrap.dedent("""
    import sys
    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is not installed here")
            return None
    sys.meta_path.insert(0, _NoTorch())
""")


@pytest.fixture
def python_without_torch():
    """``run(code) -> CompletedProcess``: run ``code`` in a fresh interpreter where
    importing torch raises ImportError; the code should itself assert what it needs."""

    def run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
        source = _BLOCK_TORCH + textwrap.dedent(code)
        return subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                              timeout=timeout)

    return run
