// SPDX-License-Identifier: Apache-2.0
#pragma once

// The CUDA execution policy: which stream an algorithm enqueues on. Algorithms never
// synchronise the stream themselves; results are ready once the stream reaches them.
//
//   kvsift::cuda::par{stream}   // enqueue on `stream`
//   kvsift::cuda::par{}         // the legacy default stream (0)

#include <kvsift/cuda/error.cuh>

#include <cuda_runtime_api.h>

namespace kvsift::cuda {

// A POD policy object carrying a stream; cheap to copy, safe to capture in a CUDA graph.
struct par {
  cudaStream_t stream = nullptr;
  // Returns a policy enqueueing on `s` (Thrust style: par.on(s)).
  [[nodiscard]] constexpr par on(cudaStream_t s) const noexcept { return par{s}; }
  // Blocks the host until every operation enqueued on the stream so far completed.
  void synchronize() const { check(cudaStreamSynchronize(stream), "cuda::par::synchronize"); }
};

}  // namespace kvsift::cuda
