// The CPU backend's thread pool. Work is cut into ranges by its size and a grain alone,
// never by the number of threads, and each range is computed the same way whichever thread
// runs it; a reduction keeps one partial per range and adds them in range order. So every
// result is the same bits at any thread count (set_num_threads, NORMCORE_NUM_THREADS).
//
// One parallel region runs at a time: a call made while another thread's region holds the
// pool, or from inside a range of a region of several ranges (a nested call), runs its
// ranges on the calling thread, in order; a region of one range runs it directly, so the
// regions inside it may still use the pool. Applications that call normcore from several
// threads therefore never oversubscribe the cores and never wait on each other for the pool.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace normcore {
namespace cpu {

// The number of ranges of [0, n) cut every `grain` (at least one when n > 0).
inline int64_t range_count(int64_t n, int64_t grain) { return n <= 0 ? 0 : (n + grain - 1) / grain; }

// fn(context, begin, end) for each range [begin, end) of [0, n) cut every grain; rethrows
// the first exception a range threw once every range has finished or been skipped.
void run_ranges(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* context);

// Calls body(begin, end) for the ranges [0, grain), [grain, 2 grain), ... of [0, n) on the
// pool's threads and the caller's, and returns when all are done. body must write only what
// its range owns. grain < 1 is taken as 1.
template <class Body>
void parallel_for(int64_t n, int64_t grain, Body&& body) {
  using B = std::remove_reference_t<Body>;
  run_ranges(
      n, grain < 1 ? 1 : grain,
      [](void* context, int64_t begin, int64_t end) { (*static_cast<B*>(context))(begin, end); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

// The grain that cuts n items of `cost` elements of work each into ranges of about
// `target` elements (at least one item a range).
inline int64_t grain_for(int64_t cost, int64_t target = 32768) { return cost <= 0 ? 1 : (target + cost - 1) / cost; }

}  // namespace cpu
}  // namespace normcore
