// opforge-generate: prefill + decode a decoder program on token ids, without Python, as
// opforge.runtime.generate does (docs/generation.md):
//
//   describe the decoder (methods, tokens/positions inputs, layout, vocabulary, the KV
//   caches among the state and their capacity) → reset the state → prefill the prompt (in
//   chunks when longer than a call takes) → sample → one decode call per new token until
//   --max-new-tokens, an end token or the cache's capacity
//
//   opforge-generate decoder.opf --tokens 5,9,1,3 --max-new-tokens 8
//   opforge-generate decoder.opf --tokens 5,9,1,3 --temperature 0.8 --top-k 40 --seed 1
//   opforge-generate decoder.opf --tokens 5,9,1,3 --max-new-tokens 64 --repeat 5   # timing
//
// --repeat N generates N times from a fresh state (the same seed each time) and reports the
// median rates: the first generation of a process also pays one-time work (a delegate's
// primitives for each new shape, first touches of the arenas), as a first call does in
// Python. --warmup N runs N generations first that count in no rate.
//
// The methods' arenas are the tool's (opf_method_options.arenas): anonymous mappings, whose
// pages stay the kernel's shared zero page until a call writes them. The runtime's own
// arenas are zeroed when the method is made, which makes every planned byte resident, and a
// dynamic prefill's plan is sized for its longest call (the whole cache: its logits alone
// are capacity x vocabulary floats, 33 MB at 256 x 32000) where a shorter prompt writes
// part of it. --runtime-arenas uses the runtime's instead (to compare).
//
// --json also reports each counted generation's prefill and decode seconds and the
// process's memory from /proc/self/status (Linux; -1 elsewhere): VmHWM (the peak resident
// set), and VmRSS / RssAnon / RssFile after the program is loaded and its methods made, and
// at the end; a benchmark reads the peak of this process alone from them.
//
// Seeded sampling draws from NumPy's PCG64 exactly as opforge.runtime.sampling does
// (tools/sampler.h): the same seed gives Python's tokens. One difference from Python: the
// C API lists the program's states, not each method's, so every floating-point state
// counts as a cache (they are the same for a decoder whose methods share their caches).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <set>
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#define OPF_TOOL_MAPPED_ARENAS 1
#endif
#include <string>
#include <vector>

#include "npy.h"
#include "opforge/runtime.h"
#include "sampler.h"
#include "session.h"

