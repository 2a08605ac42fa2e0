// Loading the cpu engine library (backend_cpu_engine.h).
#include "backend_cpu_engine.h"

#include <dlfcn.h>

#include <cstdlib>
#include <type_traits>
#include <map>
#include <memory>
#include <mutex>

#include "backend.h"
#include "errors.h"

namespace opforge::rt::cpu {
namespace {

std::mutex& engines_mutex() {
  static std::mutex mu;
  return mu;
}
// path → its loaded engine (never unloaded: engines of destroyed programs may have left
// OpenMP threads running its code)
std::map<std::string, std::unique_ptr<EngineApi>>& engines() {
  static auto* table = new std::map<std::string, std::unique_ptr<EngineApi>>();
  return *table;
}

const char* kFindEngine =
    "python -c 'from opforge.backends.cpu.engine import installed_library; "
    "print(installed_library())'";

}  // namespace

const EngineApi& engine_api() {
  std::string path = backend_library_path("cpu");
  if (path.empty()) {
    const char* env = std::getenv(kEngineEnv);
    if (env != nullptr) path = env;
  }
  if (path.empty())
    raise(OPF_ERR_UNSUPPORTED,
          "cpu backend: needs the cpu backend's engine library, and none is set — valid: the "
                  "engine opforge installs (libopforge_cpu.<hash>.so) — fix: 1. call "
                  "opf_backend_set_library(\"cpu\", path) before loading, or 2. set " +
              std::string(kEngineEnv) + " to its path (" + kFindEngine +
              " prints it), with oneDNN's libdnnl.so.3 on LD_LIBRARY_PATH; or 3. export the "
              "program without the cpu backend");
  std::lock_guard<std::mutex> lock(engines_mutex());
  auto it = engines().find(path);
  if (it != engines().end()) return *it->second;
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    raise(OPF_ERR_UNSUPPORTED,
          "cpu backend: the engine library " + path + " cannot be loaded: " +
              (why ? why : "dlopen failed") + " — valid: the engine opforge installs, with "
              "oneDNN's libdnnl.so.3 loadable — fix: point opf_backend_set_library(\"cpu\", ...) "
              "or " + kEngineEnv + " at it (" + kFindEngine + "), and put the folder of "
              "libdnnl.so.3 (the onednn-cpu-gomp wheel's lib/) on LD_LIBRARY_PATH");
  }
  auto api = std::make_unique<EngineApi>();
  api->path = path;
  std::string missing;
  auto bind = [&](auto& fn, const char* name) {
    void* sym = dlsym(lib, name);
    if (sym == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym);
  };
  bind(api->abi_version, "ofc_abi_version");
  bind(api->create, "ofc_new");
  bind(api->destroy, "ofc_destroy");
  bind(api->weight_cache_new, "ofc_weight_cache_new");
  bind(api->weight_cache_free, "ofc_weight_cache_free");
  bind(api->use_weight_cache, "ofc_use_weight_cache");
  bind(api->add_tensor, "ofc_add_tensor");
  bind(api->tensor_file, "ofc_tensor_file");
  bind(api->post_op, "ofc_post_op");
  bind(api->add_op, "ofc_add_op");
  bind(api->add_kernel, "ofc_add_kernel");
  bind(api->add_external, "ofc_add_external");
  bind(api->finalize, "ofc_finalize");
  bind(api->execute, "ofc_execute");
  if (!missing.empty() || api->abi_version() != kEngineAbiVersion) {
    std::string found = !missing.empty() ? "it lacks " + missing
                                          : "it has engine ABI " + std::to_string(api->abi_version());
    dlclose(lib);
    raise(OPF_ERR_LIBRARY, "cpu backend: the engine library " + path + ": " + found +
                               " — valid: an engine of ABI " + std::to_string(kEngineAbiVersion) +
                               " (this runtime's) — fix: use the engine of the opforge this runtime "
                               "was built with (" + kFindEngine + ")");
  }
  const EngineApi& out = *api;
  engines()[path] = std::move(api);
  return out;
}

}  // namespace opforge::rt::cpu
