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

void ThreadPool::work(int64_t n, kernel_task_fn task, void* closure) {
  tls_in_job = true;
  for (int64_t i = next_.fetch_add(1, std::memory_order_relaxed); i < n;
       i = next_.fetch_add(1, std::memory_order_relaxed))
    task(closure, i);
  tls_in_job = false;
}

void ThreadPool::run(int64_t n, kernel_task_fn task, void* closure) {
  if (workers_.empty() || n <= 1 || tls_in_job) {
    for (int64_t i = 0; i < n; ++i) task(closure, i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = task;
    closure_ = closure;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    busy_.store(static_cast<int32_t>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  work(n, task, closure);
  // the last worker out signals; spin first (the tasks are about the same size)
  for (int spin = 0; spin < kSpins && busy_.load(std::memory_order_acquire) != 0; ++spin) pause();
  if (busy_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return busy_.load(std::memory_order_acquire) == 0; });
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
    work(n, task, closure);
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);  // the caller may be between its check and its wait
      done_.notify_one();
    }
  }
}

}  // namespace opforge::rt
