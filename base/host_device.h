// NC_HOST_DEVICE marks a function that runs on the host and, in CUDA sources, on the device
// too: the scalar code that the CPU and CUDA backends share so that both give the same bits.
#pragma once

#if defined(__CUDACC__)
#define NC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define NC_HOST_DEVICE inline
#endif
