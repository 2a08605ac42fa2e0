// Call-outs: an op-package op (opforge_external, cpu_external.h) and a custom op's native
// kernel (the kernel ABI, kernel_abi.h). The engine does not know what they compute, so
// their contract is the ABI's: every tensor C-contiguous and entirely inside its storage
// (they receive sizes only), no output a constant or a delegate input
// (validate_callout, validate.cpp); kernel arguments name existing tensors and pool ranges.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "engine.h"
#include "opforge/cpu_external.h"
#include "opforge/kernel_abi.h"

// crash_report.cpp: which call-out this thread is in, for a crash report naming it
extern "C" void ofc_crash_enter(const void* fn);

namespace ofc {

struct ExternalOp : Op {
  opforge_external ext{};
  std::vector<opforge_ext_tensor> tin, tout;
  void run(Engine& e) override {
    for (size_t k = 0; k < ins.size(); ++k) tin[k].data = e.ptr(ins[k]);
    for (size_t k = 0; k < outs.size(); ++k) tout[k].data = e.ptr(outs[k]);
    char error[512] = {0};
    ofc_crash_enter((const void*)ext.fn);
    int32_t rc = ext.fn(ext.state, tin.data(), (int32_t)tin.size(), tout.data(), (int32_t)tout.size(),
                        error, (int32_t)sizeof(error));
    ofc_crash_enter(nullptr);
    error[sizeof(error) - 1] = 0;
    if (rc != 0) fail(name + ": " + (error[0] ? error : "failed without a message"));
  }
};

// a custom op's native kernel (kernel ABI), with its non-tensor arguments bound at init
struct KernelCallOp : Op {
  opforge_kernel_fn fn = nullptr;
  std::vector<opforge_arg> args;
  std::vector<int32_t> slot;                 // per arg: -1, or the tensor's index in ins+outs
  std::vector<std::vector<int64_t>> strides; // contiguous strides of each tensor arg
  std::vector<int64_t> int_pool;
  std::vector<double> double_pool;
  void run(Engine& e) override {
    size_t n_in = ins.size();
    for (size_t k = 0; k < args.size(); ++k) {
      if (slot[k] < 0) continue;
      int id = (size_t)slot[k] < n_in ? ins[(size_t)slot[k]] : outs[(size_t)slot[k] - n_in];
      args[k].v.tensor.data = e.ptr(id);
    }
    opforge_context ctx;
    std::memset(&ctx, 0, sizeof(ctx));
    ofc_crash_enter((const void*)fn);
    fn(&ctx, args.data(), (int64_t)args.size());
    ofc_crash_enter(nullptr);
    if (ctx.status != 0) fail(name + ": " + std::string(ctx.message, strnlen(ctx.message, sizeof(ctx.message))));
  }
};

}  // namespace ofc

using namespace ofc;

namespace {
std::vector<int> id_list(const Engine& e, const int32_t* p, int32_t n, const char* what) {
  if (n < 0 || n > 64 || (n > 0 && p == nullptr)) fail(std::string(what) + ": bad count");
  std::vector<int> out;
  for (int32_t i = 0; i < n; ++i) {
    if (p[i] < 0 || (size_t)p[i] >= e.tensors.size()) fail(std::string(what) + ": tensor id out of range");
    out.push_back(p[i]);
  }
  return out;
}
}  // namespace

