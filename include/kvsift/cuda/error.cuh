// SPDX-License-Identifier: Apache-2.0
#pragma once

// CUDA errors as exceptions. Every kvsift::cuda entry point that calls the runtime checks the
// returned code and throws kvsift::cuda_error carrying the CUDA error name and string.

#include <kvsift/core/config.hpp>

#if !KVSIFT_CUDA_COMPILATION()
#error "kvsift/cuda/*.cuh need nvcc (__CUDACC__); the CPU and Thrust headers do not"
#endif

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace kvsift {

// Thrown when the CUDA runtime reports an error. `code()` is the cudaError_t; what() reads
// "kvsift: <where>: CUDA error <name>: <string>".
class cuda_error : public std::runtime_error {
 public:
  cuda_error(cudaError_t code, std::string_view where)
      : std::runtime_error(make_message(code, where)), code_(code) {}
  [[nodiscard]] cudaError_t code() const noexcept { return code_; }

 private:
  static std::string make_message(cudaError_t code, std::string_view where) {
    std::string m = "kvsift: ";
    m += where;
    m += ": CUDA error ";
    m += cudaGetErrorName(code);
    m += ": ";
    m += cudaGetErrorString(code);
    return m;
  }
  cudaError_t code_;
};

namespace cuda {

// Throws cuda_error(code, where) unless code == cudaSuccess. Clears the sticky last error so a
// caught failure does not resurface at the next cudaGetLastError.
inline void check(cudaError_t code, std::string_view where) {
  if (code != cudaSuccess) {
    (void)cudaGetLastError();
    throw cuda_error(code, where);
  }
}

// Checks the launch of the kernel just enqueued (configuration errors only; asynchronous
// faults surface at the next synchronising call).
inline void check_launch(std::string_view where) { check(cudaGetLastError(), where); }

// Number of usable CUDA devices; 0 (never an exception) when there is no driver or device.
[[nodiscard]] inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace cuda
}  // namespace kvsift
