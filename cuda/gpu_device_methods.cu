// SPDX-License-Identifier: Apache-2.0
// The library's methods over GPU memory (exec::cuda, include/kvsift/cuda/exec.cuh): every one-tier
// method (full KV, StreamingLLM, H2O, SnapKV, PyramidKV, Quest, LagKV, DynamicKV) as
// method<thrust::dense_store<T, exec::cuda>, Recipe, exec::cuda> (and over a
// thrust::paged_store<T, exec::cuda>, f32), the same device states the
// CPU-only machine proves on exec::sim (tests/thrust/test_device_methods.cpp), and the two-tier
// methods as synckv / heterocache / freekv<T, exec::cuda> over a thrust::tiered_store. Each runs a ragged batch of prompts and
// decode steps (a reset and a new prompt mid-way) beside the same method on exec::host over a
// store::dense / store::tiered, and the test asserts identical plans (positions), attention
// outputs within 2e-5 relative (as the exec::sim tests: the host's vectorised exp and CUDA's expf
// differ in the last bits; the selections never read them), and 0 device-to-host reads on the
// method's arena inside each step (the plan and the output are read back after it). The batches are ragged (their sizes vary), so a step's
// descriptor sizes vary and the arena may allocate; the 0-allocation law is proven with
// fixed-shape steps on exec::sim (tests/thrust/test_device_methods.cpp and its siblings).
//
// Compiled by nvcc for sm_80 and sm_90 in CI (it is the instantiation check of the device path
// under Thrust's CUDA system: every method, f32 and bf16); skips without a device. Ran on an H100
// on 2026-11-28 (docs/gpu-runs/2026-11-28/): passed, memcheck, initcheck and synccheck clean. A
// whole step captured into a CUDA graph: cuda/gpu_capture_probe.cu.

#include <kvsift/cuda/exec.cuh>
#include <kvsift/device/deferred_recall.hpp>
#include <kvsift/device/speculative.hpp>
#include <kvsift/device/evict.hpp>
#include <kvsift/device/sparse_read.hpp>
#include <kvsift/method/any_method.hpp>
#include <kvsift/method/freekv.hpp>
#include <kvsift/method/heterocache.hpp>
#include <kvsift/method/synckv.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/thrust/dense_store.hpp>
#include <kvsift/thrust/paged_store.hpp>
#include <kvsift/thrust/tiered_store.hpp>

#include <cuda_runtime.h>

#include "device_method_params.cuh"

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using E = kvsift::exec::cuda;
using kvsift::nhd;
using kvsift_gpu_test::gpu_present;
using kvsift_gpu_test::random_array;

constexpr kvsift::model_shape shape{2, 8, 2, 32};  // layers, q heads, KV heads, head dim
constexpr int requests = 3;
constexpr int capacity = 128;

// A host array and its copy in the GPU arena.
template <class U>
struct twin {
  std::vector<U> host;
  kvsift::thrust::buffer<U, E> device;
  twin(const E& e, std::vector<U> h) : host(std::move(h)), device(e, host.size()) {
    kvsift::thrust::copy_to_device(e, std::span<const U>(host), device);
  }
};

