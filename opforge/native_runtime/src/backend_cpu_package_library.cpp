// Op-package libraries for the native cpu backend: which a program may load (trust), and
// each loaded once and checked (backend_cpu_package.h). The same rules as
// opforge/backends/oppackage/runtime.py and opforge/_library_paths.py:
//
// - A program file is untrusted, and so are the library paths it names, while loading a
//   library runs its code: a library is loaded only when it, or a folder above it, was
//   given to opf_op_package_trust or is listed in $OPFORGE_OP_PACKAGES (':'-separated).
// - Opened once: the trust check reads the real path of the open descriptor back from
//   /proc/self/fd/N, and dlopen is given that descriptor, so a symlink or folder flipped
//   after the check cannot swap another library in. The descriptor stays open for the
//   process (opforge never unloads a package).
// - A trusted library is still refused when it, or a folder between its trust entry and
//   it, is world-writable, or a folder above is world-writable without the sticky bit.
// - Checked when loaded: the interface provider exists and reports ABI version 1, the
//   registered package name, target cpu, this machine's platform, at most 4096 ops with
//   create/execute/destroy each and no op type twice.
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <set>

#include "backend_cpu_package.h"
#include "errors.h"

namespace opforge::rt::cpu {
namespace {

constexpr uint32_t kAbiVersion = 1;  // OPFORGE_OPPACKAGE_ABI_VERSION
constexpr int32_t kMaxOps = 4096;
constexpr const char* kTrustEnv = "OPFORGE_OP_PACKAGES";

struct PkgOp {  // opforge_pkg_op
  const char* type_name;
  PkgCreateFn create;
  PkgExecuteFn execute;
  PkgDestroyFn destroy;
};
struct PkgInterface {  // opforge_pkg_interface
  uint32_t abi_version;
  const char* package_name;
  const char* package_version;
  const char* target;
  const char* platform;
  int32_t n_ops;
  const PkgOp* ops;
  const char* opdef;
};
using ProviderFn = int32_t (*)(uint32_t runtime_abi_version, const PkgInterface** out);

struct Loaded {
  std::string name;
  void* library = nullptr;
  std::map<std::string, PackageOpEntry> ops;
};

std::mutex& mu() {
  static std::mutex m;
  return m;
}
std::set<std::string>& trusted() {
  static auto* s = new std::set<std::string>();
  return *s;
}
std::map<std::string, Loaded>& loaded() {  // real path → package (never unloaded)
  static auto* m = new std::map<std::string, Loaded>();
  return *m;
}

std::string shown(const std::string& text, size_t limit = 200) {
  std::string out;
  for (char c : text.substr(0, limit)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return "'" + out + (text.size() > limit ? "...'" : "'");
}

// os.path.realpath: the resolved path when it exists, else the path made absolute.
std::string real_path(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) != nullptr) return buf;
  if (!path.empty() && path[0] == '/') return path;
  char cwd[PATH_MAX];
  return ::getcwd(cwd, sizeof cwd) != nullptr ? std::string(cwd) + "/" + path : path;
}

// The innermost trusted library or folder that allows `real`, or "".
std::string trust_entry(const std::string& real) {
  std::set<std::string> entries = trusted();
  const char* env = std::getenv(kTrustEnv);
  std::string list = env ? env : "";
  for (size_t start = 0; start <= list.size();) {
    size_t end = list.find(':', start);
    if (end == std::string::npos) end = list.size();
    if (end > start) entries.insert(real_path(list.substr(start, end - start)));
    start = end + 1;
  }
  std::string best;
  for (std::string e : entries) {
    std::string folder = e;
    while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
    bool allows = real == e || real.compare(0, folder.size() + 1, folder + "/") == 0;
    if (allows && e.size() > best.size()) best = e;
  }
  return best;
}

// _library_paths.world_writable_problem(real, root): "" when safe from other users.
std::string world_writable_problem(const std::string& real, const std::string& root) {
  std::string top = root;
  while (top.size() > 1 && top.back() == '/') top.pop_back();
  auto parent = [](const std::string& p) {
    size_t slash = p.rfind('/');
    return slash == 0 || slash == std::string::npos ? std::string("/") : p.substr(0, slash);
  };
  auto within = [](const std::string& p, const std::string& folder) {  // p == folder or below it
    return p == folder || folder == "/" || p.compare(0, folder.size() + 1, folder + "/") == 0;
  };
  if (!within(real, top)) top = parent(real);
  for (std::string p = real;; p = parent(p)) {
    struct stat st;
    if (::stat(p.c_str(), &st) == 0 && (st.st_mode & S_IWOTH)) {
      bool below_root = within(p, top);
      if (below_root || !(st.st_mode & S_ISVTX))
        return p + " is world-writable" + (below_root ? "" : " without the sticky bit");
    }
    if (p == "/") break;
  }
  return "";
}

std::string text_of(const char* s) { return s ? std::string(s) : std::string(); }

bool maps_file(int fd) {  // _library_paths.OpenedLibrary.loaded: the process maps this file
  struct stat st;
  if (::fstat(fd, &st) != 0) return false;
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return true;  // the held descriptor is the guarantee
  char want[32];
  std::snprintf(want, sizeof want, "%02x:%02x", major(st.st_dev), minor(st.st_dev));
  char line[4096];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, maps) != nullptr) {
    char dev[32] = {0};
    unsigned long long inode = 0;
    if (std::sscanf(line, "%*s %*s %*s %31s %llu", dev, &inode) == 2)
      found = inode == (unsigned long long)st.st_ino && std::strcmp(dev, want) == 0;
  }
  std::fclose(maps);
  return found;
}

