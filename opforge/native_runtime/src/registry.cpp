// The kernel registry (registry.h): checking, adding and selecting kernels.
#include "registry.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <set>

#include "errors.h"

namespace opforge::rt {

const char* const kLoad = "opf_registry_load_library";

static bool valid_identifier(const char* begin, const char* end) {
  if (begin == end || !(std::isalpha(static_cast<unsigned char>(*begin)) || *begin == '_'))
    return false;
  for (const char* p = begin; p != end; ++p)
    if (!(std::isalnum(static_cast<unsigned char>(*p)) || *p == '_')) return false;
  return true;
}

// "ns::op" + "overload" → "ns::op.overload", or "" when either part is malformed.
static std::string entry_key(const opforge_kernel_entry& e) {
  if (e.op == nullptr || e.overload == nullptr) return "";
  const char* op = e.op;
  const char* colon = std::strstr(op, "::");
  const char* end = op + std::strlen(op);
  if (colon == nullptr || !valid_identifier(op, colon) || !valid_identifier(colon + 2, end))
    return "";
  size_t n = std::strlen(e.overload);
  for (size_t i = 0; i < n; ++i)
    if (!(std::isalnum(static_cast<unsigned char>(e.overload[i])) || e.overload[i] == '_'))
      return "";
  return n ? std::string(op) + "." + e.overload : std::string(op);
}

// "v1/6;0,2,3,1|6" with meta_args → checks; throws on a malformed key.
static std::vector<MetaCheck> parse_meta(const std::string& origin, const std::string& key,
                                  const opforge_kernel_entry& e) {
  std::vector<MetaCheck> meta;
  std::string dk = e.dtype_key ? e.dtype_key : "default";
  if (dk == "default") return meta;
  auto bad = [&](const std::string& why) {
    raise(OPF_ERR_LIBRARY, std::string("`") + kLoad + "(" + origin + ")`: kernel " + key +
                               " dtype_key '" + dk + "' — " + why +
                               " — valid: 'default' or 'v1/<dtype>[;<dim order>]|...' with one "
                               "meta argument per dtype — fix: rebuild the library with `opforge build`");
  };
  if (dk.rfind("v1/", 0) != 0) bad("not a version-1 dtype key");
  std::string rest = dk.substr(3);
  size_t start = 0;
  int32_t n = 0;
  while (true) {
    size_t bar = rest.find('|', start);
    std::string part = rest.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
    if (n >= e.num_meta) bad("more dtypes than meta_args");
    MetaCheck m;
    m.arg = e.meta_args[n];
    if (m.arg < 0 || m.arg >= e.num_args) bad("a meta argument index out of range");
    size_t semi = part.find(';');
    std::string dtype = part.substr(0, semi);
    if (dtype.empty() || dtype.size() > 3 || dtype.find_first_not_of("0123456789") != std::string::npos)
      bad("a dtype that is not a number");
    m.dtype = std::stoi(dtype);
    if (semi != std::string::npos) {
      std::string order = part.substr(semi + 1);
      size_t s = 0;
      while (s <= order.size()) {
        size_t comma = order.find(',', s);
        std::string d = order.substr(s, comma == std::string::npos ? std::string::npos : comma - s);
        if (d.empty() || d.size() > 2 || d.find_first_not_of("0123456789") != std::string::npos)
          bad("a dim order that is not a list of numbers");
        m.dim_order.push_back(std::stoi(d));
        if (comma == std::string::npos) break;
        s = comma + 1;
      }
    }
    meta.push_back(std::move(m));
    ++n;
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  if (n != e.num_meta) bad("fewer dtypes than meta_args");
  return meta;
}

// A tensor argument's dim order from its strides, outermost first (native.py _dim_order).
static std::vector<int32_t> dim_order_of(const opforge_tensor& t) {
  std::vector<int32_t> order(static_cast<size_t>(std::max(t.rank, 0)));
  for (int32_t d = 0; d < t.rank; ++d) order[d] = d;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    int64_t sa = t.strides[a] < 0 ? -t.strides[a] : t.strides[a];
    int64_t sb = t.strides[b] < 0 ? -t.strides[b] : t.strides[b];
    return sa > sb;
  });
  return order;
}