// The device method DevM beside the host method HostM: prompts, then decode steps of ragged
// batches; plans and outputs must be equal.
template <class T, class HostM, class DevM, class HostStore, class DevStore>
void run_pair(HostStore& hs, DevStore& ds, const E& e, const E& engine,
              const typename HostM::params& hp, const typename DevM::params& dp,
              const std::string& name) {
  INFO(name);
  std::mt19937 rng(7);
  HostM hm(hs, hp);
  DevM dm(ds, dp);
  const int H = shape.kv_heads, Q = shape.q_heads, d = shape.head_dim;
  using space = typename E::memory_space;
  const auto prefill = [&](int r, int n) {
    const auto k = random_array<T>(rng, static_cast<std::size_t>(shape.layers) * n * H * d);
    const auto v = random_array<T>(rng, k.size());
    const auto q = random_array<float>(rng, static_cast<std::size_t>(shape.layers) * n * Q * d);
    twin<T> kd(engine, k), vd(engine, v);
    twin<float> qd(engine, q);
    for (int l = 0; l < shape.layers; ++l) {
      const std::size_t ko = static_cast<std::size_t>(l) * n * H * d;
      const std::size_t qo = static_cast<std::size_t>(l) * n * Q * d;
      hm.prefill(l, kvsift::prefill_chunk<T>{
                        r, kvsift::kv_view<const T, nhd>::contiguous(k.data() + ko, n, H, d),
                        kvsift::kv_view<const T, nhd>::contiguous(v.data() + ko, n, H, d),
                        kvsift::kv_view<const float, nhd>::contiguous(q.data() + qo, n, Q, d), 0,
                        true});
      dm.prefill(l, typename DevM::chunk_type{
                        r, kvsift::kv_view<const T, nhd, space>::contiguous(kd.device.data() + ko, n, H, d),
                        kvsift::kv_view<const T, nhd, space>::contiguous(vd.device.data() + ko, n, H, d),
                        kvsift::kv_view<const float, nhd, space>::contiguous(qd.device.data() + qo, n, Q, d),
                        0, true});
    }
  };
  for (int r = 0; r < requests; ++r) prefill(r, 50 + static_cast<int>(rng() % 40));

  kvsift::thrust::buffer<float, E> out_d(engine, static_cast<std::size_t>(requests) * Q * d);
  std::vector<float> out_h(out_d.size()), out_dh(out_d.size());
  // a step of B < requests writes B rows; the whole buffer is read back, so it starts defined
  // (compute-sanitizer's initcheck reported the unwritten rows' read-back)
  kvsift::thrust::copy_to_device(engine, std::span<const float>(out_h), out_d);
  for (int step = 0; step < 12; ++step) {
    if (step == 5) {  // continuous batching: request 1 ends, a new prompt takes its slot
      hm.reset(1);
      dm.reset(1);
      prefill(1, 50 + static_cast<int>(rng() % 30));
    }
    std::vector<int> batch(requests);
    std::iota(batch.begin(), batch.end(), 0);
    std::shuffle(batch.begin(), batch.end(), rng);
    batch.resize(1 + rng() % requests);
    const std::size_t B = batch.size();
    const auto k = random_array<T>(rng, static_cast<std::size_t>(shape.layers) * B * H * d);
    const auto v = random_array<T>(rng, k.size());
    const auto q = random_array<float>(rng, static_cast<std::size_t>(shape.layers) * B * Q * d);
    twin<T> kd(engine, k), vd(engine, v);
    twin<float> qd(engine, q);
    for (int l = 0; l < shape.layers; ++l) {
      std::vector<kvsift::decode_token<T>> th(B), td(B);
      for (std::size_t i = 0; i < B; ++i) {
        const std::size_t o = static_cast<std::size_t>(l) * B + i;
        th[i] = {batch[i], q.data() + o * Q * d, k.data() + o * H * d, v.data() + o * H * d};
        td[i] = {batch[i], qd.device.data() + o * Q * d, kd.device.data() + o * H * d,
                 vd.device.data() + o * H * d};
      }
      const auto& hplan = hm.decode(l, std::span<const kvsift::decode_token<T>>(th));
      e.arena().reset_counters();
      const auto& dplan = dm.decode(l, std::span<const kvsift::decode_token<T>>(td));
      hm.attend(l, std::span<const kvsift::decode_token<T>>(th), out_h.data());
      dm.attend(l, std::span<const kvsift::decode_token<T>>(td), out_d.data());
      hm.after_attention(l, std::span<const kvsift::decode_token<T>>(th));
      dm.after_attention(l, std::span<const kvsift::decode_token<T>>(td));
      REQUIRE(e.arena().counters().d2h_reads == 0);
      // read back outside the step: positions and outputs equal
      std::vector<std::int32_t> dpos(static_cast<std::size_t>(dplan.size()));
      kvsift::thrust::copy_to_host(e, dplan.positions, std::span<std::int32_t>(dpos));
      REQUIRE(dpos == hplan.positions.values);
      kvsift::thrust::copy_to_host(engine, out_d, std::span<float>(out_dh));
      float worst = 0.0f;
      for (std::size_t i = 0; i < B * Q * d; ++i) {
        worst = std::max(worst, std::abs(out_dh[i] - out_h[i]) / (1.0f + std::abs(out_h[i])));
      }
      CHECK(worst <= 2e-5f);
    }
  }
}

// Over a thrust::dense_store, or a thrust::paged_store (pages of 16, a full cache's pool) when
// DS is one.
template <class T, class DS = kvsift::thrust::dense_store<T, E>>
void one_tier_all(const E& e, const E& engine) {
  const kvsift::method_config c = kvsift_gpu_test::one_tier_config();
  for (const auto& name : kvsift::method_names()) {
    if (!kvsift::detail::is_one_tier_method(name)) continue;
    kvsift::detail::visit_one_tier<DS, E>(name, c, [&]<class DevM>(typename DevM::params dp) {
      kvsift::detail::visit_one_tier<kvsift::store::dense<T>, kvsift::exec::host>(
          name, c, [&]<class HostM>(typename HostM::params hp) {
            kvsift::store::dense<T> hs(shape, requests, capacity);
            if constexpr (std::is_same_v<DS, kvsift::thrust::dense_store<T, E>>) {
              DS ds(e, shape, requests, capacity, /*columns=*/1);
              run_pair<T, HostM, DevM>(hs, ds, e, engine, hp, dp, name);
            } else {
              const int pool = requests * shape.sequences_per_request() * ((capacity + 15) / 16);
              DS ds(e, shape, requests, capacity, 16, pool, /*columns=*/1);
              run_pair<T, HostM, DevM>(hs, ds, e, engine, hp, dp, name);
            }
          });
    });
  }
}

}  // namespace