namespace {

using namespace opforge::tools;

constexpr const char* kTool = "opforge-generate";

const char* kUsage =
    "usage: opforge-generate PROGRAM.opf --tokens IDS [--max-new-tokens N]\n"
    "                        [--temperature T] [--top-k K] [--seed S] [--eos-id ID ...]\n"
    "                        [--method NAME] [--decode-method NAME] [--kernels LIB.so ...]\n"
    "                        [--threads N] [--repeat N] [--warmup N] [--runtime-arenas] [--json]\n"
    "\n"
    "  --tokens IDS          the prompt's token ids: 5,9,1,3 (alias --prompt-ids)\n"
    "  --max-new-tokens N    at most N new tokens (default 32)\n"
    "  --temperature T       0 (default): greedy; above 0: sample softmax(logits / T)\n"
    "  --top-k K             sample only among the K largest logits\n"
    "  --seed S              the sampler's seed (NumPy's default_rng(S): Python's tokens)\n"
    "  --eos-id ID           an end token; repeatable\n"
    "  --method NAME         the (prefill) method (default: forward, or prefill + decode)\n"
    "  --decode-method NAME  a separate one-token method\n"
    "  --repeat N            generate N times from a fresh state, report the median rates\n"
    "  --warmup N            generate N times first, counted in no rate (default 0)\n"
    "  --runtime-arenas      the runtime's zeroed arenas, not the tool's lazily mapped ones\n"
    "  --json                print one JSON object\n";

struct Options {
  std::string program, method, decode_method;
  std::vector<int64_t> tokens, eos;
  std::vector<std::string> kernels;
  int64_t max_new_tokens = 32, top_k = 0, seed = -1, threads = 0, repeat = 1, warmup = 0;
  double temperature = 0.0;
  bool json = false, runtime_arenas = false, have_tokens = false, top_k_given = false, seed_given = false;
};

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::string item;
  for (size_t i = 0; i <= text.size(); ++i) {
    char c = i < text.size() ? text[i] : ',';
    if (c == ',' || c == ' ') {
      if (!item.empty()) ids.push_back(parse_int(kTool, "--tokens", item));
      item.clear();
    } else item += c;
  }
  return ids;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(kTool, arg + " needs a value\n" + kUsage, kExitUsage);
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (arg == "--tokens" || arg == "--prompt-ids") o.tokens = parse_ids(value()), o.have_tokens = true;
    else if (arg == "--max-new-tokens") o.max_new_tokens = parse_int(kTool, arg, value());
    else if (arg == "--temperature") o.temperature = parse_double(kTool, arg, value());
    else if (arg == "--top-k") o.top_k = parse_int(kTool, arg, value()), o.top_k_given = true;
    else if (arg == "--seed") o.seed = parse_int(kTool, arg, value()), o.seed_given = true;
    else if (arg == "--eos-id") o.eos.push_back(parse_int(kTool, arg, value()));
    else if (arg == "--method") o.method = value();
    else if (arg == "--decode-method") o.decode_method = value();
    else if (arg == "--kernels") o.kernels.push_back(value());
    else if (arg == "--threads") o.threads = parse_int(kTool, arg, value());
    else if (arg == "--repeat") o.repeat = parse_int(kTool, arg, value());
    else if (arg == "--warmup") o.warmup = parse_int(kTool, arg, value());
    else if (arg == "--json") o.json = true;
    else if (arg == "--runtime-arenas") o.runtime_arenas = true;
    else if (arg == "--top-p")
      fail(kTool, "--top-p — opforge.runtime.sampling has no top-p (temperature and top-k only), "
                  "and this tool gives Python's tokens — valid: --temperature T --top-k K — fix: "
                  "leave --top-p out", kExitUsage);
    else if (!arg.empty() && arg[0] == '-') fail(kTool, "unknown option " + arg + "\n" + kUsage, kExitUsage);
    else if (o.program.empty()) o.program = arg;
    else fail(kTool, "a second PROGRAM '" + arg + "'\n" + kUsage, kExitUsage);
  }
  if (o.program.empty()) fail(kTool, std::string("no PROGRAM\n") + kUsage, kExitUsage);
  if (!o.have_tokens) fail(kTool, "pass the prompt as --tokens 5,9,1,3", kExitUsage);
  if (o.repeat < 1) fail(kTool, "--repeat — found " + std::to_string(o.repeat) + " — valid: >= 1", kExitUsage);
  if (o.warmup < 0 || o.warmup > 1000)
    fail(kTool, "--warmup — found " + std::to_string(o.warmup) + " — valid: 0..1000 generations", kExitUsage);
  if (o.max_new_tokens < 0) fail(kTool, "--max-new-tokens — found a negative count — valid: >= 0", kExitUsage);
  if (!(o.temperature >= 0.0) || std::isinf(o.temperature))
    fail(kTool, "--temperature — valid: 0 (greedy) or a finite positive number — fix: e.g. 0.8", kExitUsage);
  if (o.top_k_given && o.top_k < 1) fail(kTool, "--top-k — valid: an integer >= 1 — fix: e.g. 40", kExitUsage);
  if (o.seed_given && o.seed < 0)
    fail(kTool, "--seed — valid: an integer >= 0 (NumPy's generators take no negative seed)", kExitUsage);
  return o;
}

// One method as the generator calls it (decoder_signature.MethodCall).
struct MethodCall {
  std::string name, layout;
  int order[2] = {0, 1};  // input positions of (tokens, positions)
  int32_t token_dtype = 4, position_dtype = 4, position_rank = 1;
  int64_t seq_min = 1, seq_max = 1, vocab = 0;
};

bool is_int_dtype(int32_t d) { return d == 4 || d == 3 || d == 2 || d == 0 || d == 1; }
bool is_float_dtype(int32_t d) { return d == 6 || d == 5 || d == 15 || d == 7; }

