// Bytes → Program: the header (magic, version, sizes, the metadata CRC-32), then the
// metadata with a bounds-checked little-endian reader, then the segment table against the
// file, then verify_program. Mirrors opforge/program/decode.py and _reader.py check for
// check; the messages name the same field (methods[i], values[j], header.file_size, ...).
//
// Safety: every read checks the bytes left first; every count is checked against the bytes
// left (each element takes at least a known number of bytes) before anything is allocated
// for it, so decoding never allocates more than a constant times the file's size and never
// loops longer than its length. Nothing outside [data, data + size) is read.
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "program.h"
#include "symbolic.h"
#include "program_text.h"
#include "reader_internal.h"

namespace opforge::rt {
namespace {

using namespace reader_detail;

bool bool_byte(uint8_t b) {
  if (b > 1) fail("bool", "byte " + std::to_string(b), "0 (False) or 1 (True)", kReexport);
  return b == 1;
}

int64_t checked_dtype(int number) {
  if (itemsize_of(number) == 0) {
    fail("dtype", "unknown dtype number " + std::to_string(number), kDtypeList,
         "re-export the program with this opforge version");
  }
  return number;
}

void check_tensor(const TensorDef& t) {
  // TensorValue.__post_init__: sizes >= 0, a permutation, the 2**48-byte cap, int4 of int8
  const size_t rank = t.sizes.size();
  int64_t extent = 1;
  bool over = false;
  for (size_t d = 0; d < rank; ++d) {
    if (t.sizes[d] < 0) {
      fail("`TensorValue`: sizes[" + std::to_string(d) + "]", std::to_string(t.sizes[d]),
           "an int in [0, 9223372036854775807]",
           "pass a Python int in range (in a loaded file: the file is corrupt, re-export it)");
    }
    int64_t s = t.sizes[d] ? t.sizes[d] : 1;
    if (!over && __builtin_mul_overflow(extent, s, &extent)) over = true;
    if (extent > kMaxTensorBytes) over = true;
  }
  bool seen[kMaxRank] = {};
  bool permutation = true;
  for (uint8_t d : t.dim_order) {
    if (d >= rank || seen[d]) permutation = false;
    else seen[d] = true;
  }
  if (!permutation) {
    fail("`TensorValue`: dim_order", "a dim order that is no permutation",
         "a permutation of 0.." + std::to_string(int64_t(rank) - 1) + " (rank " +
             std::to_string(rank) + ")");
  }
  int64_t bytes = 0;
  if (over || __builtin_mul_overflow(extent, itemsize_of(t.dtype), &bytes) ||
      bytes > kMaxTensorBytes) {
    fail("`TensorValue`: sizes", "sizes of more than 2**48 bytes (zero sizes counted as 1)",
         "at most 281474976710656 bytes (2**48), for an empty tensor too");
  }
  if (t.storage == StorageKind::ConstantInt4 && t.dtype != 1) {
    fail("`TensorValue`: storage.packing", "int4 packing of a " + dtype_name(t.dtype) + " tensor",
         "int4 packing of int8 tensors only (values in [-8, 7])",
         "store the tensor unpacked, or as int8");
  }
}

Value read_value(Reader& r) {
  Value v;
  uint8_t tag = r.u8();
  switch (tag) {
    case 8: {  // tensor: dtype, rank, storage kind, index, offset; sizes; dim_order
      const uint8_t* head = r.take(15);
      int dtype = head[0];
      int rank = head[1];
      int kind = head[2];
      uint32_t index = le32(head + 3);
      int64_t offset = static_cast<int64_t>(le64(head + 7));
      if (rank > kMaxRank) fail("tensor rank", std::to_string(rank), "at most 64", kReexport);
      const uint8_t* body = r.take(size_t(rank) * 9);
      r.charge(uint64_t(rank) * 9, "a tensor's sizes");
      TensorDef& t = v.tensor;
      for (int d = 0; d < rank; ++d) t.sizes.push_back(static_cast<int64_t>(le64(body + 8 * d)));
      for (int d = 0; d < rank; ++d) t.dim_order.push_back(body[8 * rank + d]);
      if (kind >= 1 && kind <= 4) {
        t.storage = static_cast<StorageKind>(kind);
        if (offset < 0) {
          fail(std::string("`") + (kind == 1 ? "ArenaStorage" : "ConstantStorage") + "`: offset",
               std::to_string(offset), "an int in [0, 9223372036854775807]",
               "pass a Python int in range (in a loaded file: the file is corrupt, re-export it)");
        }
      } else if (kind == 0 && index == 0 && offset == 0) {
        t.storage = StorageKind::None;
      } else {
        fail("tensor storage", "kind " + std::to_string(kind) + ", index " +
                                   std::to_string(index) + ", offset " + std::to_string(offset),
             "kind 0 (none, index and offset 0), 1 (arena), 2 (constant), 3 (constant, "
             "int4-packed; format version 2), 4 (constant, splat; format version 5)",
             kReexport);
      }
      t.storage_index = index;
      t.storage_offset = offset;
      t.dtype = static_cast<int32_t>(checked_dtype(dtype));
      v.tag = ValueTag::Tensor;
      check_tensor(t);
      return v;
    }
    case 1: v.tag = ValueTag::Int; v.i = r.i64(); return v;
    case 2: v.tag = ValueTag::Double; v.d = r.f64(); return v;
    case 3: v.tag = ValueTag::Bool; v.i = bool_byte(r.u8()); return v;
    case 0: v.tag = ValueTag::None; return v;
    case 4: v.tag = ValueTag::String; v.s = r.string(); return v;
    case 11: v.tag = ValueTag::ScalarType; v.i = checked_dtype(r.u8()); return v;
    case 5: v.tag = ValueTag::IntList; v.ints = r.i64s(); return v;
    case 6: {
      v.tag = ValueTag::DoubleList;
      for (int64_t bits : r.i64s()) {
        double d;
        std::memcpy(&d, &bits, 8);
        v.doubles.push_back(d);
      }
      return v;
    }
    case 7: {
      v.tag = ValueTag::BoolList;
      uint32_t n = r.count(1);
      const uint8_t* at = r.take(n);
      r.charge(uint64_t(n) * 8, "a list of " + std::to_string(n) + " bools");
      v.ints.reserve(n);
      for (uint32_t i = 0; i < n; ++i) v.ints.push_back(bool_byte(at[i]));
      return v;
    }
    case 9: v.tag = ValueTag::TensorList; v.items = r.u32s(); return v;
    case 10: v.tag = ValueTag::OptionalTensorList; v.items = r.u32s(); return v;
    default:
      fail("tag", "tag " + std::to_string(tag), "0..11 (see docs/program-format.md, Values)",
           kReexport);
  }
}

Instruction read_instruction(Reader& r) {
  Instruction ins;
  uint8_t kind = r.u8();
  switch (kind) {
    case 0: case 1:
      ins.kind = kind == 0 ? InstructionKind::KernelCall : InstructionKind::DelegateCall;
      ins.index = r.u32();
      ins.args = r.u32s();
      return ins;
    case 2: {  // read as one 8-byte struct, as decode.py does (same offset when short)
      ins.kind = InstructionKind::Move;
      const uint8_t* pair = r.take(8);
      ins.index = le32(pair);
      ins.dst = le32(pair + 4);
      return ins;
    }
    case 3:
      ins.kind = InstructionKind::Free;
      ins.index = r.u32();
      return ins;
    default:
      fail("kind", "kind " + std::to_string(kind), "0 KernelCall, 1 DelegateCall, 2 Move, 3 Free",
           kReexport);
  }
}

Operator read_operator(Reader& r) {
  Operator op;
  op.name = r.string();
  op.overload = r.string();
  if (!is_operator_name(op.name)) {
    fail("`Operator`: name", quoted(op.name), "'namespace::op' of identifier characters");
  }
  for (char c : op.overload) {
    if (!is_ident_char(c)) {
      fail("`Operator`: overload", quoted(op.overload), "letters, digits and '_' (may be '')");
    }
  }
  return op;
}

// SizeExpr.parse at decode time: the spelling only (an undeclared symbol is the verifier's).
void check_syntax(const std::string& text, const Method& m) {
  std::string unknown;
  parse_size_expr(text, m.symbols, "", &unknown);
}

void read_symbolic(Reader& r, uint32_t version, Method& m) {
  uint32_t n = r.count(20);
  for (uint32_t i = 0; i < n; ++i) {
    Symbol s;
    s.name = r.string();
    const uint8_t* range = r.take(16);
    s.min = static_cast<int64_t>(le64(range));
    s.max = static_cast<int64_t>(le64(range + 8));
    if (!is_identifier(s.name)) fail("`Symbol`: name", quoted(s.name), "an identifier");
    if (s.min < 0) fail("`Symbol`: min", std::to_string(s.min), "an int in [0, 2**63 - 1]");
    if (s.max < 0) fail("`Symbol`: max", std::to_string(s.max), "an int in [0, 2**63 - 1]");
    if (s.min > s.max) {
      fail("`Symbol`", s.name + " in [" + std::to_string(s.min) + ", " + std::to_string(s.max) +
                           "]", "min <= max");
    }
    m.symbols.push_back(std::move(s));
  }
  n = r.count(8);
  for (uint32_t i = 0; i < n; ++i) {
    SymbolicValue sv;
    const uint8_t* head = r.take(8);
    sv.value = le32(head);
    uint32_t exprs = le32(head + 4);
    if (exprs > uint32_t(kMaxRank)) {
      fail("symbolic value", std::to_string(exprs) + " expressions", "at most 64");
    }
    for (uint32_t k = 0; k < exprs; ++k) {
      sv.exprs.push_back(r.string());
      check_syntax(sv.exprs.back(), m);
    }
    m.symbolic_values.push_back(std::move(sv));
  }
  n = r.count(12);
  for (uint32_t i = 0; i < n; ++i) {
    Guard g;
    g.lhs = r.string();
    check_syntax(g.lhs, m);
    g.relation = r.string();
    g.rhs = r.string();
    check_syntax(g.rhs, m);
    if (g.relation != "==" && g.relation != "!=" && g.relation != "<=" && g.relation != "<") {
      fail("`Guard`: relation", quoted(g.relation), "==, !=, <=, <");
    }
    m.guards.push_back(std::move(g));
  }
  n = r.count(8);
  for (uint32_t i = 0; i < n; ++i) {
    StateSlot slot;
    slot.name = r.string();
    slot.value = r.u32();
    size_t chars = utf8_length(slot.name);
    if (chars == 0 || chars > 256) fail("`StateSlot`: name", quoted(slot.name), "a non-empty str");
    m.state.push_back(std::move(slot));
  }
  if (version >= 4) {
    n = r.count(4);
    std::vector<bool> grows(m.symbols.size(), false);
    for (uint32_t k = 0; k < n; ++k) {
      uint32_t i = r.u32();
      if (i >= m.symbols.size() || grows[i]) {
        fail("growing symbol", "index " + std::to_string(i),
             "a symbol index below " + std::to_string(m.symbols.size()) + ", each once");
      }
      grows[i] = true;
      m.growing.push_back(i);
    }
  }
}

Method read_method(Reader& r, uint32_t index, uint32_t version) {
  Method m;
  m.name = in("methods[" + std::to_string(index) + "].name", [&] { return r.string(); });
  const std::string where = "method " + quoted(m.name);
  uint32_t n = in(where + " values", [&] {
    uint32_t count = r.count(1);
    r.charge(uint64_t(count) * sizeof(Value), std::to_string(count) + " values");
    return count;
  });
  m.values.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    m.values.push_back(in(where + " values[" + std::to_string(i) + "]", [&] { return read_value(r); }));
  }
  m.inputs = in(where + " inputs", [&] { return r.u32s(); });
  m.outputs = in(where + " outputs", [&] { return r.u32s(); });
  n = in(where + " operators", [&] {
    uint32_t count = r.count(8);
    r.charge(uint64_t(count) * sizeof(Operator), std::to_string(count) + " operators");
    return count;
  });
  for (uint32_t i = 0; i < n; ++i) {
    m.operators.push_back(in(where + " operators[" + std::to_string(i) + "]",
                             [&] { return read_operator(r); }));
  }
  m.arena_sizes = in(where + " memory_plan", [&] {
    std::vector<int64_t> sizes = r.i64s();
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] < 0 || sizes[i] > kMaxTensorBytes) {
        fail("`MemoryPlan`: arena_sizes[" + std::to_string(i) + "]", std::to_string(sizes[i]),
             "an int in [0, 281474976710656]",
             "pass a Python int in range (in a loaded file: the file is corrupt, re-export it)");
      }
    }
    return sizes;
  });
  n = in(where + " instructions", [&] {
    uint32_t count = r.count(5);
    r.charge(uint64_t(count) * sizeof(Instruction), std::to_string(count) + " instructions");
    return count;
  });
  m.instructions.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    m.instructions.push_back(in(where + " instructions[" + std::to_string(i) + "]",
                                [&] { return read_instruction(r); }));
  }
  if (version >= 3) in(where + " symbolic sizes", [&] { read_symbolic(r, version, m); return 0; });
  in(where, [&] {
    if (m.name.empty()) fail("`Method`: name", "''", "a non-empty str");
    if (m.symbols.size() > size_t(kMaxSymbols)) {
      fail("`Method`: symbols", std::to_string(m.symbols.size()), "at most 64");
    }
    return 0;
  });
  return m;
}

