// opforge-run: run one method of an opforge program on .npy inputs, without Python
// (ExecuTorch's executor_runner for opforge). A thin main over the C API:
//
//   load (verify, resolve kernels) → inputs (--input files, or one call per line of
//   --inputs-list, state carried across the calls) → execute each call --repeat times →
//   outputs as .npy, a summary, latency, per-instruction profile, Chrome trace
//
//   opforge-run model.opf --input x.npy --output-dir out --profile --trace trace.json
//
// Exit status: 0 done, 1 the runtime refused something (its message is printed), 2 a
// wrong command line.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "npy.h"
#include "opforge/runtime.h"
#include "session.h"

namespace {

using namespace opforge::tools;

constexpr const char* kTool = "opforge-run";

const char* kUsage =
    "usage: opforge-run PROGRAM.opf [--method NAME] [--input a.npy ...]\n"
    "                   [--inputs-list FILE] [--output-dir DIR] [--kernels LIB.so ...]\n"
    "                   [--profile] [--trace trace.json] [--repeat N]\n"
    "\n"
    "  --method NAME       the method to run (default: forward, or the only method)\n"
    "  --input a.npy       an input, repeat in input order (a 0-d array for a scalar input)\n"
    "  --inputs-list FILE  one call per line: its inputs' .npy paths, space-separated; the\n"
    "                      program's state (a KV cache) is carried from call to call\n"
    "  --output-dir DIR    write output_J.npy (inference_I/output_J.npy with a list)\n"
    "  --kernels LIB.so    a native kernel library (the kernel ABI); repeatable\n"
    "  --profile           time every instruction; print a table per instruction label\n"
    "  --trace FILE        write a Chrome/Perfetto trace (JSON) of every instruction\n"
    "  --repeat N          execute each call N times (latency over all of them)\n";

struct Options {
  std::string program, method, inputs_list, output_dir, trace;
  std::vector<std::string> inputs, kernels;
  bool profile = false;
  int64_t repeat = 1;
};

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
    } else if (arg == "--method") o.method = value();
    else if (arg == "--input") o.inputs.push_back(value());
    else if (arg == "--inputs-list" || arg == "--input-list") o.inputs_list = value();
    else if (arg == "--output-dir") o.output_dir = value();
    else if (arg == "--kernels") o.kernels.push_back(value());
    else if (arg == "--trace") o.trace = value();
    else if (arg == "--profile") o.profile = true;
    else if (arg == "--repeat") {
      o.repeat = parse_int(kTool, "--repeat", value());
      if (o.repeat < 1) fail(kTool, "--repeat — found " + std::to_string(o.repeat) +
                                        " — valid: 1 or more", kExitUsage);
    } else if (!arg.empty() && arg[0] == '-') {
      fail(kTool, "unknown option " + arg + "\n" + kUsage, kExitUsage);
    } else if (o.program.empty()) o.program = arg;
    else fail(kTool, "a second PROGRAM '" + arg + "'\n" + kUsage, kExitUsage);
  }
  if (o.program.empty()) fail(kTool, std::string("no PROGRAM\n") + kUsage, kExitUsage);
  if (!o.inputs.empty() && !o.inputs_list.empty())
    fail(kTool, "pass either --input (repeatable) or --inputs-list, not both", kExitUsage);
  return o;
}

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// One call per non-empty line ('#' starts a comment); a relative path is tried from the
// current directory first, then from the list file's folder (as `opforge run`).
std::vector<std::vector<std::string>> read_inputs_list(const std::string& path) {
  std::ifstream file(path);
  if (!file) fail(kTool, "--inputs-list '" + path + "' — cannot open it — fix: check the path");
  std::string base = path.find('/') == std::string::npos ? "" : path.substr(0, path.rfind('/') + 1);
  std::vector<std::vector<std::string>> calls;
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    line = line.substr(0, line.find('#'));
    std::vector<std::string> paths;
    size_t start = 0;
    while (start < line.size()) {
      size_t begin = line.find_first_not_of(" \t\r", start);
      if (begin == std::string::npos) break;
      size_t end = line.find_first_of(" \t\r", begin);
      std::string item = line.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
      if (!exists(item) && !base.empty() && item[0] != '/' && exists(base + item)) item = base + item;
      if (!exists(item))
        fail(kTool, "--inputs-list " + path + ": line " + std::to_string(number) + " — input '" +
                        item + "' does not exist — valid: .npy paths, relative to the current "
                        "directory or the list file — fix: correct the path");
      paths.push_back(item);
      start = end == std::string::npos ? line.size() : end;
    }
    if (!paths.empty()) calls.push_back(paths);
  }
  if (calls.empty())
    fail(kTool, "--inputs-list " + path + ": the file lists no calls — valid: one line of .npy "
                    "paths per call");
  return calls;
}