MethodCall describe_method(const Session& session, const std::string& name) {
  const std::string api = "method '" + name + "'";
  const std::string expected = "valid: (tokens[int64, seq], positions[int64, seq]) -> logits[seq, vocab] or "
                               "(input_ids[int64, 1, seq], cache_position[int64, seq]) -> logits[1, seq, vocab]";
  std::vector<opf_io_info> in = session.io(name, true), out = session.io(name, false);
  std::string found;
  for (const opf_io_info& info : in) found += (found.empty() ? "" : ", ") + describe_io(info);
  bool ints = in.size() == 2;
  for (const opf_io_info& info : in) ints = ints && info.kind == OPF_VALUE_TENSOR && is_int_dtype(info.dtype) && info.rank > 0;
  if (!ints) fail(kTool, api + ": inputs — found (" + found + ") — " + expected);
  MethodCall call;
  call.name = name;
  const char* names = opf_program_metadata(session.program(), ("opforge.input_names." + name).c_str());
  if (names != nullptr) {  // the input names export records: tokens and positions by name
    std::string text = names;
    size_t comma = text.find(',');
    if (comma != std::string::npos && text.find(',', comma + 1) == std::string::npos) {
      static const std::set<std::string> tokens = {"tokens", "input_ids", "token_ids", "ids", "input"};
      static const std::set<std::string> positions = {"positions", "cache_position", "position_ids",
                                                      "input_pos", "pos", "position"};
      std::string n[2] = {text.substr(0, comma), text.substr(comma + 1)};
      int t = -1, p = -1, nt = 0, np_ = 0;
      for (int k = 0; k < 2; ++k) {
        if (tokens.count(n[k])) t = k, ++nt;
        if (positions.count(n[k])) p = k, ++np_;
      }
      if (nt == 1 && np_ == 1 && t != p) call.order[0] = t, call.order[1] = p;
    }
  }
  const opf_io_info& tokens = in[(size_t)call.order[0]];
  const opf_io_info& positions = in[(size_t)call.order[1]];
  call.layout = tokens.rank == 1 ? "flat" : (tokens.rank == 2 && tokens.sizes[0] == 1) ? "batched" : "";
  bool position_ok = positions.rank == 1 ||
                     (call.layout == "batched" && positions.rank == 2 && positions.sizes[0] == 1);
  if (call.layout.empty() || !position_ok)
    fail(kTool, api + ": inputs — found (" + found + ") — " + expected + " — fix: export with a batch of one");
  if (out.empty() || out[0].kind != OPF_VALUE_TENSOR || out[0].rank < 1 || !is_float_dtype(out[0].dtype))
    fail(kTool, api + ": outputs — the first is not floating-point logits [..., vocab] — fix: return the "
                      "logits as the method's first output");
  call.token_dtype = tokens.dtype;
  call.position_dtype = positions.dtype;
  call.position_rank = positions.rank;
  int seq_dim = tokens.rank - 1;
  call.seq_min = tokens.min_sizes ? tokens.min_sizes[seq_dim] : tokens.sizes[seq_dim];
  call.seq_max = tokens.max_sizes ? tokens.max_sizes[seq_dim] : tokens.sizes[seq_dim];
  call.vocab = out[0].sizes[out[0].rank - 1];
  return call;
}

// The KV caches' capacity in positions, as decoder_signature._caches finds it.
int64_t capacity_of(const Session& session, const MethodCall& prefill, const MethodCall& decode,
                    std::string* source) {
  opf_program* program = session.program();
  int64_t states = opf_program_num_states(program);
  if (states == 0)
    fail(kTool, "method '" + prefill.name + "' — has no state — valid: a decoder whose KV cache is program "
                "state — fix: export it as opforge.examples.decoder does");
  int64_t per_call = std::max(prefill.seq_max, decode.seq_max), capacity = -1;
  for (int64_t s = 0; s < states; ++s) {
    const char* name = opf_program_state_name(program, s);
    int32_t dtype = 0, rank = 0;
    const int64_t* sizes = nullptr;
    int64_t nbytes = 0;
    check(kTool, opf_program_state_info(program, name, &dtype, &rank, &sizes, &nbytes), "reading the state");
    if (!is_float_dtype(dtype)) continue;  // counters and positions are state too, not caches
    int usual = prefill.layout == "flat" ? 0 : rank - 2;
    int dim = -1, candidates = 0, only = -1;
    for (int d = 0; d < rank; ++d)
      if (sizes[d] >= per_call) ++candidates, only = d;
    if (rank >= 2 && sizes[usual] >= per_call) dim = usual;
    else if (candidates == 1) dim = only;
    if (dim >= 0 && (capacity < 0 || sizes[dim] < capacity)) {
      capacity = sizes[dim];
      *source = "state '" + std::string(name) + "' dim " + std::to_string(dim);
    }
  }
  if (capacity < 0) {
    capacity = per_call;
    *source = "the sequence bound of method '" + prefill.name + "'";
  }
  return capacity;
}

