// SPDX-License-Identifier: Apache-2.0
#pragma once

// exec::cuda — the device path on a GPU: the same device states, stores and buffers as
// exec::sim (they are written against thrust::DeviceExec), over GPU memory and Thrust's CUDA
// system on one stream.
//
//   kvsift::thrust::device_arena arena(kvsift::thrust::device_arena::default_max_cached_bytes,
//                                      kvsift::thrust::cuda_device_backing());
//   kvsift::exec::cuda e{arena, stream};
//   kvsift::thrust::dense_store<float, kvsift::exec::cuda> st(e, shape, requests, capacity, 1);
//   kvsift::snapkv<kvsift::thrust::dense_store<float, kvsift::exec::cuda>, kvsift::exec::cuda> m(st, p);
//
// Memory: every buffer and Thrust's temporary storage come from the arena (cudaMalloc behind a
// cache of freed blocks, the same counters as exec::sim's), so after a warm-up step a decode
// step allocates nothing. Copies: h2d is cudaMemcpyAsync on the stream (from pageable memory the
// call returns once the source was read); d2h is cudaMemcpyAsync followed by a synchronisation
// of the stream (the host reads the result next). Both are counted by the arena, so the capture
// laws proven on exec::sim (0 allocations, 0 D2H reads per step) are the same counters here.
//
// Capture: with h2d through pinned memory instead of pageable (the exec in
// cuda/gpu_capture_probe.cu), every method's whole decode step captures into a CUDA graph in
// global mode (no allocation, no synchronisation inside it) and the launched graph equals the
// host: all eleven, 64 steps each, on an H100 (2026-11-28). What this exec does not do yet
// (issue "GPU: the cuda policy on an H100"): replay one captured graph with each next step's data
// (the step's descriptors would have to be written by the host into fixed pinned buffers before
// each replay, and the host planning part and the device part of a step are one call); the
// tiered store's host pool lives in the arena (device memory), not in pinned, mapped host memory;
// the recall runs on the compute stream, not a copy stream with events.
// Compiled by nvcc only (it includes the CUDA runtime and Thrust's CUDA system).

#include <kvsift/core/memory_space.hpp>
#include <kvsift/cuda/error.cuh>
#include <kvsift/thrust/exec.hpp>

#include <thrust/system/cuda/execution_policy.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string_view>

namespace kvsift::thrust {

// A device_arena's blocks from cudaMalloc / cudaFree (256-aligned, as cudaMalloc's are).
namespace detail {
inline void* cuda_allocate(std::size_t bytes) {
  void* p = nullptr;
  kvsift::cuda::check(cudaMalloc(&p, bytes), "thrust::device_arena (cudaMalloc)");
  return p;
}
inline void cuda_release(void* p) noexcept { (void)cudaFree(p); }
}  // namespace detail
inline memory_backing cuda_device_backing() {
  return {&detail::cuda_allocate, &detail::cuda_release};
}

}  // namespace kvsift::thrust

namespace kvsift::exec {

// A GPU: Thrust's CUDA system on `stream` over a device_arena with cuda_device_backing().
// Models thrust::DeviceExec; copyable (a pointer to the arena, which must outlive it, and the
// stream, which the caller owns).
struct cuda {
  using memory_space = device_space;
  static constexpr bool host_visible = false;
  static constexpr std::string_view name = "cuda";

  explicit cuda(kvsift::thrust::device_arena& arena, cudaStream_t stream = nullptr)
      : arena_(&arena), stream_(stream) {}

  // Where a device_arena for this exec takes its blocks from (cudaMalloc).
  static kvsift::thrust::memory_backing backing() { return kvsift::thrust::cuda_device_backing(); }
  [[nodiscard]] kvsift::thrust::device_arena& arena() const { return *arena_; }
  [[nodiscard]] cudaStream_t stream() const { return stream_; }
  // Thrust's CUDA par_nosync with the arena's allocator, on the stream: no algorithm
  // synchronises the stream unless it returns a value to the host (a stream capture would
  // refuse the synchronisation `par` makes after some algorithms). Thrust's temporary storage
  // goes back to the arena while the stream may still use it; the arena hands a block out again
  // only on the same stream (stream order), or frees it with cudaFree, which waits for the device.
  [[nodiscard]] auto policy() const {
    return ::thrust::cuda::par_nosync(arena_->allocator()).on(stream_);
  }
  void h2d(void* dst, const void* src, std::size_t bytes) const {
    if (bytes == 0) return;
    kvsift::cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
                        "exec::cuda::h2d");
  }
  void d2h(void* dst, const void* src, std::size_t bytes) const {
    if (bytes == 0) return;
    kvsift::cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
                        "exec::cuda::d2h");
    kvsift::cuda::check(cudaStreamSynchronize(stream_), "exec::cuda::d2h");
  }

 private:
  kvsift::thrust::device_arena* arena_;
  cudaStream_t stream_;
};

}  // namespace kvsift::exec
