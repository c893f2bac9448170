// SPDX-License-Identifier: Apache-2.0
// Every method's whole decode step — decode + attend + after_attention over every layer —
// captured into a CUDA graph in global mode (where an allocation, a host synchronisation or a
// copy from pageable memory fails the capture) and launched: the graph's plans and outputs must
// equal the host's. Each of 64 steps is captured afresh and launched once, so this shows the
// capture rules R1 (no allocation after warm-up) and R2 (no host synchronisation) on a GPU for
// all eleven methods; not R3 (one graph replayed with each next step's data: that needs the
// step's descriptors written by the host into fixed device-visible buffers before each replay,
// issue 28). On an H100 (2026-11-28, docs/gpu-runs/2026-11-28/) all eleven captured 64 of 64
// steps equal to the host, and memcheck found no error.
//
// The exec is exec::cuda (Thrust's par_nosync on one stream over a device arena) with one
// change a capture needs: h2d copies through a pinned staging area, since a stream capture
// refuses a copy from pageable memory; the area is reset once the step's launch has been
// synchronised. Skips without a device.

#include <kvsift/cuda/exec.cuh>
#include <kvsift/cuda/memory.cuh>
#include <kvsift/device/deferred_recall.hpp>
#include <kvsift/device/evict.hpp>
#include <kvsift/device/sparse_read.hpp>
#include <kvsift/device/speculative.hpp>
#include <kvsift/method/any_method.hpp>
#include <kvsift/method/freekv.hpp>
#include <kvsift/method/heterocache.hpp>
#include <kvsift/method/synckv.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/thrust/dense_store.hpp>
#include <kvsift/thrust/tiered_store.hpp>

#include <thrust/system/cuda/execution_policy.h>

#include <cuda_runtime.h>

#include "device_method_params.cuh"

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

// exec::cuda with h2d through pinned staging (see the file comment).
struct capture_exec : kvsift::exec::cuda {
  capture_exec(kvsift::thrust::device_arena& arena, cudaStream_t stream, std::byte* staging,
               std::size_t staging_bytes)
      : kvsift::exec::cuda(arena, stream), staging_(staging), staging_bytes_(staging_bytes) {}

  void h2d(void* dst, const void* src, std::size_t bytes) const {
    if (bytes == 0) return;
    const std::size_t at = (*used_ + 255) / 256 * 256;
    if (at + bytes > staging_bytes_) throw std::runtime_error("capture_exec: staging area full");
    std::memcpy(staging_ + at, src, bytes);
    *used_ = at + bytes;
    kvsift::cuda::check(
        cudaMemcpyAsync(dst, staging_ + at, bytes, cudaMemcpyHostToDevice, stream()),
        "capture_exec::h2d");
  }
  // Only after the stream has finished every copy from the staging area.
  void reset_staging() const { *used_ = 0; }

 private:
  std::byte* staging_;
  std::size_t staging_bytes_;
  std::shared_ptr<std::size_t> used_ = std::make_shared<std::size_t>(0);
};
static_assert(kvsift::thrust::DeviceExec<capture_exec>);

using E = capture_exec;
using kvsift::nhd;
using kvsift_gpu_test::gpu_present;
using kvsift_gpu_test::random_array;

constexpr kvsift::model_shape shape{2, 8, 2, 32};
constexpr int requests = 3;
constexpr int capacity = 160;
constexpr int steps = 64;

struct probe_result {
  int captured = 0;
  std::string error;
};

