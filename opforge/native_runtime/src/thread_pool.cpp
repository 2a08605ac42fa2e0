// The kernels' thread pool and the thread-count rule (thread_pool.h).
#include "thread_pool.h"

#include <sched.h>

#include <cctype>
#include <cstdlib>
#include <system_error>

#include "errors.h"

namespace opforge::rt {

namespace {

constexpr int32_t kAutoMax = 4;  // opforge.runtime.threads.AUTO_MAX
constexpr int kSpins = 1000;     // ~20-40 µs of pause before a thread sleeps

int32_t usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  int count = CPU_COUNT(&set);
  return count > 0 ? count : 1;
}

// Set while this thread runs a job's tasks: a kernel that starts a parallel loop inside a
// task (nested) runs it on its own thread instead of handing the busy pool a second job.
thread_local bool tls_in_job = false;

inline void pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

int32_t resolve_num_threads(int32_t requested, const std::string& api) {
  auto refuse = [&](const std::string& found) {
    raise(OPF_ERR_INVALID_ARGUMENT, "`" + api + "`: " + found + " — valid: a count from 1 to " +
                                        std::to_string(kMaxThreads) + ", or 'auto' for the variable — fix: "
                                        "options.num_threads = 0 and OPFORGE_NUM_THREADS unset for 1 thread, "
                                        "or e.g. OPFORGE_NUM_THREADS=2");
  };
  if (requested < 0 || requested > kMaxThreads)
    refuse("options.num_threads — found " + std::to_string(requested));
  if (requested > 0) return requested;
  const char* raw = std::getenv("OPFORGE_NUM_THREADS");
  std::string text = raw ? raw : "";
  size_t first = text.find_first_not_of(" \t\n\r"), last = text.find_last_not_of(" \t\n\r");
  text = first == std::string::npos ? "" : text.substr(first, last - first + 1);
  if (text.empty()) return 1;
  std::string lower;
  for (char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "auto") return std::min(usable_cores(), kAutoMax);
  int64_t value = 0;
  bool digits = text.size() <= 10;
  for (char c : text) {
    digits = digits && c >= '0' && c <= '9';
    if (digits) value = value * 10 + (c - '0');
  }
  if (!digits || value < 1 || value > kMaxThreads)
    refuse("environment variable OPFORGE_NUM_THREADS — found '" + text.substr(0, 40) + "'");
  return static_cast<int32_t>(value);
}

ThreadPool::ThreadPool(int32_t threads) {
  try {
    for (int32_t t = 1; t < threads; ++t) workers_.emplace_back([this] { worker(); });
  } catch (const std::system_error& e) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& w : workers_) w.join();
    raise(OPF_ERR_MEMORY, "`opf_method_new`: a pool of " + std::to_string(threads) + " threads — could not "
                          "start thread " + std::to_string(workers_.size() + 1) + " (" + e.what() +
                          ") — valid: threads the system allows — fix: fewer threads (options.num_threads "
                          "or OPFORGE_NUM_THREADS)");
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::parallel_for(void* pool, int64_t n, kernel_task_fn task, void* closure) {
  static_cast<ThreadPool*>(pool)->run(n, task, closure);
}

void ThreadPool::work(uint64_t generation, int64_t n, kernel_task_fn task, void* closure) {
  constexpr uint64_t kMask = (uint64_t(1) << kTaskBits) - 1;
  const uint64_t tag = generation << kTaskBits;
  tls_in_job = true;
  uint64_t word = claim_.load(std::memory_order_acquire);
  for (;;) {
    if ((word & ~kMask) != tag || int64_t(word & kMask) >= n) break;  // another job, or none left
    if (!claim_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel)) continue;
    task(closure, int64_t(word & kMask));
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
      std::lock_guard<std::mutex> lock(mutex_);  // the caller may be between its check and its wait
      finished_.notify_all();
    }
    word = claim_.load(std::memory_order_acquire);
  }
  tls_in_job = false;
}

void ThreadPool::run(int64_t n, kernel_task_fn task, void* closure) {
  if (workers_.empty() || n <= 1 || n >= (int64_t(1) << kTaskBits) || tls_in_job) {
    for (int64_t i = 0; i < n; ++i) task(closure, i);
    return;
  }
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation = generation_.load(std::memory_order_relaxed) + 1;
    task_ = task;
    closure_ = closure;
    n_ = n;
    done_.store(0, std::memory_order_relaxed);
    claim_.store(generation << kTaskBits, std::memory_order_release);
    generation_.store(generation, std::memory_order_release);
  }
  wake_.notify_all();
  work(generation, n, task, closure);
  // every task is claimed; wait for those other threads still run (spin first: a block of
  // work ends about when the caller's does)
  for (int spin = 0; spin < kSpins && done_.load(std::memory_order_acquire) != n; ++spin) pause();
  if (done_.load(std::memory_order_acquire) != n) {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return done_.load(std::memory_order_acquire) == n; });
  }
}

void ThreadPool::worker() {
  uint64_t seen = 0;
  for (;;) {
    // a new job soon after the last is taken without sleeping
    for (int spin = 0; spin < kSpins && generation_.load(std::memory_order_acquire) == seen; ++spin) pause();
    kernel_task_fn task;
    void* closure;
    int64_t n;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
      seen = generation_.load(std::memory_order_acquire);
      task = task_;
      closure = closure_;
      n = n_;
    }
    work(seen, n, task, closure);
  }
}

}  // namespace opforge::rt
