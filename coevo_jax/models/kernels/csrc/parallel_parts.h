// One kernel call's work, in parts, shared by the calling thread and tasks on XLA's intra-op thread pool.
#ifndef COEVO_JAX_PARALLEL_PARTS_H_
#define COEVO_JAX_PARALLEL_PARTS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace coevo_jax {

// Calls run_part(c) once for every c in [0, parts), on the calling thread and on up to one pool task per
// other pool thread, and returns when all are done. Parts are taken from an atomic counter, so a task that
// starts late finds nothing left and the caller never waits on a task that has not started. The shared
// state is owned jointly (shared_ptr): a late task may outlive the call, but never calls run_part then.
template <class RunPart>
void run_parts(xla::ffi::ThreadPool& pool, int64_t parts, RunPart run_part) {
  struct Shared {
    Shared(RunPart run_part, int64_t parts) : run_part(std::move(run_part)), parts(parts) {}
    RunPart run_part;
    const int64_t parts;
    std::atomic<int64_t> next{0}, done{0};

    void run() {
      for (int64_t c; (c = next.fetch_add(1)) < parts;) {
        run_part(c);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto shared = std::make_shared<Shared>(std::move(run_part), parts);
  const int64_t helpers = std::min<int64_t>(std::max<int64_t>(1, pool.num_threads()), parts) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([shared] { shared->run(); });
  shared->run();
  while (shared->done.load(std::memory_order_acquire) < parts) std::this_thread::yield();
}

}  // namespace coevo_jax

#endif  // COEVO_JAX_PARALLEL_PARTS_H_