// Prompts (uncaptured), two warm-up steps, then `steps` steps each captured and launched; every
// request decodes every step, in a fixed order. Returns how many steps were captured and the
// first capture error (the caller requires none).
template <class T, class HostM, class DevM, class HostStore, class DevStore>
probe_result probe(HostStore& hs, DevStore& ds, const E& e, const E& engine,
                   const typename HostM::params& hp, const typename DevM::params& dp,
                   const std::string& name) {
  INFO(name);
  probe_result res;
  std::mt19937 rng(11);
  HostM hm(hs, hp);
  DevM dm(ds, dp);
  const int H = shape.kv_heads, Q = shape.q_heads, d = shape.head_dim;
  using space = typename E::memory_space;
  const cudaStream_t st = e.stream();
  for (int r = 0; r < requests; ++r) {
    const int n = 60 + 5 * r;
    const auto k = random_array<T>(rng, static_cast<std::size_t>(shape.layers) * n * H * d);
    const auto v = random_array<T>(rng, k.size());
    const auto q = random_array<float>(rng, static_cast<std::size_t>(shape.layers) * n * Q * d);
    kvsift::thrust::buffer<T, E> kd(engine, k.size()), vd(engine, v.size());
    kvsift::thrust::buffer<float, E> qd(engine, q.size());
    kvsift::thrust::copy_to_device(engine, std::span<const T>(k), kd);
    kvsift::thrust::copy_to_device(engine, std::span<const T>(v), vd);
    kvsift::thrust::copy_to_device(engine, std::span<const float>(q), qd);
    for (int l = 0; l < shape.layers; ++l) {
      const std::size_t ko = static_cast<std::size_t>(l) * n * H * d;
      const std::size_t qo = static_cast<std::size_t>(l) * n * Q * d;
      hm.prefill(l, kvsift::prefill_chunk<T>{
                        r, kvsift::kv_view<const T, nhd>::contiguous(k.data() + ko, n, H, d),
                        kvsift::kv_view<const T, nhd>::contiguous(v.data() + ko, n, H, d),
                        kvsift::kv_view<const float, nhd>::contiguous(q.data() + qo, n, Q, d), 0,
                        true});
      dm.prefill(l, typename DevM::chunk_type{
                        r, kvsift::kv_view<const T, nhd, space>::contiguous(kd.data() + ko, n, H, d),
                        kvsift::kv_view<const T, nhd, space>::contiguous(vd.data() + ko, n, H, d),
                        kvsift::kv_view<const float, nhd, space>::contiguous(qd.data() + qo, n, Q, d),
                        0, true});
    }
    kvsift::cuda::check(cudaStreamSynchronize(st), "probe prefill");
    e.reset_staging();
    engine.reset_staging();
  }
  // the engine's activations: fixed buffers, refilled before each step
  const std::size_t B = requests;
  const std::size_t kv_n = static_cast<std::size_t>(shape.layers) * B * H * d;
  const std::size_t q_n = static_cast<std::size_t>(shape.layers) * B * Q * d;
  kvsift::thrust::buffer<T, E> kd(engine, kv_n), vd(engine, kv_n);
  kvsift::thrust::buffer<float, E> qd(engine, q_n);
  kvsift::thrust::buffer<float, E> out_d(engine, static_cast<std::size_t>(shape.layers) * B * Q * d);
  std::vector<float> out_h(out_d.size()), out_dh(out_d.size());
  std::vector<std::vector<std::int32_t>> hpos(shape.layers);
  std::vector<kvsift::cuda::device_buffer<std::int32_t>> plan_pos;
  for (int l = 0; l < shape.layers; ++l) {
    plan_pos.emplace_back(static_cast<std::size_t>(requests) * H * capacity);
  }
  for (int step = 0; step < steps + 2; ++step) {
    const auto k = random_array<T>(rng, kv_n);
    const auto v = random_array<T>(rng, kv_n);
    const auto q = random_array<float>(rng, q_n);
    kvsift::thrust::copy_to_device(engine, std::span<const T>(k), kd);
    kvsift::thrust::copy_to_device(engine, std::span<const T>(v), vd);
    kvsift::thrust::copy_to_device(engine, std::span<const float>(q), qd);
    kvsift::cuda::check(cudaStreamSynchronize(st), "probe inputs");
    e.reset_staging();
    engine.reset_staging();
    const bool capture = step >= 2;
    cudaGraph_t graph = nullptr;
    if (capture) {
      kvsift::cuda::check(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "begin capture");
    }
    std::string failed;
    std::vector<std::size_t> dsize(shape.layers);
    try {
      for (int l = 0; l < shape.layers; ++l) {
        std::vector<kvsift::decode_token<T>> th(B), td(B);
        for (std::size_t i = 0; i < B; ++i) {
          const std::size_t o = static_cast<std::size_t>(l) * B + i;
          th[i] = {static_cast<int>(i), q.data() + o * Q * d, k.data() + o * H * d,
                   v.data() + o * H * d};
          td[i] = {static_cast<int>(i), qd.data() + o * Q * d, kd.data() + o * H * d,
                   vd.data() + o * H * d};
        }
        const auto& dplan = dm.decode(l, std::span<const kvsift::decode_token<T>>(td));
        // the plan's positions, copied inside the step (the next layer's plan reuses its buffers)
        dsize[l] = static_cast<std::size_t>(dplan.size());
        kvsift::cuda::check(cudaMemcpyAsync(plan_pos[l].data(), dplan.positions,
                                            dsize[l] * sizeof(std::int32_t),
                                            cudaMemcpyDeviceToDevice, st),
                            "plan positions");
        dm.attend(l, std::span<const kvsift::decode_token<T>>(td),
                  out_d.data() + static_cast<std::size_t>(l) * B * Q * d);
        dm.after_attention(l, std::span<const kvsift::decode_token<T>>(td));
        const auto& hplan = hm.decode(l, std::span<const kvsift::decode_token<T>>(th));
        hpos[l] = hplan.positions.values;
        hm.attend(l, std::span<const kvsift::decode_token<T>>(th),
                  out_h.data() + static_cast<std::size_t>(l) * B * Q * d);
        hm.after_attention(l, std::span<const kvsift::decode_token<T>>(th));
      }
    } catch (const std::exception& ex) {
      failed = ex.what();
    }
    if (capture) {
      const cudaError_t end = cudaStreamEndCapture(st, &graph);
      if (failed.empty() && end != cudaSuccess) {
        failed = std::string("cudaStreamEndCapture: ") + cudaGetErrorName(end);
      }
      (void)cudaGetLastError();
      if (!failed.empty()) {
        if (graph != nullptr) cudaGraphDestroy(graph);
        res.error = "step " + std::to_string(step - 2) + ": " + failed;
        return res;  // the device method's state is no longer the host's
      }
      cudaGraphExec_t exec = nullptr;
      kvsift::cuda::check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
      kvsift::cuda::check(cudaGraphLaunch(exec, st), "launch");
      kvsift::cuda::check(cudaStreamSynchronize(st), "graph");
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    } else {
      REQUIRE(failed.empty());
    }
    kvsift::cuda::check(cudaStreamSynchronize(st), "step");
    e.reset_staging();
    for (int l = 0; l < shape.layers; ++l) {
      std::vector<std::int32_t> dpos(dsize[l]);
      kvsift::cuda::check(cudaMemcpy(dpos.data(), plan_pos[l].data(),
                                     dpos.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost),
                          "positions");
      REQUIRE(dpos == hpos[l]);
    }
    kvsift::thrust::copy_to_host(engine, out_d, std::span<float>(out_dh));
    float worst = 0.0f;
    for (std::size_t i = 0; i < out_h.size(); ++i) {
      worst = std::max(worst, std::abs(out_dh[i] - out_h[i]) / (1.0f + std::abs(out_h[i])));
    }
    REQUIRE(worst <= 2e-5f);
    if (capture) ++res.captured;
  }
  return res;
}

