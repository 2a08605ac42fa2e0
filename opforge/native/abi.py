"""The native kernel ABI's numbers, as Python sees them (mirrors ``opforge/kernel_abi.h``).

Kept free of imports beyond the standard library: the lean runtime
(``opforge.runtime.native``) reads these to marshal arguments, and
``tests/native/test_native_abi.py`` checks that they equal the header's.
"""

from __future__ import annotations

import enum
from pathlib import Path

__all__ = ["ABI_VERSION", "ArgTag", "KIND_SCALAR", "KIND_OPTIONAL", "KIND_OUT",
           "REGISTER_SYMBOL", "MESSAGE_SIZE", "include_dir"]

ABI_VERSION = 1
REGISTER_SYMBOL = "opforge_register_kernels"
MESSAGE_SIZE = 1024


class ArgTag(enum.IntEnum):
    """``opforge_arg.tag``: what one boxed argument value holds."""

    NONE = 0
    TENSOR = 1
    TENSOR_LIST = 2
    OPT_TENSOR_LIST = 3
    INT = 4
    DOUBLE = 5
    BOOL = 6
    SCALAR_TYPE = 8
    INT_LIST = 9
    DOUBLE_LIST = 10
    BOOL_LIST = 11
    STRING = 12


# Parameter kinds (opforge_kernel_entry.arg_kinds): an ArgTag base (or KIND_SCALAR),
# plus KIND_OPTIONAL for `T?` and KIND_OUT for out arguments.
KIND_SCALAR = 7
KIND_OPTIONAL = 0x100
KIND_OUT = 0x200


def include_dir() -> Path:
    """The directory holding ``opforge/kernel_abi.h`` and ``opforge/kernel.h``.

    >>> (include_dir() / "opforge" / "kernel.h").is_file()
    True
    """
    return Path(__file__).with_name("include")
