// SPDX-License-Identifier: Apache-2.0
// Uses the installed kvsift::cuda target: the CUDA backend's headers compile with nvcc against
// the installed package. Sizing a top-k asks CUB about the device: without one it reports the
// cuda_error and still exits 0 (the build is what this consumer checks).
#include <kvsift/cuda/all.cuh>

#include <cstdio>
#include <exception>

int main() {
  try {
    const auto bytes = kvsift::cuda::segmented_topk_workspace_bytes<float>(1024, 4, 64);
    std::printf("kvsift consumer (cuda): top-k workspace %zu bytes\n", bytes);
    return bytes > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("kvsift consumer (cuda): no usable device (%s)\n", e.what());
    return 0;
  }
}