void store_int(int32_t dtype, unsigned char* p, int64_t v) {
  switch (dtype) {
    case 4: std::memcpy(p, &v, 8); break;
    case 3: { int32_t x = (int32_t)v; std::memcpy(p, &x, 4); break; }
    case 2: { int16_t x = (int16_t)v; std::memcpy(p, &x, 2); break; }
    default: *p = (unsigned char)v; break;  // int8, uint8
  }
}

// Run `call` on tokens[start, start + n) at positions start.. ; the last row of its logits.
std::vector<double> run_call(opf_method* method, const MethodCall& call, const std::vector<int64_t>& ids,
                             int64_t start, int64_t n) {
  int64_t tsize = npy_itemsize(call.token_dtype), psize = npy_itemsize(call.position_dtype);
  std::vector<unsigned char> tokens((size_t)(n * tsize)), positions((size_t)(n * psize));
  for (int64_t i = 0; i < n; ++i) {
    store_int(call.token_dtype, tokens.data() + i * tsize, ids[(size_t)(start + i)]);
    store_int(call.position_dtype, positions.data() + i * psize, start + i);
  }
  bool batched = call.layout == "batched";
  int64_t token_sizes[2] = {batched ? 1 : n, n};
  int64_t position_sizes[2] = {call.position_rank == 2 ? 1 : n, n};
  check(kTool, opf_method_set_input(method, call.order[0], tokens.data(), call.token_dtype, batched ? 2 : 1,
                                    token_sizes, 0), "setting the tokens of '" + call.name + "'");
  check(kTool, opf_method_set_input(method, call.order[1], positions.data(), call.position_dtype,
                                    call.position_rank, position_sizes, 0),
        "setting the positions of '" + call.name + "'");
  check(kTool, opf_method_execute(method), "executing '" + call.name + "'");
  opf_tensor_view view;
  check(kTool, opf_method_output(method, 0, &view), "reading the logits of '" + call.name + "'");
  int64_t itemsize = npy_itemsize(view.dtype) ? npy_itemsize(view.dtype) : 2;  // bfloat16: 2
  int64_t numel = view.nbytes / itemsize;
  if (numel < call.vocab || numel % call.vocab != 0)
    fail(kTool, "method '" + call.name + "' logits — found " + std::to_string(numel) + " values — valid: "
                "rows of the vocabulary, " + std::to_string(call.vocab) + " — fix: check the program");
  std::vector<double> row((size_t)call.vocab);
  for (int64_t i = 0; i < call.vocab; ++i) row[(size_t)i] = element_as_double(view.dtype, view.data, numel - call.vocab + i);
  return row;
}

