// Warpgroup matrix products (wgmma.mma_async, sm_90a) at the shapes the Hopper attention
// kernels use: m64nNk16 with f32 accumulators, f16 or bf16 operands, N of 32, 64, 128 or 256. A thread
// of the warpgroup holds N / 2 accumulators: d[4 c + e] is row 16 w + g + 8 (e / 2) and column
// 8 c + 2 t + e % 2 of the 64 x N result (w the warp in the warpgroup, g = lane / 4, t =
// lane % 4), the layout of mma.sync's m16n8 accumulators repeated over N / 8 column chunks.
// ss: A and B in shared memory, both K-major (descriptors, sm90.cuh); ss_mn: A M-major and B
// N-major (both transposed; f16/bf16 only); rs: A in registers
// (four registers of two elements: rows g and g + 8, columns 2 t and 2 t + 8 of the k16 slice,
// as mma.sync's A), B in shared memory N-major (transposed; f16/bf16 only). accumulate false
// overwrites d. Inline PTX takes no arrays, so the accumulators are spelled out once per N
// (the macros below) and each specialization names its type and operand numbers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace normcore {
namespace cuda {
namespace sm90 {

template <class T, int N>
struct Wgmma;

#define NC_WGMMA_REGISTERS_32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define NC_WGMMA_ACCUMULATORS_32 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),\
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define NC_WGMMA_REGISTERS_64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define NC_WGMMA_ACCUMULATORS_64 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),\
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),\
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),\
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define NC_WGMMA_REGISTERS_128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define NC_WGMMA_ACCUMULATORS_128 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),\
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),\
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),\
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),\
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),\
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),\
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),\
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

#define NC_WGMMA_REGISTERS_256 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define NC_WGMMA_ACCUMULATORS_256 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),\
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),\
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),\
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),\
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),\
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),\
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),\
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),\
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),\
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),\
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),\
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),\
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),\
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),\
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),\
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// Wgmma<T, N> for T (PTX type TYPE); A, B, P, TA, TB, R0: the operand numbers of the ss
// form's descriptors, predicate input and transpose immediates and of the rs form's first A
// register (after N / 2 accumulators).
#define NC_WGMMA(T, TYPE, N, A, B, P, TA, TB, R0, R1, R2, R3, RB, RP)                                \
  template <>                                                                                      \
  struct Wgmma<T, N> {                                                                             \
    template <int kTransposeA = 0, int kTransposeB = 0>                                            \
    __device__ __forceinline__ static void ss(float (&d)[N / 2], uint64_t a, uint64_t b, bool accumulate) { \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n"                                 \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " "             \
                   NC_WGMMA_REGISTERS_##N ", %" A ", %" B ", p, 1, 1, %" TA ", %" TB ";\n}\n"       \
                   : NC_WGMMA_ACCUMULATORS_##N                                                     \
                   : "l"(a), "l"(b), "r"(int(accumulate)), "n"(kTransposeA), "n"(kTransposeB));   \
    }                                                                                              \
    __device__ __forceinline__ static void ss_mn(float (&d)[N / 2], uint64_t a, uint64_t b, bool accumulate) { \
      ss<1, 1>(d, a, b, accumulate);                                                               \
    }                                                                                              \
    __device__ __forceinline__ static void rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b,  \
                                              bool accumulate) {                                   \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" RP ", 0;\n"                                \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " "             \
                   NC_WGMMA_REGISTERS_##N ", {%" R0 ", %" R1 ", %" R2 ", %" R3 "}, %" RB           \
                   ", p, 1, 1, 1;\n}\n"                                                           \
                   : NC_WGMMA_ACCUMULATORS_##N                                                     \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)));   \
    }                                                                                              \
  };

NC_WGMMA(__half, "f16", 32, "16", "17", "18", "19", "20", "16", "17", "18", "19", "20", "21")
NC_WGMMA(__nv_bfloat16, "bf16", 32, "16", "17", "18", "19", "20", "16", "17", "18", "19", "20", "21")
NC_WGMMA(__half, "f16", 64, "32", "33", "34", "35", "36", "32", "33", "34", "35", "36", "37")
NC_WGMMA(__nv_bfloat16, "bf16", 64, "32", "33", "34", "35", "36", "32", "33", "34", "35", "36", "37")
NC_WGMMA(__half, "f16", 128, "64", "65", "66", "67", "68", "64", "65", "66", "67", "68", "69")
NC_WGMMA(__nv_bfloat16, "bf16", 128, "64", "65", "66", "67", "68", "64", "65", "66", "67", "68", "69")
NC_WGMMA(__half, "f16", 256, "128", "129", "130", "131", "132", "128", "129", "130", "131", "132", "133")
NC_WGMMA(__nv_bfloat16, "bf16", 256, "128", "129", "130", "131", "132", "128", "129", "130", "131", "132", "133")

#undef NC_WGMMA
#undef NC_WGMMA_REGISTERS_32
#undef NC_WGMMA_ACCUMULATORS_32
#undef NC_WGMMA_REGISTERS_64
#undef NC_WGMMA_REGISTERS_128
#undef NC_WGMMA_ACCUMULATORS_64
#undef NC_WGMMA_ACCUMULATORS_128
#undef NC_WGMMA_REGISTERS_256
#undef NC_WGMMA_ACCUMULATORS_256

}  // namespace sm90
}  // namespace cuda
}  // namespace normcore