void make_dirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      std::string prefix = path.substr(0, i);
      if (mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST)
        fail(kTool, "--output-dir — cannot make '" + prefix + "' (" + std::strerror(errno) + ")");
    }
  }
}

// Bytes of a row-major (C order) array laid out in `order` (outermost first), or back
// when `to_order` is false: the runtime's tensors are dense in their dim order
// (channels-last is {0, 2, 3, 1}), .npy files are C order.
std::vector<unsigned char> relayout(const std::vector<unsigned char>& src, const std::vector<int64_t>& shape,
                                    int64_t item, const uint8_t* order, bool to_order) {
  size_t rank = shape.size();
  bool identity = true;
  for (size_t k = 0; k < rank; ++k) identity = identity && order[k] == k;
  if (identity || src.empty()) return src;
  std::vector<int64_t> c_stride(rank, item), idx(rank, 0);
  for (size_t d = rank - 1; d > 0; --d) c_stride[d - 1] = c_stride[d] * shape[d];
  std::vector<unsigned char> dst(src.size());
  for (size_t n = 0; n < src.size(); n += (size_t)item) {  // n walks the dim-order layout
    int64_t c = 0;
    for (size_t k = 0; k < rank; ++k) c += idx[order[k]] * c_stride[order[k]];
    if (to_order) std::memcpy(&dst[n], &src[(size_t)c], (size_t)item);
    else std::memcpy(&dst[(size_t)c], &src[n], (size_t)item);
    for (size_t k = rank; k-- > 0;) {  // next index, innermost of the dim order first
      if (++idx[order[k]] < shape[order[k]]) break;
      idx[order[k]] = 0;
    }
  }
  return dst;
}

// Set input `index` of the method from an .npy array: a tensor as it is, a scalar input
// from a one-element array.
void set_input(opf_method* method, int64_t index, const opf_io_info& info, const NpyArray& a,
               const std::string& path) {
  std::string where = "input " + std::to_string(index) + " ('" + path + "')";
  if (info.kind == OPF_VALUE_TENSOR) {
    std::vector<unsigned char> bytes = a.shape.size() == (size_t)info.rank && info.dim_order
        ? relayout(a.data, a.shape, npy_itemsize(a.dtype), info.dim_order, true) : a.data;
    check(kTool, opf_method_set_input(method, index, bytes.data(), a.dtype, (int32_t)a.shape.size(),
                                      a.shape.data(), 0), "setting " + where);
    return;
  }
  if (a.data.size() != (size_t)npy_itemsize(a.dtype))
    fail(kTool, where + " — found " + std::string(dtype_name(a.dtype)) + " of shape " +
                    shape_text(a.shape.data(), (int64_t)a.shape.size()) + " — valid: " +
                    describe_io(info) + ", one element — fix: numpy.save(path, numpy.array(v))");
  double value = element_as_double(a.dtype, a.data.data(), 0);
  bool integral = a.dtype != 5 && a.dtype != 6 && a.dtype != 7 && a.dtype != 15;
  if (info.kind == OPF_VALUE_DOUBLE) {
    check(kTool, opf_method_set_input_double(method, index, value), "setting " + where);
  } else if (info.kind == OPF_VALUE_BOOL && a.dtype == 11) {
    check(kTool, opf_method_set_input_bool(method, index, value != 0), "setting " + where);
  } else if (info.kind == OPF_VALUE_INT && integral && a.dtype != 11) {
    int64_t v = 0;
    if (a.dtype == 4) std::memcpy(&v, a.data.data(), 8);
    else v = (int64_t)value;  // narrower integers are exact in a double
    if (a.dtype == 29) {
      uint64_t u; std::memcpy(&u, a.data.data(), 8);
      if (u > (uint64_t)INT64_MAX) fail(kTool, where + " — a uint64 over int64's range");
      v = (int64_t)u;
    }
    check(kTool, opf_method_set_input_int(method, index, v), "setting " + where);
  } else {
    fail(kTool, where + " — found " + std::string(dtype_name(a.dtype)) + " — valid: " +
                    describe_io(info) + " — fix: save it with that dtype");
  }
}

