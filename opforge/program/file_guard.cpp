// The program-file guard: a SIGBUS handler for the read-only mappings of loaded program files.
//
// A program's constants are read through a shared mapping of its file; a file truncated in
// place after load (`cp new.opf old.opf` over a served file) turns every read past its new
// end into SIGBUS, in NumPy, in the cpu engine, in any thread. The handler recognises a
// fault inside a registered mapping (BUS_ADRERR: no file page behind the address), maps
// zero pages over the rest of that mapping (MAP_FIXED, anonymous, read-only: the same range,
// so nothing else moves), flags the region and returns: the read is retried and finds zeros.
// The runtime checks the flag after each call and raises a ProgramError instead of returning
// what was computed from them (opforge/program/file_guard.py). Any other SIGBUS goes to the
// handler this one replaced (faulthandler's, the cpu engine's crash report, or the default).
//
// The table is written by file_guard.py under its lock and read by the handler lock-free:
// each slot's start and end are atomics, cleared (end first) before the mapping is unmapped.
// mmap in a signal handler: not on POSIX's async-signal-safe list, but on Linux a system
// call that takes no user-space lock (glibc's wrapper sets errno only), as JVMs rely on.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace {

constexpr int kSlots = 1024;

struct Region {
  std::atomic<uintptr_t> start{0}, end{0};  // [start, end), page-aligned; 0: a free slot
  std::atomic<int32_t> faulted{0};
};

Region g_regions[kSlots];
struct sigaction g_previous;
std::atomic<bool> g_installed{false};
uintptr_t g_page = 4096;  // the page size, read at install (sysconf is not for a handler)

void on_bus(int sig, siginfo_t* info, void* context) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(info->si_addr);
  if (info->si_code == BUS_ADRERR) {
    for (Region& r : g_regions) {
      const uintptr_t start = r.start.load(std::memory_order_acquire);
      const uintptr_t end = r.end.load(std::memory_order_acquire);
      if (!start || at < start || at >= end) continue;
      const uintptr_t page = at & ~(g_page - 1);
      void* zeros = mmap(reinterpret_cast<void*>(page), end - page, PROT_READ,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      if (zeros == MAP_FAILED) break;  // cannot repair: the previous handler reports it
      r.faulted.store(1, std::memory_order_release);
      return;  // the read runs again, on zeros
    }
  } else if (info->si_code <= 0 && info->si_pid == getpid()) {
    // raised by a handler that ran before this one for the same fault (the crash report or
    // faulthandler, installed after the guard: they restore this handler and raise); the
    // faulting instruction runs again and faults into this handler with its address. (So a
    // process that sends itself SIGBUS with kill() is not ended by it.)
    return;
  }
  // not a program file's: the handler this one replaced
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    signal(sig, SIG_DFL);  // the fault runs again and ends the process, as without the guard
    if (info->si_code <= 0) raise(sig);
  }
}

}  // namespace

extern "C" {

// Install the handler (once: reinstalled over a handler that saved this one, the two would
// hand a fault to each other forever). A handler installed after it (the cpu engine's crash
// report) runs first and hands a program file's fault on to it (see on_bus). 0 on success,
// -1 when sigaction fails.
__attribute__((visibility("default"))) int32_t ofg_install(void) {
  if (g_installed.load()) return 0;
  g_page = (uintptr_t)sysconf(_SC_PAGESIZE);
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_sigaction = on_bus;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  struct sigaction previous;
  if (sigaction(SIGBUS, &action, &previous) != 0) return -1;
  g_previous = previous;  // (before any fault can reach the handler: read only by it)
  g_installed.store(true);
  return 0;
}

// Guard [address, address + size) (a mapping of a program file): its slot, or -1 when every
// slot is taken (the mapping is then unguarded).
__attribute__((visibility("default"))) int32_t ofg_add(uintptr_t address, uint64_t size) {
  if (size > UINTPTR_MAX - address - g_page) return -1;
  const uintptr_t end = (address + size + g_page - 1) & ~(g_page - 1);
  for (int32_t i = 0; i < kSlots; ++i) {
    Region& r = g_regions[i];
    if (r.start.load(std::memory_order_acquire)) continue;
    r.faulted.store(0, std::memory_order_relaxed);
    r.end.store(end, std::memory_order_release);
    r.start.store(address, std::memory_order_release);
    return i;
  }
  return -1;
}

// Stop guarding slot i (before its mapping is unmapped).
__attribute__((visibility("default"))) void ofg_remove(int32_t i) {
  if (i < 0 || i >= kSlots) return;
  g_regions[i].start.store(0, std::memory_order_release);
  g_regions[i].end.store(0, std::memory_order_release);
}

// The address of slot i's flag (an int32: 1 once a read of its mapping faulted), which the
// runtime reads after each call; null for a bad slot.
__attribute__((visibility("default"))) const int32_t* ofg_flag(int32_t i) {
  if (i < 0 || i >= kSlots) return nullptr;
  static_assert(sizeof(std::atomic<int32_t>) == sizeof(int32_t), "a plain int32 to read");
  return reinterpret_cast<const int32_t*>(&g_regions[i].faulted);
}

}  // extern "C"