extern "C" {

int32_t ofc_add_external(void* handle, opforge_ext_fn fn, void* state, const char* name,
                         const int32_t* ins, int32_t n_in, const int32_t* outs, int32_t n_out,
                         char* error, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  try {
    Engine& e = h->e;
    if (e.finalized) fail("op added after finalize");
    if (fn == nullptr) fail("external: no function");
    if (!h->pending_post.empty()) fail("external: takes no post-ops");
    auto op = std::make_unique<ExternalOp>();
    op->ext.fn = fn; op->ext.state = state;
    op->name = name ? name : "external";
    op->ins = id_list(e, ins, n_in, "external"); op->outs = id_list(e, outs, n_out, "external");
    validate_callout(e, op->ins, op->outs, "external");
    for (int id : op->ins) {
      const Tensor& t = e.tensors[(size_t)id];
      op->tin.push_back({nullptr, t.dtype, (int32_t)t.dims.size(), t.dims.data()});
    }
    for (int id : op->outs) {
      const Tensor& t = e.tensors[(size_t)id];
      op->tout.push_back({nullptr, t.dtype, (int32_t)t.dims.size(), t.dims.data()});
    }
    e.ops.push_back(std::move(op));
    return 0;
  } catch (const std::exception& ex) {
    set_error(error, size, ex.what());
    return 1;
  }
}

// args: tag (OPFORGE_ARG_*), value (int / slot / list offset into the pools), list length,
// double value; tensor args name a slot in ins+outs
int32_t ofc_add_kernel(void* handle, opforge_kernel_fn fn, const char* name, const int32_t* ins,
                       int32_t n_in, const int32_t* outs, int32_t n_out, int32_t n_args,
                       const int32_t* tags, const int64_t* values, const int64_t* lengths,
                       const double* doubles, const int64_t* int_pool, int64_t n_int,
                       const double* double_pool, int64_t n_double, char* error, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  try {
    Engine& e = h->e;
    if (e.finalized) fail("op added after finalize");
    if (fn == nullptr || n_args < 0 || n_args > 256 || n_int < 0 || n_int > 65536 || n_double < 0 ||
        n_double > 65536)
      fail("kernel call: bad counts");
    if (!h->pending_post.empty()) fail("kernel call: takes no post-ops");
    auto op = std::make_unique<KernelCallOp>();
    op->fn = fn;
    op->name = name ? name : "kernel";
    op->ins = id_list(e, ins, n_in, "kernel"); op->outs = id_list(e, outs, n_out, "kernel");
    validate_callout(e, op->ins, op->outs, "kernel call");
    op->int_pool.assign(int_pool, int_pool + n_int);
    op->double_pool.assign(double_pool, double_pool + n_double);
    op->args.resize((size_t)n_args);
    op->slot.assign((size_t)n_args, -1);
    op->strides.resize((size_t)n_args);
    for (int32_t k = 0; k < n_args; ++k) {
      opforge_arg& a = op->args[(size_t)k];
      std::memset(&a, 0, sizeof(a));
      a.tag = tags[k];
      switch (tags[k]) {
        case OPFORGE_ARG_NONE: break;
        case OPFORGE_ARG_TENSOR: {
          int64_t s = values[k];
          if (s < 0 || s >= (int64_t)n_in + n_out) fail("kernel call: tensor slot out of range");
          op->slot[(size_t)k] = (int32_t)s;
          int id = s < n_in ? op->ins[(size_t)s] : op->outs[(size_t)(s - n_in)];
          const Tensor& t = e.tensors[(size_t)id];
          auto& st = op->strides[(size_t)k];
          st.assign(t.dims.size(), 1);
          for (int j = (int)t.dims.size() - 2; j >= 0; --j)
            st[(size_t)j] = mul_c(st[(size_t)j + 1], std::max<int64_t>(t.dims[(size_t)j + 1], 1), "kernel call");
          a.v.tensor.sizes = t.dims.data();
          a.v.tensor.strides = st.data();
          a.v.tensor.dtype = t.dtype;
          a.v.tensor.rank = (int32_t)t.dims.size();
          break;
        }
        case OPFORGE_ARG_INT: case OPFORGE_ARG_BOOL: case OPFORGE_ARG_SCALAR_TYPE: a.v.i = values[k]; break;
        case OPFORGE_ARG_DOUBLE: a.v.d = doubles[k]; break;
        case OPFORGE_ARG_INT_LIST: case OPFORGE_ARG_BOOL_LIST: {
          int64_t off = values[k], len = lengths[k];
          if (off < 0 || len < 0 || off > n_int || len > n_int - off) fail("kernel call: list out of range");
          if (tags[k] == OPFORGE_ARG_BOOL_LIST) fail("kernel call: bool lists are not supported");
          a.v.list.data = op->int_pool.data() + off; a.v.list.size = len;
          break;
        }
        case OPFORGE_ARG_DOUBLE_LIST: {
          int64_t off = values[k], len = lengths[k];
          if (off < 0 || len < 0 || off > n_double || len > n_double - off) fail("kernel call: list out of range");
          a.v.list.data = op->double_pool.data() + off; a.v.list.size = len;
          break;
        }
        default: fail("kernel call: argument tag " + std::to_string(tags[k]) + " not supported");
      }
    }
    e.ops.push_back(std::move(op));
    return 0;
  } catch (const std::exception& ex) {
    set_error(error, size, ex.what());
    return 1;
  }
}

}  // extern "C"
