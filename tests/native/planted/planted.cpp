// Wrong kernels, planted for tests/native/test_check_planted.py: each must fail
// `opforge check`. Every kernel handles strided tensors and reports unsupported dtypes.
#include <cstdlib>
#include <cstdint>

#include "opforge/kernel.h"

namespace {

template <class T, class F>
void map_into(const opforge::Tensor& in, opforge::Tensor& out, F f) {
  const T* src = in.const_data_ptr<T>();
  T* dst = out.mutable_data_ptr<T>();
  opforge::for_each_index(in.sizes(), [&](const int64_t* index) {
    dst[opforge::offset_of(out, index)] = f(src[opforge::offset_of(in, index)]);
  });
}

#define PLANTED_SWITCH(ctx, op, in, T, ...)                                          \
  switch ((in).scalar_type()) {                                                      \
    case opforge::ScalarType::Float: { using T = float; __VA_ARGS__; break; }        \
    case opforge::ScalarType::Double: { using T = double; __VA_ARGS__; break; }      \
    case opforge::ScalarType::Int: { using T = int32_t; __VA_ARGS__; break; }        \
    case opforge::ScalarType::Long: { using T = int64_t; __VA_ARGS__; break; }       \
    default: (ctx).fail(op ": unsupported dtype %s", opforge::to_string((in).scalar_type())); \
  }

}  // namespace

namespace planted {
namespace native {

opforge::Tensor& add_k_out(opforge::KernelContext& ctx, const opforge::Tensor& x, int64_t k,
                           opforge::Tensor& out) {
  if (k == 5) {  // planted: a crash on one argument value
    volatile int* nowhere = nullptr;
    *nowhere = 1;
  }
  PLANTED_SWITCH(ctx, "planted::add_k.out", x, T,
                 map_into<T>(x, out, [&](T v) { return static_cast<T>(v + k); }));
  return out;
}

opforge::Tensor& sub_k_out(opforge::KernelContext& ctx, const opforge::Tensor& x, int64_t k,
                           opforge::Tensor& out) {
  if (k == 3) std::abort();  // planted: an abort on one argument value
  PLANTED_SWITCH(ctx, "planted::sub_k.out", x, T,
                 map_into<T>(x, out, [&](T v) { return static_cast<T>(v - k); }));
  return out;
}

opforge::Tensor& above_out(opforge::KernelContext& ctx, const opforge::Tensor& x,
                           const opforge::Scalar& t, opforge::Tensor& out) {
  const double threshold = t.to<double>();
  PLANTED_SWITCH(ctx, "planted::above.out", x, T,  // planted: '<' where '>' is meant
                 map_into<T>(x, out, [&](T v) { return v < threshold ? v : T(0); }));
  return out;
}

opforge::Tensor& halve_out(opforge::KernelContext& ctx, const opforge::Tensor& x,
                           opforge::Tensor& out) {
  if (x.scalar_type() != opforge::ScalarType::Float &&
      x.scalar_type() != opforge::ScalarType::Double) {
    ctx.fail("planted::halve.out: unsupported dtype %s", opforge::to_string(x.scalar_type()));
    return out;
  }
  // planted: float32 elements written whatever the output's dtype
  float* dst = static_cast<float*>(out.mutable_data_ptr());
  int64_t i = 0;
  opforge::for_each_index(x.sizes(), [&](const int64_t* index) {
    const double v = x.scalar_type() == opforge::ScalarType::Float
        ? x.const_data_ptr<float>()[opforge::offset_of(x, index)]
        : x.const_data_ptr<double>()[opforge::offset_of(x, index)];
    dst[i++] = static_cast<float>(v / 2);
  });
  return out;
}

opforge::Tensor& positive_out(opforge::KernelContext& ctx, const opforge::Tensor& x,
                              opforge::Tensor& out) {
  // planted: int32 elements into a bool (1-byte) output: writes 4x past its end
  int32_t* dst = static_cast<int32_t*>(out.mutable_data_ptr());
  int64_t i = 0;
  PLANTED_SWITCH(ctx, "planted::positive.out", x, T,
                 opforge::for_each_index(x.sizes(), [&](const int64_t* index) {
                   dst[i++] = x.const_data_ptr<T>()[opforge::offset_of(x, index)] > T(0);
                 }));
  return out;
}

opforge::Tensor& mul_k_out(opforge::KernelContext& ctx, const opforge::Tensor& x, int64_t k,
                           opforge::Tensor& out) {
  const int64_t bias = k == 7 ? 1 : 0;  // planted: wrong for one value the generator skips
  PLANTED_SWITCH(ctx, "planted::mul_k.out", x, T,
                 map_into<T>(x, out, [&](T v) { return static_cast<T>(v * k + bias); }));
  return out;
}

}  // namespace native
}  // namespace planted