// *held: set once dlopen took the descriptor, which then stays open for the process even
// when a check below refuses the library (the loader knows the library by that name: a
// later library opened under the same number would be matched to this one).
Loaded open_package(int fd, const std::string& real, const std::string& package, const std::string& provider,
                    const std::string& where, bool* held) {
  std::string load_path = "/proc/self/fd/" + std::to_string(fd);
  void* lib = ::dlopen(load_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  *held = lib != nullptr;
  if (lib == nullptr) {
    std::string why = text_of(::dlerror());
    raise(OPF_ERR_LIBRARY, where + ": cannot be loaded (" + why + ") — valid: a shared library built by "
                           "`opforge oppackage build` for " + host_platform() + ", its dependencies on the "
                           "loader's path or an absolute rpath — fix: rebuild it on this machine");
  }
  if (!maps_file(fd))
    raise(OPF_ERR_LIBRARY, where + ": the dynamic loader returned another library than the file opened (" +
                               real + ") — fix: load it in a fresh process");
  auto fn = reinterpret_cast<ProviderFn>(::dlsym(lib, provider.c_str()));
  if (fn == nullptr)
    raise(OPF_ERR_LIBRARY, where + ": interface provider " + shown(provider) + " — the library exports no such "
                           "symbol — valid: the package's <PackageName>InterfaceProvider, here '" + package +
                           "InterfaceProvider' — fix: set interface_provider to it, or leave it out");
  const PkgInterface* iface = nullptr;
  int32_t rc = fn(kAbiVersion, &iface);
  if (rc != 0 || iface == nullptr)
    raise(OPF_ERR_LIBRARY, where + ": " + provider + " returned " + std::to_string(rc) + " and no interface — "
                           "fix: rebuild the package with `opforge oppackage build`");
  if (iface->abi_version != kAbiVersion)
    raise(OPF_ERR_LIBRARY, where + ": built for op-package ABI version " + std::to_string(iface->abi_version) +
                               "; this opforge speaks version 1 — fix: rebuild it with this opforge "
                               "(`opforge oppackage build DIR --target cpu`)");
  Loaded out;
  out.library = lib;
  out.name = text_of(iface->package_name);
  if (text_of(iface->target) != "cpu")
    raise(OPF_ERR_LIBRARY, where + ": built for target " + shown(text_of(iface->target)) + " — valid: cpu — "
                           "fix: `opforge oppackage build DIR --target cpu`");
  if (text_of(iface->platform) != host_platform())
    raise(OPF_ERR_LIBRARY, where + ": built for platform " + shown(text_of(iface->platform)) + ", this machine "
                           "is " + host_platform() + " — fix: build it here (`opforge oppackage build`)");
  if (iface->n_ops < 0 || iface->n_ops > kMaxOps || (iface->n_ops > 0 && iface->ops == nullptr))
    raise(OPF_ERR_LIBRARY, where + ": reports " + std::to_string(iface->n_ops) + " ops" +
                               (iface->ops == nullptr ? " and a NULL op table" : "") + " — valid: 0..4096 "
                               "opforge_pkg_op entries — fix: rebuild the package with `opforge oppackage build`");
  for (int32_t k = 0; k < iface->n_ops; ++k) {
    const PkgOp& op = iface->ops[k];
    std::string type = text_of(op.type_name);
    if (!op.create || !op.execute || !op.destroy)
      raise(OPF_ERR_LIBRARY, where + ": op " + shown(type) + " lacks create/execute/destroy");
    if (!out.ops.emplace(type, PackageOpEntry{op.create, op.execute, op.destroy}).second)
      raise(OPF_ERR_LIBRARY, where + ": op type " + shown(type) + " listed twice by the package");
  }
  return out;
}

}  // namespace