void refuse_newer_packings(const Program& p) {
  for (const Method& m : p.methods) {
    for (size_t i = 0; i < m.values.size(); ++i) {
      const Value& v = m.values[i];
      if (v.tag != ValueTag::Tensor) continue;
      StorageKind k = v.tensor.storage;
      uint32_t since = k == StorageKind::ConstantInt4 ? 2 : k == StorageKind::ConstantSplat ? 5 : 0;
      if (since && p.format_version < since) {
        const char* what = k == StorageKind::ConstantInt4 ? "an int4-packed constant"
                                                          : "a splat constant";
        fail("method " + quoted(m.name) + " values[" + std::to_string(i) + "].storage",
             std::string(what) + " in a version-" + std::to_string(p.format_version) + " file",
             std::string(what + 2) + "s only in format version " + std::to_string(since) +
                 " or later",
             kCorrupt);
      }
    }
  }
}

}  // namespace

Program read_program(const uint8_t* data, size_t size, int64_t memory_limit) {
  try {
    Header h = check_header(data, size);
    Reader r(data + h.metadata_offset, h.metadata_size, h.metadata_offset);
    r.set_budget(memory_limit);
    Program p;
    p.format_version = h.version;
    uint32_t n = in("methods", [&] {
      uint32_t count = r.count(1);
      r.charge(uint64_t(count) * sizeof(Method), std::to_string(count) + " methods");
      return count;
    });
    for (uint32_t i = 0; i < n; ++i) p.methods.push_back(read_method(r, i, h.version));
    n = in("segments", [&] { return r.count(16); });
    for (uint32_t i = 0; i < n; ++i) {
      const std::string at = "segments[" + std::to_string(i) + "]";
      const uint8_t* pair = in(at, [&] { return r.take(16); });
      int64_t offset = static_cast<int64_t>(le64(pair));
      int64_t length = static_cast<int64_t>(le64(pair + 8));
      // start + length <= size, computed without overflow (Python's ints cannot overflow)
      uint64_t room = size - h.data_offset;  // data_offset <= file_size == size
      bool ok = offset >= 0 && offset % int64_t(kAlignment) == 0 && length >= 0 &&
                uint64_t(offset) <= room && uint64_t(length) <= room - uint64_t(offset);
      if (!ok) {
        fail(at, "offset " + std::to_string(offset) + ", size " + std::to_string(length),
             "a non-negative offset that is a multiple of 64 and bytes within the file (" +
                 std::to_string(size) + " bytes)", kReexport);
      }
      Segment s;
      s.offset = offset;
      s.size = length;
      s.data = data + h.data_offset + offset;
      p.segments.push_back(s);
    }
    n = in("delegates", [&] { return r.count(13); });
    for (uint32_t i = 0; i < n; ++i) {
      p.delegates.push_back(in("delegates[" + std::to_string(i) + "]", [&] {
        Delegate d;
        d.id = r.string();
        d.segment = r.u32();
        uint32_t specs = r.count(8);
        for (uint32_t k = 0; k < specs; ++k) {
          std::string key = r.string();
          d.compile_specs.emplace_back(std::move(key), r.raw());
        }
        if (d.id.empty()) fail("`DelegateBlob`: id", "''", "a non-empty backend id");
        return d;
      }));
    }
    n = in("user_metadata", [&] { return r.count(8); });
    for (uint32_t i = 0; i < n; ++i) {
      p.user_metadata.push_back(in("user_metadata[" + std::to_string(i) + "]", [&] {
        std::string key = r.string();
        return std::make_pair(std::move(key), r.string());
      }));
    }
    if (h.version >= 6) {
      n = in("named_data", [&] { return r.count(8); });
      for (uint32_t i = 0; i < n; ++i) {
        p.named_data.push_back(in("named_data[" + std::to_string(i) + "]", [&] {
          NamedData nd;
          nd.key = r.string();
          nd.segment = r.u32();
          size_t chars = utf8_length(nd.key);
          if (chars == 0 || chars > 256 || !is_printable_utf8(nd.key)) {
            fail("`NamedData`: key", quoted(nd.key.substr(0, 80)),
                 "a printable string of 1 to 256 characters");
          }
          return nd;
        }));
      }
    }
    r.expect_end();
    in("program", [&] {
      std::set<std::string> seen;
      for (size_t i = 0; i < p.user_metadata.size(); ++i) {
        if (!seen.insert(p.user_metadata[i].first).second) {
          fail("`Program`: user_metadata[" + std::to_string(i) + "]",
               "duplicate key " + quoted(p.user_metadata[i].first), "unique keys",
               "merge the two entries");
        }
      }
      return 0;
    });
    if (p.format_version < 5) refuse_newer_packings(p);
    verify_program(p, data, size);
    return p;
  } catch (ProgramError& e) {
    // the API that was called, once (a message that already names one keeps it: with_api)
    if (e.message.empty() || e.message[0] != '`') {
      e.message = "`opforge_runtime read_program(<" + std::to_string(size) + " bytes>)`: " +
                  e.message;
    }
    throw;
  }
}

}  // namespace opforge::rt
