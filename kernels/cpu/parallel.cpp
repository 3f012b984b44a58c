// The CPU thread pool (kernels/cpu/parallel.h): num_threads() - 1 workers started on the
// first parallel region, and the calling thread, claiming ranges from a shared counter.
#include "kernels/cpu/parallel.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "normcore/device.h"
#include "normcore/error.h"

namespace normcore {
namespace cpu {
namespace {

// True on a thread while it runs a range of a region: a nested call runs inline.
thread_local bool tls_in_region = false;

struct RegionFlag {
  bool previous;
  RegionFlag() : previous(tls_in_region) { tls_in_region = true; }
  ~RegionFlag() { tls_in_region = previous; }
};

// How long an idle worker, or a region's caller waiting for the workers, spins before it
// sleeps. The next region usually comes within microseconds, and waking a sleeping thread
// takes tens of them on a virtual machine: ResNet-50 at batch 1 runs about 60 regions an
// image, and on two cores it ran 4-10% faster with the workers spinning 300 us (alternating
// runs, docs/PERFORMANCE.md). onnxruntime's and OpenMP's workers spin too.
constexpr std::chrono::microseconds kSpin{300};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The end of range i of [0, n) cut every grain.
inline int64_t range_end(int64_t i, int64_t n, int64_t grain) { return i * grain + grain < n ? i * grain + grain : n; }

struct Job {
  int64_t n, grain, count;
  void (*fn)(void*, int64_t, int64_t);
  void* context;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;

  // Claims and runs ranges until none is left; after a failure the rest are skipped.
  void work() {
    RegionFlag flag;
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < count;) {
      if (failed.load(std::memory_order_relaxed)) continue;
      const int64_t begin = i * grain, end = range_end(i, n, grain);
      try {
        fn(context, begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed.store(true, std::memory_order_relaxed);
      }
    }
  }
};

// The cores this process may run on.
int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

// NORMCORE_NUM_THREADS when it is a whole number >= 1 (a warning otherwise), else the cores.
int default_threads() {
  const char* env = std::getenv("NORMCORE_NUM_THREADS");
  if (env && *env) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (*end == '\0' && n >= 1 && n <= 4096) return static_cast<int>(n);
    std::fprintf(stderr, "normcore: ignoring NORMCORE_NUM_THREADS=\"%s\" (expected a whole number from 1 to 4096)\n",
                 env);
  }
  return available_cores();
}

class Pool {
 public:
  Pool() : threads_(default_threads()) {}
  ~Pool() { stop_workers(); }

  int threads() const { return threads_.load(); }

  void set_threads(int n) {
    std::lock_guard<std::mutex> region(region_);  // waits for a running region
    if (n == threads_.load()) return;
    stop_workers();
    threads_.store(n);
  }

  void run(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* context) {
    const int64_t count = range_count(n, grain);
    std::unique_lock<std::mutex> region(region_, std::defer_lock);
    if (count == 1) {  // one range: its own nested regions may still use the pool
      fn(context, 0, n);
      return;
    }
    if (tls_in_region || threads_.load() <= 1 || !region.try_lock()) {
      RegionFlag flag;
      for (int64_t i = 0; i < count; ++i) fn(context, i * grain, range_end(i, n, grain));
      return;
    }
    start_workers();
    Job job;
    job.n = n;
    job.grain = grain;
    job.count = count;
    job.fn = fn;
    job.context = context;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    job.work();
    {
      std::unique_lock<std::mutex> lock(mutex_);
      job_ = nullptr;  // a worker waking from now on finds nothing to do
    }
    // The workers' last ranges end about when this thread's do: wait for them spinning a
    // while before sleeping (a sleeping thread takes tens of microseconds to wake).
    spin_until([&] { return active_.load(std::memory_order_acquire) == 0; });
    {
      std::unique_lock<std::mutex> lock(mutex_);
      idle_.wait(lock, [&] { return active_.load(std::memory_order_acquire) == 0; });
    }
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  // Called with region_ held.
  void start_workers() {
    const int wanted = threads_.load() - 1;
    // A worker takes part from the next region on: the generation before it is published
    // (read inside the worker, it could already be the next one's, and the worker would wait
    // for the one after).
    const uint64_t now = generation_.load(std::memory_order_acquire);
    while (static_cast<int>(workers_.size()) < wanted) workers_.emplace_back([this, now] { worker(now); });
  }

  // Called with region_ held (or from the destructor).
  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_.store(true);
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(false);
  }

  // Spins until done() or kSpin has passed.
  template <class F>
  static void spin_until(const F& done) {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (int i = 1; !done(); ++i) {
      cpu_relax();
      if (i % 64 == 0 && std::chrono::steady_clock::now() > until) return;
    }
  }

  void worker(uint64_t seen) {
    while (true) {
      // The next region usually comes within microseconds (one op's after the last's): wait
      // for it spinning a while, then sleep.
      spin_until([&] { return generation_.load(std::memory_order_acquire) != seen || stop_.load(); });
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_.load() || generation_.load(std::memory_order_acquire) != seen; });
      if (stop_.load()) return;
      seen = generation_.load(std::memory_order_acquire);
      Job* job = job_;
      if (!job) continue;
      active_.fetch_add(1, std::memory_order_relaxed);
      lock.unlock();
      job->work();
      lock.lock();
      if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) idle_.notify_all();
    }
  }

  std::atomic<int> threads_;
  std::mutex region_;  // held by the thread whose region owns the workers
  std::mutex mutex_;   // guards the fields below
  std::condition_variable wake_, idle_;
  std::vector<std::thread> workers_;
  Job* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};  // written under mutex_, read by spinning workers too
  std::atomic<int> active_{0};           // workers inside a job
  std::atomic<bool> stop_{false};        // written under mutex_, read by spinning workers too
};

Pool& pool() {
  static Pool instance;
  return instance;
}

}  // namespace

void run_ranges(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* context) {
  if (n <= 0) return;
  pool().run(n, grain, fn, context);
}

}  // namespace cpu

int num_threads() { return cpu::pool().threads(); }

void set_num_threads(int n) {
  NC_CHECK(n >= 1 && n <= 4096, ValueError, "set_num_threads: n must be from 1 to 4096, got ", n);
  cpu::pool().set_threads(n);
}

}  // namespace normcore