// One output of the last call, copied out of the instance.
struct Output {
  int32_t kind = OPF_VALUE_TENSOR;
  int32_t dtype = 0;
  std::vector<int64_t> shape;
  std::vector<unsigned char> data;
};

std::vector<Output> read_outputs(opf_method* method, int64_t count, const std::vector<opf_io_info>& infos) {
  std::vector<Output> outputs((size_t)count);
  for (int64_t j = 0; j < count; ++j) {
    Output& out = outputs[(size_t)j];
    int32_t kind = 0;
    int64_t i = 0;
    double d = 0;
    opf_tensor_view view;
    opf_status status = opf_method_output(method, j, &view);
    if (status == OPF_OK) {
      out.dtype = view.dtype;
      out.shape.assign(view.sizes, view.sizes + view.rank);
      const unsigned char* p = static_cast<const unsigned char*>(view.data);
      out.data.assign(p, p + view.nbytes);
      if ((size_t)j < infos.size() && infos[(size_t)j].dim_order && infos[(size_t)j].rank == view.rank)
        out.data = relayout(out.data, out.shape, npy_itemsize(view.dtype), infos[(size_t)j].dim_order, false);
      continue;
    }
    check(kTool, opf_method_output_scalar(method, j, &kind, &i, &d),
          "reading output " + std::to_string(j));
    out.kind = kind;
    if (kind == OPF_VALUE_DOUBLE) {
      out.dtype = 7;
      out.data.resize(8);
      std::memcpy(out.data.data(), &d, 8);
    } else if (kind == OPF_VALUE_BOOL) {
      out.dtype = 11;
      out.data.assign(1, (unsigned char)(i != 0));
    } else {
      out.dtype = 4;
      out.data.resize(8);
      std::memcpy(out.data.data(), &i, 8);
    }
  }
  return outputs;
}

void print_outputs(const std::vector<std::vector<Output>>& results) {
  std::printf("%-9s %-6s %-9s %-16s %12s %12s %12s\n", "inference", "output", "dtype", "shape",
              "min", "max", "mean");
  size_t shown = std::min<size_t>(results.size(), 4);
  for (size_t i = 0; i < shown; ++i) {
    for (size_t j = 0; j < results[i].size(); ++j) {
      const Output& o = results[i][j];
      int64_t n = npy_itemsize(o.dtype) ? (int64_t)o.data.size() / npy_itemsize(o.dtype) : 0;
      std::string stats[3];
      if (n > 0 && o.dtype != 9 && o.dtype != 10 && o.dtype != 8) {
        double lo = INFINITY, hi = -INFINITY, sum = 0;
        for (int64_t k = 0; k < n; ++k) {
          double v = element_as_double(o.dtype, o.data.data(), k);
          lo = std::min(lo, v), hi = std::max(hi, v), sum += v;
        }
        char buffer[3][32];
        std::snprintf(buffer[0], 32, "%.6g", lo);
        std::snprintf(buffer[1], 32, "%.6g", hi);
        std::snprintf(buffer[2], 32, "%.6g", sum / (double)n);
        for (int k = 0; k < 3; ++k) stats[k] = buffer[k];
      }
      std::printf("%-9zu %-6zu %-9s %-16s %12s %12s %12s\n", i, j, dtype_name(o.dtype),
                  shape_text(o.shape.data(), (int64_t)o.shape.size()).c_str(), stats[0].c_str(),
                  stats[1].c_str(), stats[2].c_str());
    }
  }
  if (results.size() > shown) std::printf("(%zu more inference(s) not shown)\n", results.size() - shown);
}