// One method's arenas as anonymous mappings (the file's comment): zero pages until written.
// Without mmap (or with --runtime-arenas) empty: the runtime allocates its own.
class MappedArenas {
 public:
  MappedArenas(opf_program* program, const std::string& method, bool wanted) {
#ifdef OPF_TOOL_MAPPED_ARENAS
    if (!wanted) return;
    int64_t count = 0;
    check(kTool, opf_program_arena_sizes(program, method.c_str(), nullptr, 0, &count), "sizing '" + method + "'");
    sizes_.assign((size_t)std::max<int64_t>(count, 0), 0);
    if (count > 0)
      check(kTool, opf_program_arena_sizes(program, method.c_str(), sizes_.data(), count, &count),
            "sizing '" + method + "'");
    for (int64_t size : sizes_) {
      // sizes come from the program file: the runtime bounds them by its memory limit when the
      // method is made; here only a size mmap can take (a refused mapping is reported)
      if (size < 0 || (uint64_t)size > (uint64_t)SIZE_MAX / 2)
        fail(kTool, "method '" + method + "' arena — found " + std::to_string(size) +
                        " bytes — valid: a size this process can map — fix: check the program file");
      void* pages = size == 0 ? nullptr
                              : mmap(nullptr, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (pages == MAP_FAILED)
        fail(kTool, "method '" + method + "' arena — " + std::to_string(size) + " bytes could not be mapped (" +
                        std::strerror(errno) + ") — valid: memory this process can map — fix: free memory, or "
                        "pass --runtime-arenas");
      pages_.push_back(pages);
    }
#else
    (void)program, (void)method, (void)wanted;
#endif
  }
  ~MappedArenas() {
#ifdef OPF_TOOL_MAPPED_ARENAS
    for (size_t k = 0; k < pages_.size(); ++k)
      if (pages_[k] != nullptr) munmap(pages_[k], (size_t)sizes_[k]);
#endif
  }
  MappedArenas(const MappedArenas&) = delete;
  MappedArenas& operator=(const MappedArenas&) = delete;
  // the options that make a method on these arenas (the runtime's own when there are none)
  opf_method_options options(int32_t threads) const {
    bool mine = !pages_.empty();
    return {sizeof(opf_method_options), threads, mine ? (int64_t)pages_.size() : 0, mine ? pages_.data() : nullptr,
            mine ? sizes_.data() : nullptr};
  }

 private:
  std::vector<void*> pages_;
  std::vector<int64_t> sizes_;
};

// The process's memory fields from /proc/self/status, in kB (-1 where there is no such file).
struct Memory {
  long long hwm = -1, rss = -1, anon = -1, file = -1;
};

Memory memory_now() {
  Memory m;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return m;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    long long kb = -1;
    if (std::sscanf(line, "VmHWM: %lld", &kb) == 1) m.hwm = kb;
    else if (std::sscanf(line, "VmRSS: %lld", &kb) == 1) m.rss = kb;
    else if (std::sscanf(line, "RssAnon: %lld", &kb) == 1) m.anon = kb;
    else if (std::sscanf(line, "RssFile: %lld", &kb) == 1) m.file = kb;
  }
  std::fclose(f);
  return m;
}

std::string memory_json(const Memory& m) {
  char text[160];
  std::snprintf(text, sizeof text, "{\"vm_hwm_kb\": %lld, \"vm_rss_kb\": %lld, \"rss_anon_kb\": %lld, "
                "\"rss_file_kb\": %lld}", m.hwm, m.rss, m.anon, m.file);
  return text;
}

