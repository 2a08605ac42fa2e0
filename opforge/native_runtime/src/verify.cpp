// The program verifier: every cross-reference of a decoded Program checked before anything
// uses it. Mirrors opforge/program/verify.py rule for rule (see its docstring for the list);
// the symbolic part is verify_symbolic.cpp, the debug table debug_table.cpp.
#include <algorithm>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "debug_table.h"
#include "program.h"
#include "program_text.h"
#include "verify_internal.h"

namespace opforge::rt {
namespace {

const char* const kDangling = "the exporter wrote a dangling reference: re-export the model";
constexpr int64_t kArenaAlignment = 64;
constexpr int64_t kMaxArenaAlignment = 4096;
constexpr int64_t kArenaAllowance = 4096;

[[noreturn]] void fail(const std::string& subject, const std::string& found,
                       const std::string& valid, const std::string& fix = "") {
  throw ProgramError{program_message(subject, found, valid, fix)};
}

void check_index(const std::string& subject, uint64_t index, uint64_t count, const char* what) {
  if (index >= count) {
    std::string valid = count ? "0.." + std::to_string(count - 1) + " (" + std::to_string(count) +
                                    " " + what + "s)"
                              : std::string("none (there are no ") + what + "s)";
    fail(subject, std::string(what) + " index " + std::to_string(index), valid, kDangling);
  }
}

bool is_constant(const Value& v) {
  return v.tag == ValueTag::Tensor && v.tensor.storage >= StorageKind::Constant;
}

void verify_tensor(const Program& p, const std::vector<int64_t>& arenas, const TensorDef& t,
                   const std::string& where, bool allow_unplanned) {
  const int64_t itemsize = itemsize_of(t.dtype);
  const int64_t stored = stored_nbytes(t);
  if (t.storage == StorageKind::None) {
    if (stored && !allow_unplanned) {
      fail(where + ".storage", "None for a tensor of " + std::to_string(stored) + " bytes",
           "ArenaStorage or ConstantStorage (only zero-byte tensors may be unplanned)",
           "run the memory-planning pass, or verify with allow_unplanned=True");
    }
    return;
  }
  std::string region;
  int64_t limit;
  if (t.storage == StorageKind::Arena) {
    check_index(where + ".storage.mem_id", t.storage_index, arenas.size(), "arena");
    region = "arena " + std::to_string(t.storage_index);
    limit = arenas[t.storage_index];
  } else {
    check_index(where + ".storage.segment", t.storage_index, p.segments.size(), "segment");
    region = "segment " + std::to_string(t.storage_index);
    limit = p.segments[t.storage_index].size;
  }
  if (t.storage_offset % itemsize) {
    fail(where + ".storage.offset", std::to_string(t.storage_offset) + " in " + region,
         "a multiple of the " + dtype_name(t.dtype) + " itemsize " + std::to_string(itemsize),
         "align placements (the memory planner uses 64)");
  }
  // offset + stored > limit, without overflow: offset <= INT64_MAX and stored <= 2**48
  if (t.storage_offset > limit || stored > limit - t.storage_offset) {
    fail(where + ".storage", "bytes [" + std::to_string(t.storage_offset) + ", +" +
                                 std::to_string(stored) + ")",
         "within " + region + ", which has " + std::to_string(limit) + " bytes", kDangling);
  }
}

const char* kind_name(const Value& v) {
  switch (v.tag) {
    case ValueTag::None: return "a NoneValue";
    case ValueTag::Int: return "an IntValue";
    case ValueTag::Double: return "a DoubleValue";
    case ValueTag::Bool: return "a BoolValue";
    case ValueTag::String: return "a StringValue";
    case ValueTag::IntList: return "an IntListValue";
    case ValueTag::DoubleList: return "a DoubleListValue";
    case ValueTag::BoolList: return "a BoolListValue";
    case ValueTag::Tensor: return "a TensorValue";
    case ValueTag::TensorList: return "a TensorListValue";
    case ValueTag::OptionalTensorList: return "an OptionalTensorListValue";
    case ValueTag::ScalarType: return "a ScalarTypeValue";
  }
  return "a value";
}

void verify_instructions(const Program& p, const Method& m, const std::vector<bool>& state,
                         const std::string& where) {
  const uint64_t n = m.values.size();
  for (size_t i = 0; i < m.instructions.size(); ++i) {
    const Instruction& ins = m.instructions[i];
    const std::string at = where + " instructions[" + std::to_string(i) + "]";
    const char* kind = "KernelCall";
    switch (ins.kind) {
      case InstructionKind::KernelCall:
        check_index(at + " (KernelCall).op", ins.index, m.operators.size(), "operator");
        break;
      case InstructionKind::DelegateCall:
        kind = "DelegateCall";
        check_index(at + " (DelegateCall).delegate", ins.index, p.delegates.size(), "delegate");
        break;
      case InstructionKind::Move: {
        check_index(at + " (Move).src", ins.index, n, "value");
        check_index(at + " (Move).dst", ins.dst, n, "value");
        if (is_constant(m.values[ins.dst]) && !state[ins.dst]) {
          fail(at + " (Move).dst", "value " + std::to_string(ins.dst) + ", a constant tensor",
               "a writable value", kDangling);
        }
        continue;
      }
      case InstructionKind::Free:
        check_index(at + " (Free).value", ins.index, n, "value");
        if (m.values[ins.index].tag != ValueTag::Tensor) {
          fail(at + " (Free).value",
               "value " + std::to_string(ins.index) + ", " + kind_name(m.values[ins.index]),
               "a TensorValue", kDangling);
        }
        continue;
    }
    for (size_t j = 0; j < ins.args.size(); ++j) {
      check_index(at + " (" + kind + ").args[" + std::to_string(j) + "]", ins.args[j], n, "value");
    }
  }
}

void verify_arena_sizes(const std::vector<int64_t>& arenas, const std::vector<int64_t>& ends,
                        const std::vector<int64_t>& offsets, const std::string& where) {
  for (size_t id = 0; id < arenas.size(); ++id) {
    const int64_t bits = offsets[id];
    const int64_t shared = bits ? (bits & -bits) : kMaxArenaAlignment;
    const int64_t alignment = std::min(std::max(shared, kArenaAlignment), kMaxArenaAlignment);
    const int64_t end = ends[id];  // <= the arena's size <= 2**48: no overflow below
    const int64_t needed = std::max((end + alignment - 1) / alignment * alignment, kArenaAllowance);
    if (arenas[id] > needed) {
      fail(where + " memory_plan.arena_sizes[" + std::to_string(id) + "]",
           std::to_string(arenas[id]) + " bytes, but " +
               (end ? "its tensors end at byte " + std::to_string(end)
                    : std::string("no tensor is placed in it")),
           "at most " + std::to_string(needed) + " bytes (the end of its last tensor rounded up to " +
               std::to_string(alignment) + ", or 4096): an arena is what its tensors need",
           "re-export the model; a plan larger than its tensors was altered or corrupted");
    }
  }
}

void verify_method(const Program& p, const Method& m, const std::string& where) {
  const uint64_t n = m.values.size();
  const std::vector<int64_t>& arenas = m.arena_sizes;
  std::vector<int64_t> ends(arenas.size(), 0), offsets(arenas.size(), 0);
  std::vector<bool> state(n, false);
  for (const StateSlot& s : m.state) {
    if (s.value < n) state[s.value] = true;
  }
  const ParsedSymbolic parsed = parse_symbolic(m, where);
  const std::vector<bool> growing = growing_values(m, parsed);
  for (size_t i = 0; i < n; ++i) {
    const Value& v = m.values[i];
    const std::string at = where + " values[" + std::to_string(i) + "]";
    if (v.tag == ValueTag::Tensor) {
      const TensorDef& t = v.tensor;
      verify_tensor(p, arenas, t, at, growing[i]);
      if (t.storage == StorageKind::ConstantSplat && !state[i]) {
        fail(at + ".storage", "a splat constant that is no state's initial value",
             "splat storage only for a state tensor's initial value (kernels read constants as "
             "dense tensors)", kDangling);
      }
      if (t.storage == StorageKind::Arena) {
        const int64_t end = t.storage_offset + stored_nbytes(t);  // checked inside the arena
        ends[t.storage_index] = std::max(ends[t.storage_index], end);
        offsets[t.storage_index] |= t.storage_offset;
      }
    } else if (v.tag == ValueTag::TensorList || v.tag == ValueTag::OptionalTensorList) {
      for (size_t j = 0; j < v.items.size(); ++j) {
        const uint32_t item = v.items[j];
        if (item == kNoTensor && v.tag == ValueTag::OptionalTensorList) continue;
        const std::string sub = at + ".items[" + std::to_string(j) + "]";
        check_index(sub, item, n, "value");
        if (m.values[item].tag != ValueTag::Tensor) {
          fail(sub, "value " + std::to_string(item) + ", " + kind_name(m.values[item]),
               "the index of a TensorValue", kDangling);
        }
      }
    }
  }
  for (int field = 0; field < 2; ++field) {
    const std::vector<uint32_t>& list = field == 0 ? m.inputs : m.outputs;
    const char* name = field == 0 ? "inputs" : "outputs";
    std::vector<bool> seen(n, false);
    for (size_t j = 0; j < list.size(); ++j) {
      const std::string at = where + " " + name + "[" + std::to_string(j) + "]";
      const uint32_t index = list[j];
      check_index(at, index, n, "value");
      const Value& v = m.values[index];
      if (v.tag != ValueTag::Tensor && v.tag != ValueTag::Int && v.tag != ValueTag::Double &&
          v.tag != ValueTag::Bool) {
        fail(at, "value " + std::to_string(index) + ", " + kind_name(v),
             "a TensorValue, IntValue, DoubleValue or BoolValue", kDangling);
      }
      if (field == 0) {
        if (seen[index]) {
          fail(at, "value " + std::to_string(index) + " a second time", "each input once",
               kDangling);
        }
        if (is_constant(v)) {
          fail(at, "value " + std::to_string(index) + ", a constant tensor",
               "arena or unplanned tensors (inputs are written by the caller)", kDangling);
        }
        seen[index] = true;
      }
    }
  }
  std::unordered_map<std::string, size_t> keys;
  for (size_t j = 0; j < m.operators.size(); ++j) {
    auto [it, fresh] = keys.emplace(m.operators[j].key(), j);
    if (!fresh) {
      fail(where + " operators[" + std::to_string(j) + "]",
           quoted(m.operators[j].key()) + ", already operators[" + std::to_string(it->second) + "]",
           "each operator once per table", kDangling);
    }
  }
  verify_instructions(p, m, state, where);
  verify_arena_sizes(arenas, ends, offsets, where);
  if (!m.symbols.empty() || !m.symbolic_values.empty() || !m.guards.empty() || !m.state.empty()) {
    verify_symbolic(m, parsed, where);
  }
}

}  // namespace

int64_t stored_nbytes(const TensorDef& t) {
  // numel * itemsize <= 2**48 (checked by the reader), so nothing here overflows
  int64_t numel = 1;
  for (int64_t s : t.sizes) numel *= s;
  if (t.storage == StorageKind::ConstantSplat) return itemsize_of(t.dtype);
  if (t.storage == StorageKind::ConstantInt4) return (numel + 1) / 2;
  return numel * itemsize_of(t.dtype);
}

void verify_program(const Program& p, const uint8_t* data, size_t size) {
  (void)data;
  (void)size;
  for (size_t i = 0; i < p.delegates.size(); ++i) {
    check_index("delegates[" + std::to_string(i) + "] (" + quoted(p.delegates[i].id) + ").segment",
                p.delegates[i].segment, p.segments.size(), "segment");
  }
  std::unordered_map<std::string, size_t> keys;
  for (size_t i = 0; i < p.named_data.size(); ++i) {
    const NamedData& nd = p.named_data[i];
    check_index("named_data[" + std::to_string(i) + "] (" + quoted(nd.key) + ").segment",
                nd.segment, p.segments.size(), "segment");
    auto [it, fresh] = keys.emplace(nd.key, i);
    if (!fresh) {
      fail("named_data[" + std::to_string(i) + "].key",
           quoted(nd.key) + ", already the key of named_data[" + std::to_string(it->second) + "]",
           "unique keys", kDangling);
    }
  }
  std::unordered_map<std::string, size_t> names;
  for (size_t i = 0; i < p.methods.size(); ++i) {
    const Method& m = p.methods[i];
    auto [it, fresh] = names.emplace(m.name, i);
    if (!fresh) {
      fail("methods[" + std::to_string(i) + "].name",
           quoted(m.name) + ", already the name of methods[" + std::to_string(it->second) + "]",
           "unique method names", "rename one method");
    }
    verify_method(p, m, "method " + quoted(m.name));
  }
  verify_shared_state(p);
  for (const auto& [key, text] : p.user_metadata) {
    if (key == kDebugKey) check_debug_table(p, text);
  }
}

}  // namespace opforge::rt