double quantile(const std::vector<double>& sorted, double q) {  // linear, as numpy's default
  double at = q * (double)(sorted.size() - 1);
  size_t low = (size_t)at;
  if (low + 1 >= sorted.size()) return sorted.back();
  return sorted[low] + (sorted[low + 1] - sorted[low]) * (at - (double)low);
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') out += '\\', out += (char)c;
    else if (c < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
      out += buffer;
    } else out += (char)c;
  }
  return out + "\"";
}

struct OpTotal {
  int64_t count = 0, total_ns = 0;
};

struct TraceEvent {
  std::string name, node;
  int64_t instruction;  // -1: the whole call
  int64_t start_ns, duration_ns;
};

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  Session session(kTool, o.program, o.kernels);
  std::string method_name = o.method;
  if (method_name.empty()) {
    std::vector<std::string> names = session.method_names();
    method_name = session.has_method("forward") || names.size() != 1 ? "forward" : names[0];
  }
  std::vector<opf_io_info> inputs = session.io(method_name, true);
  std::vector<opf_io_info> output_infos = session.io(method_name, false);
  int64_t num_outputs = (int64_t)session.io(method_name, false).size();

  std::vector<std::vector<std::string>> calls;
  if (!o.inputs_list.empty()) calls = read_inputs_list(o.inputs_list);
  else calls.push_back(o.inputs);
  for (size_t c = 0; c < calls.size(); ++c) {
    if (calls[c].size() != inputs.size()) {
      std::string expected;
      for (const opf_io_info& info : inputs) expected += (expected.empty() ? "" : ", ") + describe_io(info);
      fail(kTool, "method '" + method_name + "' " + (calls.size() > 1 ? "call " + std::to_string(c) + " " : "") +
                      "inputs — found " + std::to_string(calls[c].size()) + " .npy file(s) — valid: exactly " +
                      std::to_string(inputs.size()) + " (" + (expected.empty() ? "none" : expected) +
                      ") — fix: pass them in order with --input", kExitUsage);
    }
  }

  opf_method* method = nullptr;
  check(kTool, opf_method_new(session.program(), method_name.c_str(), nullptr, &method),
        "making method '" + method_name + "'");
  bool timed = o.profile || !o.trace.empty();
  if (timed) check(kTool, opf_method_set_profiling(method, 1), "turning profiling on");
  int64_t instructions = opf_method_num_instructions(method);
  std::printf("%s: method '%s', native runtime, %lld instruction(s)\n", o.program.c_str(),
              method_name.c_str(), (long long)instructions);

  using clock = std::chrono::steady_clock;
  clock::time_point origin = clock::now();
  std::vector<double> latencies_us;
  std::vector<std::vector<Output>> results;
  std::map<std::string, OpTotal> totals;
  std::vector<TraceEvent> events;
  for (size_t c = 0; c < calls.size(); ++c) {
    std::vector<NpyArray> arrays(calls[c].size());
    for (size_t k = 0; k < arrays.size(); ++k) {
      std::string error;
      if (!npy_read(calls[c][k], &arrays[k], &error)) fail(kTool, error);
    }
    for (int64_t r = 0; r < o.repeat; ++r) {
      clock::time_point start = clock::now();
      for (size_t k = 0; k < arrays.size(); ++k) set_input(method, (int64_t)k, inputs[k], arrays[k], calls[c][k]);
      check(kTool, opf_method_execute(method), "executing method '" + method_name + "'" +
                                                   (calls.size() > 1 ? " (call " + std::to_string(c) + ")" : ""));
      clock::time_point end = clock::now();
      latencies_us.push_back(std::chrono::duration<double, std::micro>(end - start).count());
      if (!timed) continue;
      int64_t call_start = std::chrono::duration_cast<std::chrono::nanoseconds>(start - origin).count();
      int64_t at = call_start;  // the API gives durations: the trace lays them end to end
      for (int64_t k = 0; k < instructions; ++k) {
        const char* label = nullptr;
        const char* node = nullptr;
        int64_t ns = -1;
        check(kTool, opf_method_instruction_profile(method, k, &label, &node, &ns), "reading the profile");
        if (ns < 0) continue;
        OpTotal& total = totals[label ? label : "?"];
        total.count += 1, total.total_ns += ns;
        if (!o.trace.empty()) events.push_back({label ? label : "?", node ? node : "", k, at, ns});
        at += ns;
      }
      if (!o.trace.empty())
        events.push_back({"method " + method_name, "", -1, call_start,
                          std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count()});
    }
    results.push_back(read_outputs(method, num_outputs, output_infos));
  }

  print_outputs(results);
  if (latencies_us.size() > 1) {
    std::vector<double> sorted = latencies_us;
    std::sort(sorted.begin(), sorted.end());
    double sum = 0;
    for (double v : sorted) sum += v;
    std::printf("latency over %zu call(s): median %.2f us, p10 %.2f us, p90 %.2f us, min %.2f us, "
                "mean %.2f us%s\n", sorted.size(), quantile(sorted, 0.5), quantile(sorted, 0.1),
                quantile(sorted, 0.9), sorted.front(), sum / (double)sorted.size(),
                timed ? " (profiling on: each instruction timed)" : "");
  }
  if (!o.output_dir.empty()) {
    int64_t written = 0;
    for (size_t i = 0; i < results.size(); ++i) {
      std::string folder = o.output_dir;
      if (!o.inputs_list.empty()) folder += "/inference_" + std::to_string(i);
      make_dirs(folder);
      for (size_t j = 0; j < results[i].size(); ++j) {
        const Output& out = results[i][j];
        std::string error, path = folder + "/output_" + std::to_string(j) + ".npy";
        if (!npy_write(path, out.dtype, out.shape.data(), (int32_t)out.shape.size(), out.data.data(),
                       (int64_t)out.data.size(), &error))
          fail(kTool, error);
        ++written;
      }
    }
    std::printf("wrote %lld output file(s) to %s\n", (long long)written, o.output_dir.c_str());
  }
  if (o.profile) {
    std::vector<std::pair<std::string, OpTotal>> rows(totals.begin(), totals.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
      return a.second.total_ns != b.second.total_ns ? a.second.total_ns > b.second.total_ns : a.first < b.first;
    });
    int64_t grand = 0;
    for (const auto& row : rows) grand += row.second.total_ns;
    std::printf("%-40s %8s %12s %10s %10s\n", "instruction", "count", "total us", "mean us", "share %");
    for (const auto& row : rows)
      std::printf("%-40s %8lld %12.2f %10.3f %10.1f\n", row.first.c_str(), (long long)row.second.count,
                  (double)row.second.total_ns / 1e3, (double)row.second.total_ns / (double)row.second.count / 1e3,
                  grand ? 100.0 * (double)row.second.total_ns / (double)grand : 0.0);
  }
  if (!o.trace.empty()) {
    FILE* f = std::fopen(o.trace.c_str(), "w");
    if (!f) fail(kTool, "--trace '" + o.trace + "' — cannot write it (" + std::strerror(errno) + ")");
    std::fprintf(f, "{\"traceEvents\": [");
    for (size_t k = 0; k < events.size(); ++k) {
      const TraceEvent& e = events[k];
      std::string args = "{\"method\": " + json_string(method_name);
      if (e.instruction >= 0)
        args += ", \"instruction\": " + std::to_string(e.instruction) + ", \"node\": " + json_string(e.node);
      std::fprintf(f, "%s\n{\"name\": %s, \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, "
                      "\"pid\": 1, \"tid\": 0, \"args\": %s}}", k ? "," : "", json_string(e.name).c_str(),
                   e.instruction < 0 ? "method" : "kernel", (double)e.start_ns / 1e3,
                   (double)e.duration_ns / 1e3, args.c_str());
    }
    std::fprintf(f, "\n], \"displayTimeUnit\": \"ms\"}\n");
    if (std::fclose(f) != 0) fail(kTool, "--trace '" + o.trace + "' — cannot write it");
    std::printf("trace: %zu event(s) written to %s (open in ui.perfetto.dev)\n", events.size(), o.trace.c_str());
  }
  opf_method_free(method);
  return 0;
}
