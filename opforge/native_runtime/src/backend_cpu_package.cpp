// Op-package nodes of a cpu delegate: the node read and checked, its library found, the
// op instance made (backend_cpu_package.h).
#include "backend_cpu_package.h"

#include <cmath>
#include <cstring>

#include "backend_cpu_blob.h"
#include "backend_cpu_json.h"
#include "errors.h"

namespace opforge::rt::cpu {
namespace {

constexpr char kMagic[8] = {'O', 'F', 'P', 'K', 'G', 'N', 'D', '\0'};
constexpr uint32_t kNodeVersion = 1;  // node.py FORMAT_VERSION
constexpr size_t kMaxBody = size_t(1) << 20;
constexpr uint32_t kMaxTensors = 1024, kMaxNdim = 16, kMaxValues = 1 << 16;
constexpr int32_t kErrorSize = 1024;  // runtime.py ERROR_SIZE

struct NodeTensor {
  int32_t dtype = 0;
  std::vector<int64_t> shape;
};
struct NodeParam {
  std::string name;
  int32_t kind = 0;  // 1 int, 2 float, 3 bool (OPFORGE_PKG_PARAM_*)
  bool is_list = false;
  std::vector<int64_t> ints;
  std::vector<double> floats;
};
struct Node {  // node.py PackageNode
  std::string package, op_type, custom_op, provider, target, platform, path;
  std::vector<NodeParam> params;
  std::vector<int32_t> slots;
  std::vector<NodeTensor> inputs, outputs;
  std::string describe() const { return "package " + package + "::" + op_type; }
};

std::string shown(const std::string& text, size_t limit = 80) {
  std::string out;
  for (char c : text.substr(0, limit)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return "'" + out + (text.size() > limit ? "...'" : "'");
}

// node.py _bad: the bytes are part of an untrusted program
[[noreturn]] void bad(const std::string& what) {
  raise(OPF_ERR_PROGRAM, "op-package node: " + what + " — valid: what `opforge export` writes — fix: "
                         "re-export the program; this one was altered or corrupted");
}

int32_t dtype_code(const std::string& name) {  // ScalarType's lower-case names
  static const struct { const char* name; int32_t code; } kTypes[] = {
      {"uint8", 0}, {"int8", 1}, {"int16", 2}, {"int32", 3}, {"int64", 4}, {"float16", 5},
      {"float32", 6}, {"float64", 7}, {"complex32", 8}, {"complex64", 9}, {"complex128", 10},
      {"bool", 11}, {"bfloat16", 15}, {"uint16", 27}, {"uint32", 28}, {"uint64", 29}};
  for (const auto& t : kTypes)
    if (name == t.name) return t.code;
  return -1;
}

class NodeReader {
 public:
  explicit NodeReader(const Json& j) : j_(j) {}

  const JValue& get(const JValue& obj, const char* key, JType type) const {
    const JValue* v = obj.type == JType::Object ? j_.member(obj, key) : nullptr;
    if (v == nullptr) bad(std::string("no '") + key + "'");
    if (v->type != type || (type == JType::Int && v->big)) bad(std::string("'") + key + "' has the wrong type");
    return *v;
  }
  std::string text(const JValue& obj, const char* key) const {
    std::string s = j_.str(get(obj, key, JType::String));
    if (s.empty() || s.size() > 4096 || s.find('\0') != std::string::npos)
      bad(std::string("'") + key + "' = " + shown(s));
    return s;
  }
  std::vector<NodeTensor> tensors(const JValue& obj, const char* key) const {
    const JValue& items = get(obj, key, JType::Array);
    if (items.count > kMaxTensors) bad(std::to_string(items.count) + " " + key);
    std::vector<NodeTensor> out(items.count);
    for (uint32_t k = 0; k < items.count; ++k) {
      const JValue& item = j_.item(items, k);
      std::string dtype = j_.str(get(item, "dtype", JType::String));
      out[k].dtype = dtype_code(dtype);
      if (out[k].dtype < 0) bad("dtype " + shown(dtype));
      const JValue& shape = get(item, "shape", JType::Array);
      if (shape.count > kMaxNdim) bad("a shape of rank " + std::to_string(shape.count));
      for (uint32_t d = 0; d < shape.count; ++d) {
        const JValue& v = j_.item(shape, d);
        if (v.type != JType::Int || v.big || v.i < 0 || v.i >= (int64_t(1) << 40)) bad("a shape size");
        out[k].shape.push_back(v.i);
      }
    }
    return out;
  }
  NodeParam param(const JValue& p) const {
    NodeParam out;
    std::string kind = j_.str(get(p, "kind", JType::String));
    out.kind = kind == "int" ? 1 : kind == "float" ? 2 : kind == "bool" ? 3 : 0;
    if (out.kind == 0) bad("param kind " + shown(kind));
    const JValue& values = get(p, "values", JType::Array);
    out.is_list = get(p, "list", JType::Bool).b;
    if (values.count > kMaxValues || (!out.is_list && values.count != 1))
      bad("a param with " + std::to_string(values.count) + " values");
    for (uint32_t k = 0; k < values.count; ++k) {
      const JValue& v = j_.item(values, k);
      bool ok = out.kind == 3 ? v.type == JType::Bool
                : out.kind == 1 ? v.type == JType::Int && !v.big
                                : (v.type == JType::Int && !v.big) || (v.type == JType::Float && std::isfinite(v.d));
      if (!ok) bad("a param value that is not a " + kind);
      if (out.kind == 2) out.floats.push_back(v.type == JType::Int ? (double)v.i : v.d);
      else out.ints.push_back(out.kind == 3 ? (int64_t)v.b : v.i);
    }
    out.name = text(p, "name");
    return out;
  }

 private:
  const Json& j_;
};

int hex_digit(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

// PackageNode.from_bytes(bytes.fromhex(hex_text))
Node read_node(const std::string& hex_text) {
  if (hex_text.size() % 2 != 0 || hex_text.size() / 2 > kMaxBody + 16)
    raise(OPF_ERR_PROGRAM, "cpu backend blob: a package node that is not hex — fix: re-export");
  std::string bytes(hex_text.size() / 2, '\0');
  for (size_t k = 0; k < bytes.size(); ++k) {
    int hi = hex_digit(hex_text[2 * k]), lo = hex_digit(hex_text[2 * k + 1]);
    if (hi < 0 || lo < 0) raise(OPF_ERR_PROGRAM, "cpu backend blob: a package node that is not hex — fix: re-export");
    bytes[k] = (char)(hi * 16 + lo);
  }
  if (bytes.size() < 16) bad(std::to_string(bytes.size()) + " bytes, shorter than the 16-byte header");
  if (std::memcmp(bytes.data(), kMagic, 8) != 0) bad("a magic that is not OFPKGND");
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int b = 3; b >= 0; --b) v = (v << 8) | (uint8_t)bytes[at + (size_t)b];
    return v;
  };
  if (u32(8) != kNodeVersion) bad("format version " + std::to_string(u32(8)) + "; this runtime reads 1");
  size_t size = u32(12);
  if (size > kMaxBody || 16 + size != bytes.size())
    bad("body length " + std::to_string(size) + " for " + std::to_string(bytes.size() - 16) + " bytes after the header");
  Json j;
  std::string problem;
  if (!valid_utf8(reinterpret_cast<const uint8_t*>(bytes.data()) + 16, size) ||
      !j.parse(bytes.data() + 16, size, &problem))
    bad("the body is not JSON");
  const JValue& body = j.root();
  if (body.type != JType::Object) bad("the body is not a JSON object");
  NodeReader r(j);
  Node node;
  const JValue& params = r.get(body, "params", JType::Array);
  if (params.count > kMaxTensors) bad(std::to_string(params.count) + " params");
  for (uint32_t k = 0; k < params.count; ++k) node.params.push_back(r.param(j.item(params, k)));
  const JValue& slots = r.get(body, "input_slots", JType::Array);
  node.inputs = r.tensors(body, "inputs");
  if (slots.count != node.inputs.size()) bad("input_slots for another number of inputs");
  for (uint32_t k = 0; k < slots.count; ++k) {
    const JValue& s = j.item(slots, k);
    if (s.type != JType::Int || s.big || s.i < 0 || s.i >= (int64_t)kMaxTensors) bad("an input slot");
    node.slots.push_back((int32_t)s.i);
  }
  node.package = r.text(body, "package");
  node.op_type = r.text(body, "op_type");
  node.custom_op = r.text(body, "custom_op");
  node.provider = r.text(body, "interface_provider");
  node.target = r.text(body, "target");
  node.platform = r.text(body, "platform");
  node.path = r.text(body, "package_path");
  node.outputs = r.tensors(body, "outputs");
  return node;
}

std::string lower_stripped(std::string s) {
  s.erase(0, s.find_first_not_of(" \t\n\r"));
  s.erase(s.find_last_not_of(" \t\n\r") + 1);
  for (char& c : s) c = (char)((c >= 'A' && c <= 'Z') ? c - 'A' + 'a' : c);
  return s;
}

// runtime.prepare: the registration of the node's package for this machine in the
// delegate's op_packages spec wins over the path recorded at export.
void resolve_library(const Node& node, const std::vector<std::pair<std::string, std::string>>& specs,
                     const std::string& where, std::string* path, std::string* provider) {
  *path = node.path;
  *provider = node.provider;
  const std::string* raw = nullptr;
  for (const auto& kv : specs)
    if (kv.first == "op_packages") raw = &kv.second;  // "j:<json>", checked by decode_num_threads
  if (raw == nullptr || raw->size() < 2) return;
  Json j;
  std::string problem;
  if (!j.parse(raw->data() + 2, raw->size() - 2, &problem) || j.root().type != JType::Array) return;
  std::vector<std::string> other_platforms;
  for (uint32_t k = 0; k < j.root().count; ++k) {
    const JValue& info = j.item(j.root(), k);
    auto field = [&](const char* key) -> std::string {
      const JValue* v = j.member(info, key);
      if (v != nullptr && v->type != JType::String)
        raise(OPF_ERR_PROGRAM, where + ": compile spec 'op_packages'[" + std::to_string(k) + "]: " + key +
                                   " is not a string — valid: OpPackageInfo fields — fix: re-export");
      return v == nullptr ? std::string() : j.str(*v);
    };
    if (info.type != JType::Object)
      raise(OPF_ERR_PROGRAM, where + ": compile spec 'op_packages'[" + std::to_string(k) + "] is not a mapping — "
                                 "valid: OpPackageInfo fields — fix: re-export");
    std::string name = field("op_package_name");
    name.erase(0, name.find_first_not_of(" \t\n\r"));
    name.erase(name.find_last_not_of(" \t\n\r") + 1);
    if (name != node.package) continue;
    std::string plat = field("platform");
    plat = plat.empty() ? host_platform() : lower_stripped(plat);
    if (plat != host_platform()) {
      other_platforms.push_back(plat);
      continue;
    }
    std::string lib = field("op_package_path"), given = field("interface_provider");
    lib.erase(0, lib.find_first_not_of(" \t\n\r"));
    lib.erase(lib.find_last_not_of(" \t\n\r") + 1);
    given.erase(0, given.find_first_not_of(" \t\n\r"));
    given.erase(given.find_last_not_of(" \t\n\r") + 1);
    *path = lib;
    *provider = given.empty() ? name + "InterfaceProvider" : given;
    return;
  }
  if (!other_platforms.empty())
    raise(OPF_ERR_LIBRARY, where + ": the compile spec registers package " + shown(node.package) + " only for " +
                               other_platforms[0] + "; this machine is " + host_platform() +
                               " — fix: register a " + host_platform() + " build of it");
}

std::string dims_text(int32_t dtype, const std::vector<int64_t>& dims) {
  std::string out = std::to_string(dtype) + "[";
  for (size_t k = 0; k < dims.size(); ++k) out += (k ? "," : "") + std::to_string(dims[k]);
  return out + "]";
}

// The engine hands the op its plan tensors: they must be what the node told create.
void check_against_plan(const Node& node, const Plan& plan, const PlanOp& op, const std::string& where) {
  auto check = [&](const std::vector<NodeTensor>& specs, const std::vector<int32_t>& ids, const char* kind) {
    if (specs.size() != ids.size())
      raise(OPF_ERR_PROGRAM, where + ": the node has " + std::to_string(specs.size()) + " " + kind +
                                 "s, the blob's op " + std::to_string(ids.size()) + " — fix: re-export the "
                                 "program; this one was altered or corrupted");
    for (size_t k = 0; k < ids.size(); ++k) {
      const PlanTensor& t = plan.tensors[(size_t)ids[k]];  // ids checked by the blob's checks
      if (t.dtype != specs[k].dtype || t.dims != specs[k].shape)
        raise(OPF_ERR_PROGRAM, where + ": " + kind + " " + std::to_string(k) + " is " +
                                   dims_text(specs[k].dtype, specs[k].shape) + " in the node and " +
                                   dims_text(t.dtype, t.dims) + " in the blob's plan — fix: re-export the "
                                   "program; this one was altered or corrupted");
    }
  };
  check(node.inputs, op.in, "input");
  check(node.outputs, op.out, "output");
}

std::vector<PkgTensor> descriptions(const std::vector<NodeTensor>& specs) {
  std::vector<PkgTensor> out(std::max<size_t>(specs.size(), 1));
  for (size_t k = 0; k < specs.size(); ++k)
    out[k] = PkgTensor{nullptr, specs[k].dtype, (int32_t)specs[k].shape.size(), specs[k].shape.data()};
  return out;
}

}  // namespace

std::unique_ptr<PackageInstance> prepare_package(const Plan& plan, const PlanOp& op,
                                                 const std::vector<std::pair<std::string, std::string>>& specs) {
  Node node = read_node(op.node);
  std::string where = "op-package node " + node.package + "::" + node.op_type + " (for " + node.custom_op + ")";
  check_against_plan(node, plan, op, where);
  if (lower_stripped(node.target) != "cpu")
    raise(OPF_ERR_LIBRARY, where + ": target " + shown(node.target) + " — only cpu packages run in opforge — "
                               "fix: build it with `opforge oppackage build DIR --target cpu`");
  if (node.platform != host_platform())
    raise(OPF_ERR_LIBRARY, where + ": exported for platform " + shown(node.platform) + "; this machine is " +
                               host_platform() + " — fix: export with a package built for it");
  std::string path, provider;
  resolve_library(node, specs, where, &path, &provider);
  PackageOpEntry entry = package_op(path, node.package, provider, node.op_type, where);

  std::vector<PkgParam> params(std::max<size_t>(node.params.size(), 1));
  for (size_t k = 0; k < node.params.size(); ++k) {
    const NodeParam& p = node.params[k];
    params[k] = PkgParam{p.name.c_str(), p.kind, p.is_list ? 1 : 0,
                         (int64_t)(p.kind == 2 ? p.floats.size() : p.ints.size()),
                         p.kind == 2 ? nullptr : p.ints.data(), p.kind == 2 ? p.floats.data() : nullptr};
  }
  std::vector<PkgTensor> ins = descriptions(node.inputs), outs = descriptions(node.outputs);
  void* impl = nullptr;
  char error[kErrorSize] = {0};
  int32_t rc = entry.create(params.data(), (int32_t)node.params.size(), ins.data(), node.slots.data(),
                            (int32_t)node.inputs.size(), outs.data(), (int32_t)node.outputs.size(), &impl,
                            error, kErrorSize);
  error[kErrorSize - 1] = '\0';
  if (rc != 0 || impl == nullptr)
    raise(OPF_ERR_KERNEL, where + ": the package refused the node: " +
                              (error[0] ? std::string(error) : "create returned " + std::to_string(rc)));
  return std::make_unique<PackageInstance>(entry.execute, entry.destroy, impl, node.describe());
}

}  // namespace opforge::rt::cpu