struct rig {
  kvsift::cuda::stream stream;
  kvsift::cuda::pinned_buffer<std::byte> staging{std::size_t{16} << 20};
  kvsift::cuda::pinned_buffer<std::byte> engine_staging{std::size_t{16} << 20};
  kvsift::thrust::device_arena arena{kvsift::thrust::device_arena::default_max_cached_bytes,
                                     kvsift::thrust::cuda_device_backing()};
  kvsift::thrust::device_arena engine_arena{kvsift::thrust::device_arena::default_max_cached_bytes,
                                            kvsift::thrust::cuda_device_backing()};
  E e{arena, stream.get(), staging.data(), staging.size()};
  E engine{engine_arena, stream.get(), engine_staging.data(), engine_staging.size()};
};

void report(const std::string& name, const probe_result& r) {
  std::printf("capture probe: %-14s %2d of %d steps captured and equal to the host%s%s\n",
              name.c_str(), r.captured, steps, r.error.empty() ? "" : "; stopped at ",
              r.error.c_str());
  std::fflush(stdout);
  INFO(name);
  CHECK(r.error.empty());
  CHECK(r.captured == steps);
}

}  // namespace

TEST_CASE("every method's decode step captured in a CUDA graph equals the host", "[cuda][capture]") {
  if (!gpu_present()) SKIP("no CUDA device");
  const kvsift::method_config c = kvsift_gpu_test::one_tier_config();
  for (const auto& name : kvsift::method_names()) {
    if (!kvsift::detail::is_one_tier_method(name)) continue;
    rig g;
    using DS = kvsift::thrust::dense_store<float, E>;
    kvsift::detail::visit_one_tier<DS, E>(name, c, [&]<class DevM>(typename DevM::params dp) {
      kvsift::detail::visit_one_tier<kvsift::store::dense<float>, kvsift::exec::host>(
          name, c, [&]<class HostM>(typename HostM::params hp) {
            kvsift::store::dense<float> hs(shape, requests, capacity);
            DS ds(g.e, shape, requests, capacity, /*columns=*/1);
            report(name, probe<float, HostM, DevM>(hs, ds, g.e, g.engine, hp, dp, name));
          });
    });
  }
  {
    rig g;
    const auto p = kvsift_gpu_test::synckv_params(shape.layers);
    kvsift::store::tiered<float> hs(shape, requests, capacity);
    kvsift::thrust::tiered_store<float, E> ds(g.e, shape, requests, capacity, capacity);
    report("synckv", probe<float, kvsift::synckv<float>, kvsift::synckv<float, E>>(
                         hs, ds, g.e, g.engine, p, p, "synckv"));
  }
  {
    rig g;
    const auto p = kvsift_gpu_test::heterocache_params(shape.layers);
    kvsift::store::tiered<float> hs(shape, requests, capacity);
    kvsift::thrust::tiered_store<float, E> ds(g.e, shape, requests, capacity, capacity);
    report("heterocache", probe<float, kvsift::heterocache<float>, kvsift::heterocache<float, E>>(
                              hs, ds, g.e, g.engine, p, p, "heterocache"));
  }
  {
    rig g;
    const auto p = kvsift_gpu_test::freekv_params();
    kvsift::store::tiered<float> hs(shape, requests, capacity, p.page_size);
    kvsift::thrust::tiered_store<float, E> ds(g.e, shape, requests, capacity, capacity);
    report("freekv", probe<float, kvsift::freekv<float>, kvsift::freekv<float, E>>(
                         hs, ds, g.e, g.engine, p, p, "freekv"));
  }
}