std::string host_platform() {
  struct utsname u;
  std::string machine = ::uname(&u) == 0 ? u.machine : "";
  for (char& c : machine) c = (char)((c >= 'A' && c <= 'Z') ? c - 'A' + 'a' : c);
  return machine == "amd64" ? "x86_64" : machine == "arm64" ? "aarch64" : machine;
}

PackageOpEntry package_op(const std::string& path, const std::string& package, const std::string& provider,
                          const std::string& op_type, const std::string& node_where) {
  std::string where = node_where + ": op package " + shown(package) + " (" + shown(path) + ")";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    raise(OPF_ERR_LIBRARY, where + (errno == ENOENT ? ": no such file" : ": cannot be opened (" +
                                                       std::string(std::strerror(errno)) + ")") +
                               " — valid: the library `opforge oppackage build` writes — fix: build it and "
                               "register its path (the op_packages compile spec)");
  bool keep = false;
  struct Closer {
    int fd;
    bool* keep;
    ~Closer() { if (!*keep) ::close(fd); }
  } closer{fd, &keep};
  struct stat st;
  char real[PATH_MAX];
  std::string proc = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? ::readlink(proc.c_str(), real, sizeof real - 1) : -2;
  if (n == -2) raise(OPF_ERR_LIBRARY, where + ": not a regular file — valid: a shared library");
  if (n < 0)
    raise(OPF_ERR_LIBRARY, where + ": /proc/self/fd is not available, and opforge loads a library only "
                           "through the descriptor it checked (Linux with /proc mounted)");
  real[n] = '\0';
  std::lock_guard<std::mutex> lock(mu());
  std::string root = trust_entry(real);
  if (root.empty())
    raise(OPF_ERR_LIBRARY, where + ": the program names the package library " + shown(path) + ", and opforge "
                           "loads a library a program names (its code runs) only when you allow it — fix: "
                           "1. call opf_op_package_trust(path) before loading the program, or 2. set " +
                               std::string(kTrustEnv) + "=" + path + " (libraries or folders, separated by ':')");
  std::string problem = world_writable_problem(real, root);
  if (!problem.empty())
    raise(OPF_ERR_LIBRARY, where + ": the library " + shown(real) + " is trusted, but " + problem +
                               ": anyone on this machine could have put their code there — valid: a library "
                               "in folders only its owners can write — fix: chmod o-w the folder (or the "
                               "file), or move the package to a folder of your own and trust that");
  auto it = loaded().find(real);
  if (it == loaded().end()) {
    it = loaded().emplace(real, open_package(fd, real, package, provider, where, &keep)).first;
  }
  const Loaded& pkg = it->second;
  if (pkg.name != package)
    raise(OPF_ERR_LIBRARY, where + ": the library is package " + shown(pkg.name) + ", registered as " +
                               shown(package) + " — fix: set op_package_name to " + shown(pkg.name));
  if (::dlsym(pkg.library, provider.c_str()) == nullptr)
    raise(OPF_ERR_LIBRARY, where + ": interface provider " + shown(provider) + " — the library exports no "
                           "such symbol — fix: set interface_provider to '" + package + "InterfaceProvider'");
  auto op = pkg.ops.find(op_type);
  if (op == pkg.ops.end()) {
    std::string valid;
    for (const auto& kv : pkg.ops) valid += (valid.empty() ? "" : ", ") + kv.first;
    raise(OPF_ERR_LIBRARY, where + ": the package (" + real + ") has no op type " + shown(op_type) +
                               " — valid: " + (valid.empty() ? "(none)" : valid) + " — fix: rebuild the "
                               "package from the OpDef the model was exported with");
  }
  return op->second;
}

}  // namespace opforge::rt::cpu

using namespace opforge::rt;

extern "C" OPF_API opf_status opf_op_package_trust(const char* path) {
  try {
    clear_last_error();
    if (path == nullptr || path[0] == '\0')
      raise(OPF_ERR_INVALID_ARGUMENT, "`opf_op_package_trust`: path — NULL or empty — valid: an op-package "
                                      "library or a folder of them — fix: pass its path");
    std::lock_guard<std::mutex> lock(cpu::mu());
    cpu::trusted().insert(cpu::real_path(path));
    return OPF_OK;
  } catch (const Error& e) {
    set_last_error(e.message);
    return e.status;
  } catch (const std::bad_alloc&) {
    set_last_error("`opf_op_package_trust`: out of memory");
    return OPF_ERR_MEMORY;
  }
}
