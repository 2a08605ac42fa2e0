// Naming the op that crashed inside a cpu delegate.
//
// The engine calls custom kernels (the kernel ABI) and op-package ops through function
// pointers; a fault in one kills the process, and Python's faulthandler can only show the
// Python frame that entered the engine. So the Python side registers, once per engine
// handle, what each entry the engine may call is (op, kernel symbol, library, engine op,
// node: ofc_crash_label), and a signal handler installed beside faulthandler's looks the
// crashing code up in that table, writes one line naming it to stderr, and hands the
// signal on to the handler it replaced (faulthandler then prints the Python stack). Nothing
// runs per call.
//
// How the crashing entry is found:
//   1. exact, when the engine says which entry this thread is in (ofc_crash_enter(fn)
//      before the call, ofc_crash_enter(nullptr) after: the hook the engine can add);
//   2. else from the faulting thread's stack: the innermost frame that lies in one of an
//      entry's address ranges: the entry function and the author's function it wraps (a
//      kernel's custom::native::name, a package's Package::OpType), which the Python side
//      found in the library's symbol table (they are local symbols, invisible to dladdr);
//   3. else the innermost frame inside a library that has registered entries: the entry
//      at the highest address at or below the frame (reported as "probably").
//
// The handler does only what a crash handler can: no allocation, write(2) of text that was
// formatted at registration. backtrace() is called once at install so that it has loaded
// what it needs before a crash.

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace {

constexpr int kMaxEntries = 4096;
constexpr int kLabelSize = 768;
constexpr int kRanges = 8;

struct Entry {
  std::atomic<const void*> fn{nullptr};  // null: a free slot
  const void* owner = nullptr;
  const void* base = nullptr;  // the library's load address (dladdr)
  uintptr_t ranges[kRanges][2] = {};  // [start, end) of the functions that are this entry
  int n_ranges = 0;
  char label[kLabelSize] = {};
};

Entry g_entries[kMaxEntries];
std::mutex g_mutex;  // registration only; the handler reads without it
thread_local const void* t_current = nullptr;

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
struct sigaction g_previous[sizeof(kSignals) / sizeof(kSignals[0])];
bool g_installed = false;

void say(const char* text) {
  size_t n = strlen(text);
  while (n > 0) {
    ssize_t w = write(STDERR_FILENO, text, n);
    if (w <= 0) return;
    text += w;
    n -= static_cast<size_t>(w);
  }
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    default: return "a fatal signal";
  }
}

const Entry* by_fn(const void* fn) {
  for (auto& e : g_entries)
    if (e.fn.load(std::memory_order_acquire) == fn) return &e;
  return nullptr;
}

// The entry one of whose functions contains pc (2.), or nullptr.
const Entry* containing(const void* pc) {
  auto at = reinterpret_cast<uintptr_t>(pc);
  for (auto& e : g_entries) {
    if (!e.fn.load(std::memory_order_acquire)) continue;
    for (int r = 0; r < e.n_ranges; ++r)
      if (e.ranges[r][0] <= at && at < e.ranges[r][1]) return &e;
  }
  return nullptr;
}

// The registered entry nearest below pc in pc's library (3.), or nullptr.
const Entry* nearest(const void* pc) {
  Dl_info info;
  if (!dladdr(pc, &info)) return nullptr;
  const Entry* best = nullptr;
  for (auto& e : g_entries) {
    const void* fn = e.fn.load(std::memory_order_acquire);
    if (!fn || e.base != info.dli_fbase || fn > pc) continue;
    if (!best || fn > best->fn.load(std::memory_order_relaxed)) best = &e;
  }
  return best;
}

void on_crash(int sig, siginfo_t*, void* context) {
  const Entry* hit = t_current ? by_fn(t_current) : nullptr;
  const char* how = "";
  if (!hit) {
    void* frames[64];
    int n = backtrace(frames, 64);
    const void* pcs[65];
    int count = 0;
#if defined(__x86_64__)
    pcs[count++] = reinterpret_cast<const void*>(
        static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RIP]);
#else
    (void)context;
#endif
    // return addresses: the call is the byte before (after a noreturn call such as
    // abort(), the return address is already the next function's first byte)
    for (int i = 0; i < n; ++i) pcs[count++] = static_cast<const char*>(frames[i]) - 1;
    for (int i = 0; i < count && !hit; ++i) hit = containing(pcs[i]);
    for (int i = 0; i < count && !hit; ++i) {
      hit = nearest(pcs[i]);
      how = "probably ";
    }
  }
  if (hit) {
    say("\nopforge: ");
    say(signal_name(sig));
    say(" inside a cpu delegate, ");
    say(how);
    say("in ");
    say(hit->label);
    say("\n");
  }
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
    if (kSignals[i] == sig) {
      sigaction(sig, &g_previous[i], nullptr);  // faulthandler's, or the default
      break;
    }
  }
  raise(sig);  // delivered when this handler returns (a fault also re-runs and re-faults)
}

}  // namespace

extern "C" {

// Install the handler for SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT (once), keeping the
// handlers it replaces to hand the signal on to. 0 on success.
__attribute__((visibility("default"))) int32_t ofc_crash_reports_install(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_installed) return 0;
  void* warm[2];
  backtrace(warm, 2);  // loads the unwinder now, not inside a crash
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = on_crash;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    if (sigaction(kSignals[i], &action, &g_previous[i]) != 0) return -1;
  }
  g_installed = true;
  return 0;
}

// What a crash in the function at fn is called (label: one line, cut at 767 bytes);
// ranges: n_ranges [start, end) address pairs of the functions that are this entry (at
// most 8 kept); owner groups the labels of one engine. 0, or -1 when the table is full.
__attribute__((visibility("default"))) int32_t ofc_crash_label(const void* owner, const void* fn,
                                                               const uint64_t* ranges,
                                                               int32_t n_ranges,
                                                               const char* label) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Dl_info info;
  const void* base = dladdr(fn, &info) ? info.dli_fbase : nullptr;
  for (auto& e : g_entries) {
    if (e.fn.load(std::memory_order_relaxed) != nullptr) continue;
    e.owner = owner;
    e.base = base;
    e.n_ranges = 0;
    for (int32_t r = 0; r < n_ranges && e.n_ranges < kRanges; ++r) {
      e.ranges[e.n_ranges][0] = static_cast<uintptr_t>(ranges[2 * r]);
      e.ranges[e.n_ranges][1] = static_cast<uintptr_t>(ranges[2 * r + 1]);
      ++e.n_ranges;
    }
    strncpy(e.label, label, kLabelSize - 1);
    e.label[kLabelSize - 1] = '\0';
    e.fn.store(fn, std::memory_order_release);
    return 0;
  }
  return -1;
}

// Forget the labels of owner (its engine is destroyed).
__attribute__((visibility("default"))) void ofc_crash_forget(const void* owner) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& e : g_entries)
    if (e.fn.load(std::memory_order_relaxed) && e.owner == owner)
      e.fn.store(nullptr, std::memory_order_release);
}

// The engine's hook: the entry this thread is about to call (nullptr after it returns).
__attribute__((visibility("default"))) void ofc_crash_enter(const void* fn) { t_current = fn; }

}  // extern "C"
