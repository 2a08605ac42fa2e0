// The method instance's threads for the portable kernels (kernels/kernel_services.h), and
// the thread count a method runs on (opforge/runtime/threads.py's rule, in C++).
//
// # Design
//
// One pool per method instance with num_threads > 1: num_threads - 1 workers made when
// the instance is made, joined when it is freed. An instance runs one call at a time
// (method.h), so one kernel at a time hands the pool a job: n tasks (kernels cut their
// work into a few tasks per thread), claimed one by one by the workers and by the calling
// thread itself, which returns when all n are done. The caller never waits for a worker
// that has not started: on a machine busier than its cores, a descheduled worker's share
// is taken by the threads that run. A claim is a compare-and-swap on one word holding the
// job's generation and the next task, so a worker that wakes late, after its job is over,
// claims nothing of the next one. A job allocates nothing. Workers that finish a job spin
// briefly for the next (a decoder's kernels come microseconds apart), then sleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernel_services.h"

namespace opforge::rt {

constexpr int32_t kMaxThreads = 1024;

// The threads a method instance uses: `requested` when > 0, else OPFORGE_NUM_THREADS (a
// count, or "auto": the usable cores, at most 4), else 1. A negative request, a malformed
// variable or a count over kMaxThreads is OPF_ERR_INVALID_ARGUMENT naming `api`.
int32_t resolve_num_threads(int32_t requested, const std::string& api);

class ThreadPool {
 public:
  explicit ThreadPool(int32_t threads);  // threads - 1 workers; the caller is the last
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // KernelServices::parallel_for.
  static void parallel_for(void* pool, int64_t n, kernel_task_fn task, void* closure);

 private:
  void run(int64_t n, kernel_task_fn task, void* closure);
  void work(uint64_t generation, int64_t n, kernel_task_fn task, void* closure);
  void worker();

  static constexpr int kTaskBits = 24;   // a job has fewer than 2^24 tasks (else it runs inline)
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  std::atomic<uint64_t> generation_{0};  // one per job
  bool stop_ = false;
  // the job (written under mutex_ before generation_ moves)
  kernel_task_fn task_ = nullptr;
  void* closure_ = nullptr;
  int64_t n_ = 0;
  std::atomic<uint64_t> claim_{0};       // generation << kTaskBits | the next task
  std::atomic<int64_t> done_{0};         // tasks of this job finished
};

}  // namespace opforge::rt
