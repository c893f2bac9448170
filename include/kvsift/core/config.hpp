// SPDX-License-Identifier: Apache-2.0
#pragma once

// Function-like configuration macros. Never use raw __host__/__device__ in kvsift headers:
// under g++ with only the CCCL include path they are undefined.

#if defined(__CUDACC__)
#define KVSIFT_CUDA_COMPILATION() 1
#define KVSIFT_HOST_DEVICE __host__ __device__
#define KVSIFT_DEVICE __device__
#define KVSIFT_KERNEL __global__
#else
#define KVSIFT_CUDA_COMPILATION() 0
#define KVSIFT_HOST_DEVICE
#define KVSIFT_DEVICE
#define KVSIFT_KERNEL
#endif

#if defined(_OPENMP)
#define KVSIFT_HAS_OPENMP() 1
#else
#define KVSIFT_HAS_OPENMP() 0
#endif

#define KVSIFT_VERSION_MAJOR 0
#define KVSIFT_VERSION_MINOR 1
#define KVSIFT_VERSION_PATCH 0
