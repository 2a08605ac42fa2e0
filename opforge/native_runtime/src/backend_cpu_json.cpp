// The cpu plan's JSON values (backend_cpu_json.h) over the runtime's reader (json.h).
#include "backend_cpu_json.h"

#include <cstring>

#include "json.h"

namespace opforge::rt::cpu {

bool Json::parse(const char* text, size_t size, std::string* error) {
  json::Document doc;
  if (!json::parse(std::string(text, size), &doc, error)) return false;
  values_.assign(doc.nodes.size(), JValue{});
  for (size_t k = 0; k < doc.nodes.size(); ++k) {
    const json::Node& n = doc.nodes[k];
    JValue& v = values_[k];
    v.first = n.first;
    v.count = n.count;
    switch (n.kind) {
      case json::Kind::Null: v.type = JType::Null; break;
      case json::Kind::False: v.type = JType::Bool; break;
      case json::Kind::True: v.type = JType::Bool; v.b = true; break;
      case json::Kind::Int: v.type = JType::Int; v.i = n.i; break;
      case json::Kind::BigInt: v.type = JType::Int; v.big = true; break;
      case json::Kind::Float: v.type = JType::Float; v.d = n.d; break;
      case json::Kind::String: v.type = JType::String; v.count = n.length; break;
      case json::Kind::Array: v.type = JType::Array; break;
      case json::Kind::Object: v.type = JType::Object; break;
    }
  }
  kids_ = std::move(doc.kids);
  pool_ = std::move(doc.text);
  return true;
}

const JValue* Json::member(const JValue& object, const char* key) const {
  if (object.type != JType::Object) return nullptr;
  const JValue* found = nullptr;
  size_t n = std::strlen(key);
  for (uint32_t k = 0; k < object.count; ++k) {
    const JValue& name = values_[kids_[object.first + 2 * k]];
    if (name.count == n && pool_.compare(name.first, n, key) == 0) found = &values_[kids_[object.first + 2 * k + 1]];
  }
  return found;
}

}  // namespace opforge::rt::cpu
