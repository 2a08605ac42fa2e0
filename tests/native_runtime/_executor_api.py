"""ctypes view of libopforge_runtime for the executor tests, and a small kernel library
they build (slow, failing, scalar-taking and tiny kernels), so every test runs both
runtimes on the same compiled kernels: the Python lean runtime loads that library too.
"""

import ctypes

import numpy as np

DTYPES = {np.dtype(k): v for k, v in [
    ("uint8", 0), ("int8", 1), ("int16", 2), ("int32", 3), ("int64", 4), ("float16", 5),
    ("float32", 6), ("float64", 7), ("bool", 11)]}
NUMPY = {v: k for k, v in DTYPES.items()}
STATUS = {0: "OPF_OK", 1: "OPF_ERR_INVALID_ARGUMENT", 2: "OPF_ERR_IO", 3: "OPF_ERR_PROGRAM",
          4: "OPF_ERR_MISSING_KERNEL", 5: "OPF_ERR_LIBRARY", 6: "OPF_ERR_INPUT", 7: "OPF_ERR_KERNEL",
          8: "OPF_ERR_MEMORY", 9: "OPF_ERR_BUSY", 10: "OPF_ERR_UNSUPPORTED", 11: "OPF_ERR_STATE",
          12: "OPF_ERR_INTERNAL"}


class NativeError(Exception):
    def __init__(self, status, message):
        super().__init__(f"{STATUS.get(status, status)}: {message}")
        self.status, self.name, self.message = status, STATUS.get(status), message


class LoadOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("max_memory", ctypes.c_int64)]


class MethodOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("num_threads", ctypes.c_int32),
                ("num_arenas", ctypes.c_int64), ("arenas", ctypes.POINTER(ctypes.c_void_p)),
                ("arena_sizes", ctypes.POINTER(ctypes.c_int64))]


class TensorView(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("sizes", ctypes.POINTER(ctypes.c_int64)), ("nbytes", ctypes.c_int64)]


class IoInfo(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("reserved", ctypes.c_int32), ("sizes", ctypes.POINTER(ctypes.c_int64)),
                ("min_sizes", ctypes.POINTER(ctypes.c_int64)),
                ("max_sizes", ctypes.POINTER(ctypes.c_int64)),
                ("dim_order", ctypes.POINTER(ctypes.c_uint8))]


P = ctypes.c_void_p


class Runtime:
    def __init__(self, path):
        lib = self.lib = ctypes.CDLL(str(path))
        sig = {
            "opf_registry_new": [ctypes.POINTER(P)],
            "opf_registry_load_library": [P, ctypes.c_char_p, ctypes.c_int32],
            "opf_program_load_buffer": [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int32, P,
                                        ctypes.POINTER(LoadOptions), ctypes.POINTER(P)],
            "opf_program_load_path": [ctypes.c_char_p, P, ctypes.POINTER(LoadOptions), ctypes.POINTER(P)],
            "opf_method_new": [P, ctypes.c_char_p, ctypes.POINTER(MethodOptions), ctypes.POINTER(P)],
            "opf_method_set_input": [P, ctypes.c_int64, P, ctypes.c_int32, ctypes.c_int32,
                                     ctypes.POINTER(ctypes.c_int64), ctypes.c_int32],
            "opf_method_set_input_int": [P, ctypes.c_int64, ctypes.c_int64],
            "opf_method_set_input_double": [P, ctypes.c_int64, ctypes.c_double],
            "opf_method_execute": [P],
            "opf_method_output": [P, ctypes.c_int64, ctypes.POINTER(TensorView)],
            "opf_method_output_scalar": [P, ctypes.c_int64, ctypes.POINTER(ctypes.c_int32),
                                         ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_double)],
            "opf_method_set_profiling": [P, ctypes.c_int32],
            "opf_method_instruction_profile": [P, ctypes.c_int64, ctypes.POINTER(ctypes.c_char_p),
                                               ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_int64)],
            "opf_program_method_io": [P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)],
            "opf_program_input_info": [P, ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(IoInfo)],
            "opf_program_state_info": [P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32),
                                       ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), ctypes.POINTER(ctypes.c_int64)],
            "opf_program_state_read": [P, ctypes.c_char_p, P, ctypes.c_int64],
            "opf_program_state_write": [P, ctypes.c_char_p, P, ctypes.c_int64],
            "opf_program_state_reset": [P, ctypes.c_char_p],
            "opf_program_arena_sizes": [P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_int64,
                                        ctypes.POINTER(ctypes.c_int64)],
        }
        for name, args in sig.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int32
        for name in ("opf_registry_free", "opf_program_free", "opf_method_free"):
            getattr(lib, name).argtypes, getattr(lib, name).restype = [P], None
        lib.opf_last_error.restype = ctypes.c_char_p
        lib.opf_registry_operator.argtypes, lib.opf_registry_operator.restype = [P, ctypes.c_int64], ctypes.c_char_p
        lib.opf_registry_num_operators.argtypes, lib.opf_registry_num_operators.restype = [P], ctypes.c_int64
        lib.opf_method_num_instructions.argtypes, lib.opf_method_num_instructions.restype = [P], ctypes.c_int64

    def check(self, status):
        if status:
            raise NativeError(status, self.lib.opf_last_error().decode())

    def registry(self, libraries=(), override=0):
        handle = P()
        self.check(self.lib.opf_registry_new(ctypes.byref(handle)))
        for path in libraries:
            self.check(self.lib.opf_registry_load_library(handle, str(path).encode(), override))
        return handle

    def operators(self, registry):
        return [self.lib.opf_registry_operator(registry, i).decode()
                for i in range(self.lib.opf_registry_num_operators(registry))]

    def load(self, data, registry, max_memory=0, flags=0):
        options = LoadOptions(ctypes.sizeof(LoadOptions), flags, max_memory)
        handle = P()
        self.check(self.lib.opf_program_load_buffer(data, len(data), 1, registry, ctypes.byref(options),
                                                    ctypes.byref(handle)))
        return handle

    def method(self, program, name="forward", options=None):
        handle = P()
        self.check(self.lib.opf_method_new(program, name.encode(),
                                           ctypes.byref(options) if options is not None else None,
                                           ctypes.byref(handle)))
        return handle

    def set_input(self, method, index, array, zero_copy=False, dtype=None, rank=None, shape=None):
        array = np.ascontiguousarray(array)
        shape = array.shape if shape is None else shape  # the logical sizes (data dense in dim order)
        sizes = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        dt = DTYPES[array.dtype] if dtype is None else dtype
        self.check(self.lib.opf_method_set_input(method, index, array.ctypes.data, dt,
                                                 len(shape) if rank is None else rank, sizes,
                                                 int(zero_copy)))
        return array

    def run(self, method, *inputs):
        keep = []
        for i, a in enumerate(inputs):
            if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
                self.check(self.lib.opf_method_set_input_int(method, i, int(a)))
            elif isinstance(a, float):
                self.check(self.lib.opf_method_set_input_double(method, i, a))
            else:
                keep.append(self.set_input(method, i, a))
        self.check(self.lib.opf_method_execute(method))
        return self.outputs(method)

    def output(self, method, index):
        view = TensorView()
        self.check(self.lib.opf_method_output(method, index, ctypes.byref(view)))
        shape = tuple(view.sizes[d] for d in range(view.rank))
        count = int(np.prod(shape)) if shape else 1
        if view.nbytes == 0:
            return np.zeros(shape, NUMPY[view.dtype])
        buffer = (ctypes.c_char * view.nbytes).from_address(view.data)
        return np.frombuffer(buffer, NUMPY[view.dtype], count).reshape(shape).copy()

    def outputs(self, method, count=None):
        if count is None:
            count = 0
            while True:  # until out of range
                view = TensorView()
                status = self.lib.opf_method_output(method, count, ctypes.byref(view))
                kind = ctypes.c_int32()
                scalar = self.lib.opf_method_output_scalar(method, count, ctypes.byref(kind), None, None)
                if status and scalar:
                    break
                count += 1
        result = []
        for i in range(count):
            kind, iv, dv = ctypes.c_int32(), ctypes.c_int64(), ctypes.c_double()
            if self.lib.opf_method_output_scalar(method, i, ctypes.byref(kind), ctypes.byref(iv), ctypes.byref(dv)) == 0:
                result.append(dv.value if kind.value == 2 else bool(iv.value) if kind.value == 3 else iv.value)
            else:
                result.append(self.output(method, i))
        return result

