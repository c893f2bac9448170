// SPDX-License-Identifier: Apache-2.0
// The nvcc half of the mixed program: includes the same kvsift core header as mixed_main.cpp
// plus the CUDA backend, and exposes plain C++ functions the g++ half calls.

#include <kvsift/core/element.hpp>
#include <kvsift/cuda/all.cuh>

#include <cstdint>
#include <string>

namespace {

// A kernel using the shared element conversions on the device.
__global__ void round_trip_bf16(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    out[i] = kvsift::to_float(kvsift::from_float<kvsift::bfloat16>(in[i]));
  }
}

}  // namespace

// Converts through bfloat16 in device code as compiled for the host side of this TU (the
// KVSIFT_HOST_DEVICE functions are the same code on host and device).
std::uint16_t mixed_bf16_bits_from_nvcc(float x) { return kvsift::bfloat16(x).bits; }

// Runs a tiny kernel when a device exists; otherwise reports why not (never throws).
std::string mixed_device_report() {
  const int n = kvsift::cuda::device_count();
  if (n == 0) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    (void)cudaGetLastError();
    return std::string("no CUDA device (") + cudaGetErrorName(e) + ")";
  }
  try {
    kvsift::cuda::device_buffer<float> in(4), out(4);
    const float host[4] = {1.0f, 3.14159f, -2.5f, 65504.0f};
    float back[4] = {};
    kvsift::cuda::check(cudaMemcpy(in.data(), host, sizeof host, cudaMemcpyHostToDevice), "mixed");
    round_trip_bf16<<<1, 32>>>(in.data(), out.data(), 4);
    kvsift::cuda::check_launch("mixed");
    kvsift::cuda::check(cudaMemcpy(back, out.data(), sizeof back, cudaMemcpyDeviceToHost), "mixed");
    return std::to_string(n) + " CUDA device(s); bf16(3.14159) on device = " +
           std::to_string(back[1]);
  } catch (const kvsift::cuda_error& e) {
    return e.what();
  }
}