TEST_CASE("every one-tier method over GPU memory equals the host (exec::cuda)", "[cuda][device]") {
  if (!gpu_present()) SKIP("no CUDA device (cudaGetDeviceCount failed or returned 0)");
  kvsift::thrust::device_arena arena(kvsift::thrust::device_arena::default_max_cached_bytes,
                                     kvsift::thrust::cuda_device_backing());
  kvsift::thrust::device_arena engine_arena(kvsift::thrust::device_arena::default_max_cached_bytes,
                                            kvsift::thrust::cuda_device_backing());
  const E e{arena}, engine{engine_arena};
  one_tier_all<float>(e, engine);
  one_tier_all<kvsift::bfloat16>(e, engine);
}

TEST_CASE("every one-tier method over paged GPU memory equals the host (exec::cuda)",
          "[cuda][device][paged]") {
  if (!gpu_present()) SKIP("no CUDA device (cudaGetDeviceCount failed or returned 0)");
  kvsift::thrust::device_arena arena(kvsift::thrust::device_arena::default_max_cached_bytes,
                                     kvsift::thrust::cuda_device_backing());
  kvsift::thrust::device_arena engine_arena(kvsift::thrust::device_arena::default_max_cached_bytes,
                                            kvsift::thrust::cuda_device_backing());
  const E e{arena}, engine{engine_arena};
  one_tier_all<float, kvsift::thrust::paged_store<float, E>>(e, engine);
}

TEST_CASE("SyncKV over GPU memory equals the host (exec::cuda)", "[cuda][device]") {
  if (!gpu_present()) SKIP("no CUDA device (cudaGetDeviceCount failed or returned 0)");
  kvsift::thrust::device_arena arena(kvsift::thrust::device_arena::default_max_cached_bytes,
                                     kvsift::thrust::cuda_device_backing());
  kvsift::thrust::device_arena engine_arena(kvsift::thrust::device_arena::default_max_cached_bytes,
                                            kvsift::thrust::cuda_device_backing());
  const E e{arena}, engine{engine_arena};
  const auto p = kvsift_gpu_test::synckv_params(shape.layers);
  kvsift::store::tiered<float> hs(shape, requests, capacity);
  kvsift::thrust::tiered_store<float, E> ds(e, shape, requests, capacity, capacity);
  run_pair<float, kvsift::synckv<float>, kvsift::synckv<float, E>>(hs, ds, e, engine, p, p,
                                                                        "synckv");
}

TEST_CASE("HeteroCache and FreeKV over GPU memory equal the host (exec::cuda)", "[cuda][device]") {
  if (!gpu_present()) SKIP("no CUDA device (cudaGetDeviceCount failed or returned 0)");
  kvsift::thrust::device_arena arena(kvsift::thrust::device_arena::default_max_cached_bytes,
                                     kvsift::thrust::cuda_device_backing());
  kvsift::thrust::device_arena engine_arena(kvsift::thrust::device_arena::default_max_cached_bytes,
                                            kvsift::thrust::cuda_device_backing());
  const E e{arena}, engine{engine_arena};
  {  // HeteroCache: head 0 a pivot, head 1 its satellite, a drift check every 2 steps
    const auto p = kvsift_gpu_test::heterocache_params(shape.layers);
    kvsift::store::tiered<float> hs(shape, requests, capacity);
    kvsift::thrust::tiered_store<float, E> ds(e, shape, requests, capacity, capacity);
    run_pair<float, kvsift::heterocache<float>, kvsift::heterocache<float, E>>(
        hs, ds, e, engine, p, p, "heterocache");
  }
  {  // FreeKV: pages of 4, a budget of 8 pages (1 sink, 2 window), every layer sparse
    const auto p = kvsift_gpu_test::freekv_params();
    kvsift::store::tiered<float> hs(shape, requests, capacity, p.page_size);
    kvsift::thrust::tiered_store<float, E> ds(e, shape, requests, capacity, capacity);
    run_pair<float, kvsift::freekv<float>, kvsift::freekv<float, E>>(hs, ds, e, engine, p, p,
                                                                        "freekv");
  }
}
