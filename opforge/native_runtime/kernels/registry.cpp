// Merges the kernel families into one opforge_library, as a native kernel library would
// return it: the runtime registers it like any other, and abi_export.cpp exports it.
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "portable.h"

namespace opforge::portable {
namespace {

struct Table {
  std::vector<opforge_kernel_entry> entries;
  std::vector<std::vector<int32_t>> kinds;     // one per entry, owned here
  std::vector<std::string> names, overloads;   // split keys
  std::vector<std::string> schemas;            // "ns::op.overload(Tensor a0, ...) -> ()"
  opforge_library library{};
  std::string problem;                         // a malformed kinds string (a bug here)
};

int32_t parse_kind(const std::string& token, bool* ok) {
  std::string base = token;
  int32_t flags = 0;
  if (!base.empty() && base.back() == '!') { flags |= OPFORGE_KIND_OUT; base.pop_back(); }
  if (!base.empty() && base.back() == '?') { flags |= OPFORGE_KIND_OPTIONAL; base.pop_back(); }
  static const struct { const char* name; int32_t kind; } kBases[] = {
      {"T", OPFORGE_ARG_TENSOR}, {"TL", OPFORGE_ARG_TENSOR_LIST},
      {"S", OPFORGE_KIND_SCALAR}, {"I", OPFORGE_ARG_INT}, {"D", OPFORGE_ARG_DOUBLE},
      {"B", OPFORGE_ARG_BOOL}, {"IL", OPFORGE_ARG_INT_LIST}, {"DL", OPFORGE_ARG_DOUBLE_LIST},
      {"BL", OPFORGE_ARG_BOOL_LIST}, {"ST", OPFORGE_ARG_SCALAR_TYPE}, {"STR", OPFORGE_ARG_STRING},
  };
  // "TL?" is the optional-tensor list, a kind of its own (items may be None)
  if (base == "TL" && (flags & OPFORGE_KIND_OPTIONAL)) return OPFORGE_ARG_OPT_TENSOR_LIST;
  for (const auto& b : kBases)
    if (base == b.name) return b.kind | flags;
  *ok = false;
  return 0;
}

// A schema the Python bridge parses (it finds the written arguments in it), spelled from
// the kinds: "aten::add.out(Tensor a0, Tensor a1, Scalar a2, *, Tensor(a!) a3) -> ()".
std::string schema_of(const std::string& key, const std::vector<int32_t>& kinds) {
  std::string s = key + "(";
  for (size_t i = 0; i < kinds.size(); ++i) {
    int32_t base = kinds[i] & 0xff;
    bool optional = kinds[i] & OPFORGE_KIND_OPTIONAL, out = kinds[i] & OPFORGE_KIND_OUT;
    const char* type = "Tensor";
    switch (base) {
      case OPFORGE_ARG_TENSOR_LIST: type = out ? "Tensor(a!)[]" : "Tensor[]"; break;
      case OPFORGE_ARG_OPT_TENSOR_LIST: type = "Tensor?[]"; optional = false; break;
      case OPFORGE_KIND_SCALAR: type = "Scalar"; break;
      case OPFORGE_ARG_INT: type = "int"; break;
      case OPFORGE_ARG_DOUBLE: type = "float"; break;
      case OPFORGE_ARG_BOOL: type = "bool"; break;
      case OPFORGE_ARG_INT_LIST: type = "int[]"; break;
      case OPFORGE_ARG_DOUBLE_LIST: type = "float[]"; break;
      case OPFORGE_ARG_BOOL_LIST: type = "bool[]"; break;
      case OPFORGE_ARG_SCALAR_TYPE: type = "ScalarType"; break;
      case OPFORGE_ARG_STRING: type = "str"; break;
      default: type = out ? "Tensor(a!)" : "Tensor"; break;
    }
    if (i) s += ", ";
    if (out && (i == 0 || !(kinds[i - 1] & OPFORGE_KIND_OUT))) s += "*, ";
    s += type;
    if (optional) s += "?";
    s += " a" + std::to_string(i);
  }
  return s + ") -> ()";
}

bool selected(const char* key) {
  size_t count = 0;
  const char* const* keys = selected_keys(&count);
  if (count == 0) return true;
  for (size_t i = 0; i < count; ++i)
    if (std::strcmp(keys[i], key) == 0) return true;
  return false;
}

Table* build() {
  auto* t = new Table;
  size_t nfam = 0;
  const Family* const* fams = all_families(&nfam);
  size_t total = 0;
  for (size_t f = 0; f < nfam; ++f) total += fams[f]->count;
  t->entries.reserve(total);
  t->kinds.reserve(total);
  t->names.reserve(total);
  t->overloads.reserve(total);
  t->schemas.reserve(total);
  for (size_t f = 0; f < nfam; ++f) {
    for (size_t k = 0; k < fams[f]->count; ++k) {
      const KernelDef& def = fams[f]->kernels[k];
      if (!selected(def.key)) continue;
      std::string key = def.key;
      size_t colon = key.find("::");
      size_t dot = key.find('.', colon == std::string::npos ? 0 : colon);
      if (colon == std::string::npos || dot == std::string::npos) {
        t->problem += std::string("malformed key ") + def.key + "; ";
        continue;
      }
      std::vector<int32_t> kinds;
      bool ok = true;
      const char* p = def.kinds;
      while (*p) {
        while (*p == ' ') ++p;
        const char* start = p;
        while (*p && *p != ' ') ++p;
        if (p > start) kinds.push_back(parse_kind(std::string(start, p), &ok));
      }
      if (!ok) {
        t->problem += std::string("malformed kinds for ") + def.key + "; ";
        continue;
      }
      t->names.push_back(key.substr(0, dot));
      t->overloads.push_back(key.substr(dot + 1));
      t->schemas.push_back(schema_of(def.key, kinds));
      t->kinds.push_back(std::move(kinds));
    }
  }
  // pointers into the vectors only once they no longer move
  size_t i = 0;
  for (size_t f = 0; f < nfam; ++f) {
    for (size_t k = 0; k < fams[f]->count; ++k) {
      const KernelDef& def = fams[f]->kernels[k];
      if (!selected(def.key) || i >= t->kinds.size() ||
          t->names[i] + "." + t->overloads[i] != def.key)
        continue;
      opforge_kernel_entry e{};
      e.op = t->names[i].c_str();
      e.overload = t->overloads[i].c_str();
      e.schema = t->schemas[i].c_str();
      e.kernel_name = def.key;
      e.dtype_key = "default";
      e.source = fams[f]->name;
      e.fn = def.fn;
      e.arg_kinds = t->kinds[i].data();
      e.meta_args = nullptr;
      e.num_args = static_cast<int32_t>(t->kinds[i].size());
      e.num_meta = 0;
      t->entries.push_back(e);
      ++i;
    }
  }
  t->library.abi_version = OPFORGE_ABI_VERSION;
  t->library.entry_size = sizeof(opforge_kernel_entry);
  t->library.name = "opforge_portable";
  t->library.built_by = "opforge 0.1.0";
  t->library.num_kernels = static_cast<int64_t>(t->entries.size());
  t->library.kernels = t->entries.data();
  return t;
}

}  // namespace

const opforge_library* portable_library() {
  static Table* table = build();  // thread-safe initialisation (C++11); never freed
  return &table->library;
}

}  // namespace opforge::portable
