"""Kernel libraries: the portable NumPy kernels (``opforge.kernels.portable``).

The portable library is the living specification every other backend is tested against.
It imports NumPy only, never PyTorch, so the lean runtime can use it.
"""
