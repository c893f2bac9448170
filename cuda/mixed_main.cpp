// SPDX-License-Identifier: Apache-2.0
// The g++ half of the mixed program: includes kvsift's host headers only (no CUDA on its
// include path is needed) and links against the nvcc-compiled mixed_device.cu. Proves that the
// shared headers give the same results under both compilers and that one executable can hold
// both. Runs without a GPU.

#include <kvsift/core/config.hpp>
#include <kvsift/core/element.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

static_assert(KVSIFT_CUDA_COMPILATION() == 0, "this file must be compiled by the host compiler");

std::uint16_t mixed_bf16_bits_from_nvcc(float x);
std::string mixed_device_report();

int main() {
  const float x = 3.14159f;
  const std::uint16_t host_bits = kvsift::bfloat16(x).bits;
  const std::uint16_t nvcc_bits = mixed_bf16_bits_from_nvcc(x);
  std::printf("kvsift mixed g++/nvcc program\n");
  std::printf("  bf16(%g): g++ bits 0x%04x, nvcc bits 0x%04x\n", static_cast<double>(x),
              static_cast<unsigned>(host_bits), static_cast<unsigned>(nvcc_bits));
  std::printf("  device: %s\n", mixed_device_report().c_str());
  return host_bits == nvcc_bits ? 0 : 1;
}
