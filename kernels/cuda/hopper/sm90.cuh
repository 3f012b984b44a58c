// Hopper's asynchronous machinery for the sm_90a kernels of this folder: transaction
// barriers (mbarrier), the tensor memory accelerator's tile copies (cp.async.bulk.tensor, a
// CUtensorMap made on the host), shared-memory matrix descriptors for wgmma (wgmma.cuh),
// wgmma's fence, commit and wait, and setmaxnreg. Shared-memory addresses are 32-bit
// shared-window addresses (flash::smem_address).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace normcore {
namespace cuda {
namespace sm90 {

// ---------------------------------------------------------------- barriers
// A barrier expecting `arrivals` arrivals per phase (and, where a copy says so, bytes).
__device__ __forceinline__ void barrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals));
}
// Makes the initialized barriers visible to the copy engine (after barrier_init, before
// the block's barrier that precedes their first use).
__device__ __forceinline__ void barrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also announces `bytes` that copies will complete on the barrier.
__device__ __forceinline__ void barrier_expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed (a fresh barrier counts the phase
// before its first, parity 1, as completed).
__device__ __forceinline__ void barrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// Named barriers among `threads` threads of the block (ids 1-15; __syncthreads uses 0): sync
// waits until `threads` have arrived or synced on id, arrive counts this thread and goes on.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Ordinary shared-memory stores (address in the shared window).
__device__ __forceinline__ void store_shared(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void store_shared(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}

// ---------------------------------------------------------------- tensor copies
// The box at coordinates (c0 innermost .. c3) of a 4-D tensor map into shared memory at dst,
// completing its bytes on bar. Coordinates past the tensor's extent read as zeros.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// Adds the box at dst's shared-memory address (f32) into the 3-D tensor map's box at (c0,
// c1, c2), element by element, in global memory (parts past the tensor's extent are
// dropped); one bulk group, committed with bulk_commit. The box must have been written by
// this block's threads and made visible with fence_proxy_async.
__device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(src)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most `pending` of this thread's bulk groups still read shared memory.
template <int pending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(pending) : "memory");
}
// Waits until at most `pending` of this thread's bulk groups are incomplete (writes done).
template <int pending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(pending) : "memory");
}
// Orders this thread's ordinary shared-memory writes before later reads of the asynchronous
// proxy (wgmma operands, tensor stores), once the threads that read have synchronized.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---------------------------------------------------------------- wgmma
// The descriptor of a matrix in shared memory laid out as the tensor map's 128-byte swizzle
// writes it: rows of 128 bytes, groups of 8 rows 1024 bytes apart (`stride_bytes`), and, for
// an N-major operand wider than 64 elements, blocks of 64 columns `leading_bytes` apart.
// start: a 1024-byte aligned tile plus a multiple of 32 bytes along a K-major row, or plus a
// multiple of 1024 bytes down the rows.
__device__ __forceinline__ uint64_t swizzled_descriptor(uint32_t start, uint32_t leading_bytes,
                                                        uint32_t stride_bytes = 1024) {
  return uint64_t{(start & 0x3FFFFu) >> 4} | uint64_t{(leading_bytes & 0x3FFFFu) >> 4} << 16 |
         uint64_t{(stride_bytes & 0x3FFFFu) >> 4} << 32 | uint64_t{1} << 62;
}

// Before the first wgmma that reads registers or accumulators written by other instructions.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most `pending` committed groups are still running.
template <int pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
}
// Keeps the compiler from moving reads or writes of accumulators across a wait.
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// ---------------------------------------------------------------- registers
// A warpgroup's registers per thread from here on (every thread of the warpgroup calls it).
template <int registers>
__device__ __forceinline__ void registers_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(registers));
}
template <int registers>
__device__ __forceinline__ void registers_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(registers));
}

}  // namespace sm90
}  // namespace cuda
}  // namespace normcore