TEST_MANIFEST = """
- func: test_ops::slow.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)
  kernels:
    - arg_meta: null
      kernel_name: tops::slow_out
- func: test_ops::check_positive.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)
  kernels:
    - arg_meta: null
      kernel_name: tops::check_positive_out
- func: test_ops::add.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)
  kernels:
    - arg_meta: null
      kernel_name: tops::add_out
- func: test_ops::affine.out(Tensor x, float scale, int shift, *, Tensor(a!) out) -> Tensor(a!)
  kernels:
    - arg_meta: null
      kernel_name: tops::affine_out
"""
TEST_SOURCE = r"""
#include <chrono>
#include <cstring>
#include <thread>
#include "opforge/kernel.h"
namespace {
// strided float copy with a per-element function, any rank
template <class F>
void each(const opforge::Tensor& x, opforge::Tensor& out, F f) {
  const float* src = x.const_data_ptr<float>();
  float* dst = out.mutable_data_ptr<float>();
  opforge::for_each_index(x.sizes(), [&](const int64_t* i) {
    dst[opforge::offset_of(out, i)] = f(src[opforge::offset_of(x, i)]);
  });
}
bool same_shape(const opforge::Tensor& a, const opforge::Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int64_t d = 0; d < a.dim(); ++d) if (a.size(d) != b.size(d)) return false;
  return true;
}
}
namespace tops { namespace native {
opforge::Tensor& slow_out(opforge::KernelContext& ctx, const opforge::Tensor& x, opforge::Tensor& out) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  each(x, out, [](float v) { return v; });
  return out;
}
opforge::Tensor& check_positive_out(opforge::KernelContext& ctx, const opforge::Tensor& x, opforge::Tensor& out) {
  OPFORGE_CHECK(ctx, same_shape(x, out), out, "check_positive: shape mismatch");
  const float* src = x.const_data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i)
    if (src[i] < 0) { ctx.fail("check_positive: element %lld is negative (%g)", (long long)i, src[i]); return out; }
  each(x, out, [](float v) { return v; });
  return out;
}
opforge::Tensor& add_out(opforge::KernelContext& ctx, const opforge::Tensor& a, const opforge::Tensor& b, opforge::Tensor& out) {
  const int64_t n = out.numel();
  const float* x = a.const_data_ptr<float>();
  const float* y = b.const_data_ptr<float>();
  float* z = out.mutable_data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) z[i] = x[i] + y[i];
  return out;
}
opforge::Tensor& affine_out(opforge::KernelContext& ctx, const opforge::Tensor& x, double scale, int64_t shift, opforge::Tensor& out) {
  OPFORGE_CHECK(ctx, same_shape(x, out), out, "affine: shape mismatch");
  each(x, out, [&](float v) { return static_cast<float>(v * scale + shift); });
  return out;
}
}}
"""