const Binding* Kernel::select(const opforge_arg* args, int64_t n) const {
  for (const Binding& b : specific) {
    bool ok = true;
    for (const MetaCheck& m : b.meta) {
      if (m.arg >= n || args[m.arg].tag != OPFORGE_ARG_TENSOR ||
          args[m.arg].v.tensor.dtype != m.dtype) { ok = false; break; }
      if (!m.dim_order.empty() && dim_order_of(args[m.arg].v.tensor) != m.dim_order) {
        ok = false;
        break;
      }
    }
    if (ok) return &b;
  }
  return fallback;
}

// Edit distance (for the near names of a missing key, as difflib's close matches).
static size_t distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::vector<std::string> near_keys(const opf_registry& registry, const std::string& key) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const std::string& k : registry.keys) {
    if (k == key) continue;
    size_t longest = std::max(k.size(), key.size());
    size_t d = distance(k, key);
    if (4 * d <= longest) scored.emplace_back(d, k);  // at least 75% alike
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> near;
  for (size_t i = 0; i < scored.size() && i < 3; ++i) near.push_back(scored[i].second);
  return near;
}

void load_library(opf_registry* registry, const std::string& path, bool override_existing) {
  auto refuse = [&](const std::string& found, const std::string& fix) {
    raise(OPF_ERR_LIBRARY, std::string("`") + kLoad + "(" + path + ")`: " + found +
                               " — valid: a shared library built by `opforge build` for kernel ABI "
                               "version " + std::to_string(OPFORGE_ABI_VERSION) + " — fix: " + fix);
  };
  // dlopen() of a FIFO blocks until a writer comes, of a device reads it: refuse anything
  // but a regular file first (as opforge.runtime.native does)
  struct stat info;
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    const char* kind = S_ISFIFO(info.st_mode) ? "a FIFO" : S_ISDIR(info.st_mode) ? "a directory"
                       : S_ISCHR(info.st_mode) || S_ISBLK(info.st_mode) ? "a device" : S_ISSOCK(info.st_mode) ? "a socket"
                                                                                          : "a special file";
    refuse(std::string("it is ") + kind + ", not a regular file", "pass the library's path");
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    refuse(std::string("the dynamic loader refused it (") + (why ? why : "unknown") + ")",
           "check the path and rebuild it with `opforge build`");
  }
  struct Closer {
    void* h;
    ~Closer() { if (h) dlclose(h); }
  } closer{handle};
  auto reg = reinterpret_cast<opforge_register_kernels_fn>(dlsym(handle, OPFORGE_REGISTER_SYMBOL));
  if (reg == nullptr)
    refuse(std::string("it exports no `") + OPFORGE_REGISTER_SYMBOL + "` (not an opforge kernel library)",
           "rebuild it with `opforge build`");
  const opforge_library* library = reg();
  if (library == nullptr) refuse(std::string("`") + OPFORGE_REGISTER_SYMBOL + "()` returned NULL",
                                 "rebuild it with `opforge build`");
  registry->add(library, path, override_existing);
  registry->handles.push_back(handle);
  closer.h = nullptr;
}

}  // namespace opforge::rt

using opforge::rt::Binding;
using opforge::rt::Kernel;
using opforge::rt::raise;

opf_registry::~opf_registry() {
  kernels.clear();
  table.clear();
  for (void* handle : handles) dlclose(handle);
}

const Kernel* opf_registry::lookup(const std::string& key) const {
  auto it = table.find(key);
  if (it == table.end()) return nullptr;
  return it->second.over ? it->second.over : it->second.base;
}

