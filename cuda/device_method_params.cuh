// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the GPU method tests share (cuda/gpu_device_methods.cu: the methods over exec::cuda
// beside the host; cuda/gpu_capture_probe.cu: each decode step in a CUDA graph): the parameters
// they give each method, for a model of `layers` layers with 2 KV heads, and two helpers.

#include <kvsift/method/any_method.hpp>
#include <kvsift/method/freekv.hpp>
#include <kvsift/method/heterocache.hpp>
#include <kvsift/method/synckv.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <random>
#include <vector>

namespace kvsift_gpu_test {

inline bool gpu_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// n values drawn from N(0, 1), rounded to T.
template <class T>
std::vector<T> random_array(std::mt19937& rng, std::size_t n) {
  std::vector<T> out(n);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& x : out) x = static_cast<T>(dist(rng));
  return out;
}

// The one-tier methods by name (detail::visit_one_tier): 40 tokens a head-sequence, so that
// SnapKV's and PyramidKV's paper window (32) fits; StreamingLLM's sink 4; LagKV's lag 8.
inline kvsift::method_config one_tier_config() {
  kvsift::method_config c;
  c.budget = 40;
  c.options["sink"] = 4;
  c.options["lag"] = 8;
  return c;
}

// SyncKV: one cluster whose representative is head 0, a refresh every 2 steps.
inline kvsift::synckv<float>::params synckv_params(int layers) {
  kvsift::synckv<float>::params p{.clusters = 1, .stride = 2, .rho = 0.5, .memory_fraction = 0.75};
  p.roles.assign(static_cast<std::size_t>(layers), kvsift::select::cluster_roles{});
  for (auto& r : p.roles) {
    r.assign = {0, 0};
    r.representatives = {0};
  }
  return p;
}

// HeteroCache: head 0 a pivot, head 1 its satellite, a drift check every 2 steps.
inline kvsift::heterocache<float>::params heterocache_params(int layers) {
  kvsift::heterocache<float>::params p;
  p.drift_window = 2;
  p.rho = 0.75;
  for (int l = 0; l < layers; ++l) {
    kvsift::heterocache_recipe::layer_roles r;
    r.roles = {kvsift::calibrate::head_role::pivot, kvsift::calibrate::head_role::satellite};
    r.leader = {0, 0};
    r.stability = {1.0f, 1.0f};
    p.roles.push_back(r);
  }
  return p;
}

// FreeKV: pages of 4, a budget of 8 pages (1 sink, 2 window), every layer sparse.
inline kvsift::freekv<float>::params freekv_params() {
  return {.page_size = 4, .budget = 32, .sink = 4, .window = 8, .tau = 0.8, .dense_layers = 0};
}

}  // namespace kvsift_gpu_test
