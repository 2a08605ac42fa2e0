// Node names of instructions from the debug table (debug_nodes.h).
#include "debug_nodes.h"

#include "debug_table.h"
#include "json.h"

namespace opforge::rt {

std::vector<std::string> instruction_nodes(const Program& program, const Method& method) {
  std::vector<std::string> names(method.instructions.size());
  const std::string* text = nullptr;
  for (const auto& [key, value] : program.user_metadata)
    if (key == kDebugKey) text = &value;
  if (text == nullptr) return names;
  json::Document doc;
  std::string error;
  if (!json::parse(*text, &doc, &error)) return names;  // verified at load: cannot happen
  auto object = [&](int64_t at, json::Kind kind) -> const json::Node* {
    return at >= 0 && doc.at(uint32_t(at)).kind == kind ? &doc.at(uint32_t(at)) : nullptr;
  };
  const json::Node* methods = object(doc.member(doc.at(0), "methods"), json::Kind::Object);
  const json::Node* entry = methods ? object(doc.member(*methods, method.name), json::Kind::Object) : nullptr;
  if (entry == nullptr) return names;
  const json::Node* nodes = object(doc.member(*entry, "nodes"), json::Kind::Array);
  const json::Node* captures = object(doc.member(*entry, "captures"), json::Kind::Array);
  if (nodes == nullptr || captures == nullptr) return names;
  for (uint32_t k = 0; k + 4 <= captures->count; k += 4) {  // instruction, value, node, item
    const json::Node& instruction = doc.at(doc.kid(*captures, k));
    const json::Node& node = doc.at(doc.kid(*captures, k + 2));
    if (instruction.kind != json::Kind::Int || node.kind != json::Kind::Int) continue;
    if (instruction.i < 0 || size_t(instruction.i) >= names.size() || !names[instruction.i].empty()) continue;
    uint64_t at = uint64_t(node.i) * 3;
    if (node.i < 0 || at >= nodes->count) continue;
    const json::Node& name = doc.at(doc.kid(*nodes, uint32_t(at)));
    if (name.kind == json::Kind::String) names[instruction.i] = doc.str(name);
  }
  return names;
}

}  // namespace opforge::rt