std::string seconds_json(const std::vector<double>& v) {
  std::string text;
  char item[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(item, sizeof item, "%s%.6g", i ? ", " : "", v[i]);
    text += item;
  }
  return "[" + text + "]";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string ids_text(const std::vector<int64_t>& ids, const char* separator) {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) text += (i ? separator : "") + std::to_string(ids[i]);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  Session session(kTool, o.program, o.kernels);
  std::vector<std::string> names = session.method_names();
  for (const std::string& given : {o.method, o.decode_method})
    if (!given.empty() && !session.has_method(given))
      fail(kTool, "method '" + given + "' — not in the program — fix: --method NAME");
  std::string prefill_name = o.method, decode_name = o.decode_method;
  if (prefill_name.empty()) {
    if (session.has_method("forward")) prefill_name = "forward";
    else if (session.has_method("prefill") && session.has_method("decode")) {
      prefill_name = "prefill";
      if (decode_name.empty()) decode_name = "decode";
    } else if (names.size() == 1) prefill_name = names[0];
    else fail(kTool, "no 'forward' method and no 'prefill'/'decode' pair — fix: --method NAME");
  }
  if (decode_name.empty()) decode_name = prefill_name;
  MethodCall prefill = describe_method(session, prefill_name);
  MethodCall decode = decode_name == prefill_name ? prefill : describe_method(session, decode_name);
  if (!(decode.seq_min <= 1 && 1 <= decode.seq_max))
    fail(kTool, "method '" + decode_name + "' — takes " + std::to_string(decode.seq_min) + ".." +
                    std::to_string(decode.seq_max) + " tokens per call — valid: a decode method taking one "
                    "token — fix: export it with a dynamic sequence or add a 'decode' method");
  if (prefill.vocab != decode.vocab) fail(kTool, "the prefill and decode methods' vocabularies differ");
  int64_t vocab = prefill.vocab;
  std::string capacity_source;
  int64_t capacity = capacity_of(session, prefill, decode, &capacity_source);

  for (const std::vector<int64_t>* ids : {&o.tokens, &o.eos})
    for (int64_t id : *ids)
      if (id < 0 || id >= vocab)
        fail(kTool, std::string(ids == &o.tokens ? "--tokens" : "--eos-id") + " — found " + std::to_string(id) +
                        " — valid: token ids in [0, " + std::to_string(vocab) + ") — fix: check the ids");
  if (o.tokens.empty()) fail(kTool, "--tokens — found no tokens — valid: at least one token id");
  int64_t n_prompt = (int64_t)o.tokens.size();
  if (n_prompt > capacity)
    fail(kTool, "prompt — " + std::to_string(n_prompt) + " tokens — valid: at most the cache's capacity, " +
                    std::to_string(capacity) + " positions (" + capacity_source + ") — fix: shorten the prompt");
  int64_t fits = capacity - n_prompt + 1, wanted = std::min(o.max_new_tokens, fits);
  std::set<int64_t> eos(o.eos.begin(), o.eos.end());

  // (declared before the methods: they outlive them)
  MappedArenas prefill_arenas(session.program(), prefill_name, !o.runtime_arenas);
  MappedArenas decode_arenas(session.program(), decode_name, !o.runtime_arenas && decode_name != prefill_name);
  opf_method* prefill_method = nullptr;
  opf_method* decode_method = nullptr;
  opf_method_options options = prefill_arenas.options((int32_t)o.threads);
  check(kTool, opf_method_new(session.program(), prefill_name.c_str(), &options, &prefill_method), "making '" + prefill_name + "'");
  options = decode_arenas.options((int32_t)o.threads);
  if (decode_name != prefill_name)
    check(kTool, opf_method_new(session.program(), decode_name.c_str(), &options, &decode_method), "making '" + decode_name + "'");
  else decode_method = prefill_method;
  const Memory loaded = memory_now();
  uint64_t seed = !o.seed_given ? (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count()
                                 : (uint64_t)o.seed;
  using clock = std::chrono::steady_clock;
  std::vector<int64_t> out;
  std::vector<double> prefill_times, decode_times, decode_cpu_times;
  auto cpu_now = [] {  // the process's CPU time: steadier than wall time on a busy machine
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
  };
  double generating = 0.0;  // every generation's seconds: the rest of the process is start-up
  int64_t steps = 0;
  for (int64_t r = -o.warmup; r < o.repeat; ++r) {  // each from a fresh state, with the same seed
    if (r == 0) {  // the warm-up generations' times are not counted
      prefill_times.clear(), decode_times.clear(), decode_cpu_times.clear();
    }
    check(kTool, opf_program_state_reset(session.program(), nullptr), "resetting the state");
    Sampler sampler(o.temperature, o.top_k, seed);
    auto choose = [&](const std::vector<double>& row) {
      int64_t token = sampler.choose(row);
      if (token < 0) fail(kTool, "logits — found non-finite values — valid: finite scores — fix: check the program's "
                                 "outputs with opforge-run");
      return token;
    };
    clock::time_point start = clock::now();
    std::vector<double> row;
    for (int64_t done = 0; done < n_prompt;) {  // chunks of the most tokens a call takes
      int64_t size = std::min(n_prompt - done, prefill.seq_max);
      bool whole = size >= prefill.seq_min;
      row = run_call(whole ? prefill_method : decode_method, whole ? prefill : decode, o.tokens, done, whole ? size : 1);
      done += whole ? size : 1;
    }
    out.clear();
    if (wanted) out.push_back(choose(row));
    prefill_times.push_back(std::chrono::duration<double>(clock::now() - start).count());

    std::vector<int64_t> all = o.tokens;
    if (!out.empty()) all.push_back(out.back());
    steps = 0;
    start = clock::now();
    double cpu_start = cpu_now();
    while (!out.empty() && !eos.count(out.back()) && (int64_t)out.size() < wanted) {
      row = run_call(decode_method, decode, all, (int64_t)all.size() - 1, 1);
      out.push_back(choose(row));
      all.push_back(out.back());
      ++steps;
    }
    decode_times.push_back(std::chrono::duration<double>(clock::now() - start).count());
    decode_cpu_times.push_back(cpu_now() - cpu_start);
    generating += prefill_times.back() + decode_times.back();
  }
  double first_decode_seconds = decode_times[0];
  double prefill_seconds = median(prefill_times), decode_seconds = median(decode_times);

  std::string stop = "length", message = "generated " + std::to_string(out.size()) + " token(s)";
  if (!out.empty() && eos.count(out.back())) {
    stop = "eos", message = "stopped at end token " + std::to_string(out.back());
  } else if (wanted < o.max_new_tokens) {
    stop = "capacity";
    message = "stopped at the cache's capacity: " + std::to_string(capacity) + " positions (" + capacity_source +
              ") hold the " + std::to_string(n_prompt) + "-token prompt and " + std::to_string(fits) +
              " new token(s), fewer than the " + std::to_string(o.max_new_tokens) + " asked for";
  }
  const Memory end = memory_now();
  double prefill_rate = prefill_seconds > 0 ? (double)n_prompt / prefill_seconds : 0.0;
  double decode_rate = decode_seconds > 0 ? (double)steps / decode_seconds : 0.0;
  if (o.json) {
    std::string quoted;
    for (char c : message) quoted += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
    std::printf("{\"prompt_ids\": [%s], \"tokens\": [%s], \"stop_reason\": \"%s\", \"message\": \"%s\", "
                "\"prefill_tokens_per_s\": %.6g, \"decode_tokens_per_s\": %.6g, \"prefill_seconds\": %.6g, "
                "\"decode_seconds\": %.6g, \"decode_steps\": %lld, \"capacity\": %lld, \"repeat\": %lld, "
                "\"first_decode_seconds\": %.6g, \"generation_seconds\": %.6g, \"decode_cpu_seconds\": %.6g, "
                "\"warmup\": %lld, \"prefill_seconds_each\": %s, \"decode_seconds_each\": %s, "
                "\"memory_loaded\": %s, \"memory_end\": %s}\n",
                ids_text(o.tokens, ", ").c_str(), ids_text(out, ", ").c_str(), stop.c_str(), quoted.c_str(),
                prefill_rate, decode_rate, prefill_seconds, decode_seconds, (long long)steps, (long long)capacity,
                (long long)o.repeat, first_decode_seconds, generating, median(decode_cpu_times),
                (long long)o.warmup, seconds_json(prefill_times).c_str(), seconds_json(decode_times).c_str(),
                memory_json(loaded).c_str(), memory_json(end).c_str());
  } else {
    std::printf("%s: method %s, %s layout, vocabulary %lld, cache %lld positions (%s)\n", o.program.c_str(),
                decode_name == prefill_name ? prefill_name.c_str() : (prefill_name + " + " + decode_name).c_str(),
                prefill.layout.c_str(), (long long)vocab, (long long)capacity, capacity_source.c_str());
    std::printf("prompt (%lld tokens): %s\n", (long long)n_prompt, ids_text(o.tokens, " ").c_str());
    std::printf("generated (%zu tokens): %s\n", out.size(), ids_text(out, " ").c_str());
    std::printf("%s\n", message.c_str());
    std::printf("prefill: %lld tokens in %.1f ms (%.1f tokens/s); decode: %lld tokens in %.1f ms (%.1f tokens/s)\n",
                (long long)n_prompt, prefill_seconds * 1e3, prefill_rate, (long long)steps, decode_seconds * 1e3,
                decode_rate);
    if (o.repeat > 1)
      std::printf("(medians of %lld generations; the first decoded at %.1f tokens/s)\n", (long long)o.repeat,
                  first_decode_seconds > 0 ? (double)steps / first_decode_seconds : 0.0);
  }
  if (decode_method != prefill_method) opf_method_free(decode_method);
  opf_method_free(prefill_method);
  return 0;
}