void opf_registry::add(const opforge_library* library, const std::string& origin,
                       bool override_existing) {
  const std::string api = std::string("`opf_registry_load_library(") + origin + ")`: ";
  auto refuse = [&](const std::string& found, const std::string& fix) {
    raise(OPF_ERR_LIBRARY, api + found + " — valid: a kernel table of ABI version " +
                               std::to_string(OPFORGE_ABI_VERSION) + " — fix: " + fix);
  };
  // the version first (the first field in every version), then the entry size, then the rest
  if (library->abi_version != OPFORGE_ABI_VERSION)
    refuse("it was built for kernel ABI version " + std::to_string(library->abi_version) +
               ", and this runtime implements version " + std::to_string(OPFORGE_ABI_VERSION),
           "rebuild the library with this opforge (`opforge build`)");
  if (library->entry_size != sizeof(opforge_kernel_entry))
    refuse("its kernel entries are " + std::to_string(library->entry_size) + " bytes; ABI version " +
               std::to_string(OPFORGE_ABI_VERSION) + " has " + std::to_string(sizeof(opforge_kernel_entry)),
           "rebuild the library with this opforge (`opforge build`)");
  if (library->num_kernels < 0 || library->num_kernels > (int64_t(1) << 24) ||
      (library->num_kernels > 0 && library->kernels == nullptr))
    refuse("its table holds " + std::to_string(library->num_kernels) + " kernels at " +
               (library->kernels ? "a table" : "NULL"),
           "rebuild the library with `opforge build`");
  // group the entries by key, checking each
  std::map<std::string, std::unique_ptr<Kernel>> fresh;
  std::vector<std::string> order;
  for (int64_t i = 0; i < library->num_kernels; ++i) {
    const opforge_kernel_entry& e = library->kernels[i];
    std::string key = opforge::rt::entry_key(e);
    if (key.empty())
      refuse("entry " + std::to_string(i) + " has a malformed operator name",
             "spell it 'namespace::op' with an overload such as 'out'");
    if (e.fn == nullptr)
      refuse("kernel " + std::string(e.kernel_name ? e.kernel_name : "?") + " for " + key +
                 " is not defined in the library",
             "define it in the sources and rebuild");
    if (e.num_args < 0 || e.num_args > 1024 || (e.num_args > 0 && e.arg_kinds == nullptr) ||
        e.num_meta < 0 || e.num_meta > e.num_args || (e.num_meta > 0 && e.meta_args == nullptr))
      refuse("kernel " + key + " declares " + std::to_string(e.num_args) + " arguments and " +
                 std::to_string(e.num_meta) + " meta arguments inconsistently",
             "rebuild the library with `opforge build`");
    Binding binding{&e, opforge::rt::parse_meta(origin, key, e)};
    auto& kernel = fresh[key];
    if (!kernel) {
      kernel = std::make_unique<Kernel>();
      kernel->key = key;
      kernel->origin = origin;
      kernel->override_level = override_existing;
      kernel->kinds = e.arg_kinds;
      kernel->num_args = e.num_args;
      kernel->schema = e.schema ? e.schema : "";
      order.push_back(key);
    } else if (kernel->num_args != e.num_args) {
      refuse("the bindings of " + key + " declare different argument counts",
             "rebuild the library with `opforge build`");
    }
    if (binding.meta.empty() && std::any_of(kernel->storage.begin(), kernel->storage.end(),
                                            [](const Binding& b) { return b.meta.empty(); }))
      refuse(key + " has two fallback kernels (dtype_key 'default')",
             "keep one `arg_meta: null` kernel per op in the manifest");
    kernel->storage.push_back(std::move(binding));
  }
  // precedence: refuse the whole library before adding anything
  for (const std::string& key : order) {
    auto it = table.find(key);
    if (it == table.end()) continue;
    const Kernel* first = override_existing ? it->second.over : lookup(key);
    if (first != nullptr)
      raise(OPF_ERR_LIBRARY,
            api + key + " already has " + (override_existing ? "an overriding kernel" : "a kernel") +
                ", registered by " + first->origin + " — valid: one " +
                (override_existing ? "overriding kernel" : "kernel") + " per key — fix: " +
                (override_existing ? "load only one of the two libraries, or drop the op from one of them"
                                   : "load the library with override_existing = 1 to replace the first, "
                                     "or remove the op from one of them"));
  }
  for (const std::string& key : order) {
    std::unique_ptr<Kernel>& kernel = fresh[key];
    for (const Binding& b : kernel->storage)
      if (!b.meta.empty()) kernel->specific.push_back(b);
    for (const Binding& b : kernel->storage)
      if (b.meta.empty()) kernel->fallback = &b;
    Slot& slot = table[key];
    (override_existing ? slot.over : slot.base) = kernel.get();
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    kernels.push_back(std::move(kernel));
  }
}
