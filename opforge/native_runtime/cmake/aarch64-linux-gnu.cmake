# Cross-compiling for 64-bit ARM Linux (aarch64, glibc) with Debian's cross toolchain
# (apt-get install g++-aarch64-linux-gnu; run the results with qemu-aarch64 -L
# /usr/aarch64-linux-gnu). Used by the native runtime (build_runtime(target=...)), kernel
# libraries (opforge build --target) and bundles (opforge bundle --target):
#
#   cmake -S opforge/native_runtime -B build-arm -G Ninja \
#         -DCMAKE_TOOLCHAIN_FILE=opforge/native_runtime/cmake/aarch64-linux-gnu.cmake
#
# The baseline is plain ARMv8-A (NEON is part of it): no -mcpu/-march, so the binaries run on
# any aarch64 Linux. Tune for one core with -DCMAKE_CXX_FLAGS="-mcpu=cortex-a76" (or
# -DOPFORGE_EXTRA_FLAGS for kernel libraries).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

# A prefix other than Debian's: -DOPFORGE_CROSS_PREFIX=/opt/gcc-arm/bin/aarch64-none-linux-gnu-
set(OPFORGE_CROSS_PREFIX "aarch64-linux-gnu-" CACHE STRING "cross compiler prefix")
set(OPFORGE_CROSS_SYSROOT "/usr/aarch64-linux-gnu" CACHE PATH "the target's libraries and headers")
set(CMAKE_C_COMPILER ${OPFORGE_CROSS_PREFIX}gcc)
set(CMAKE_CXX_COMPILER ${OPFORGE_CROSS_PREFIX}g++)
# try_compile (check_ipo_supported, find_package(Threads)) sees the same settings
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES OPFORGE_CROSS_PREFIX OPFORGE_CROSS_SYSROOT
     OPFORGE_MAX_PAGE_SIZE)

# aarch64 kernels run with 4, 16 or 64 KB pages, and the linker pads a small executable's file
# up to its max-page-size (RELRO ends on a page): at 64 KB the core app is 330,872 bytes
# stripped, at 4 KB 281,720. The default, 16 KB, loads on 4 KB and 16 KB kernels (Debian's and
# Ubuntu's arm64 kernels, Android, which requires 16 KB alignment) and keeps the core under
# 300 KB; for a 64 KB-page kernel (some server distributions) pass
# -DOPFORGE_MAX_PAGE_SIZE=65536, for the smallest files on 4 KB kernels 4096.
set(OPFORGE_MAX_PAGE_SIZE "16384" CACHE STRING "the linker's max-page-size in bytes")
if(OPFORGE_MAX_PAGE_SIZE)
  foreach(kind EXE SHARED MODULE)
    set(CMAKE_${kind}_LINKER_FLAGS_INIT "-Wl,-z,max-page-size=${OPFORGE_MAX_PAGE_SIZE}")
  endforeach()
endif()

# Programs (cmake's own helpers) from the build machine; libraries and headers from the target.
set(CMAKE_FIND_ROOT_PATH ${OPFORGE_CROSS_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# Run a target binary during the build (none does today) through user-mode emulation.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L ${OPFORGE_CROSS_SYSROOT})
