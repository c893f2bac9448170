// SPDX-License-Identifier: Apache-2.0
// The methods' kinds on `--backend thrust`: the one-tier method.snapkv.prefill,
// method.pyramidkv.prefill, method.h2o.prefill, method.streaming_llm.prefill,
// method.streaming_llm.decode, method.h2o.decode, method.quest.decode, method.lagkv.prefill,
// method.lagkv.decode, method.dynamickv.prefill (method.quest.select: kinds_thrust.cpp, whose
// per-query-head form is the Thrust components'), and the two-tier method.synckv.decode,
// method.freekv.decode, method.heterocache.prefill (its `scores`, the scorer alone, are the
// Thrust scorer's here) and method.heterocache.decode. Each is the CPU backend's very handler
// body (../method_kinds.hpp, ../two_tier_kinds.hpp) instantiated on the device backend
// (device_backend.hpp): the library's method<thrust::dense_store<float, E> (the two-tier ones:
// thrust::tiered_store<float, E>), Recipe, E> on the runner's device exec (exec::sim_cpp or
// sim_omp; exec::cuda under nvcc), driven through device::staged_method.

#include "device_backend.hpp"
#include "helpers.hpp"

#include <kvsift/thrust/last_query_attention.hpp>

#include <cstdint>
#include <vector>

namespace {
using namespace kvsift::conformance::thrust_kinds;  // kc, handlers_backend
namespace mk = kvsift::conformance::method_kinds;
using mk::device;

const kc::registrar method_snapkv_prefill{handlers_backend, "method.snapkv.prefill",
                                          mk::snapkv_prefill<device>};
const kc::registrar method_pyramidkv_prefill{handlers_backend, "method.pyramidkv.prefill",
                                             mk::pyramidkv_prefill<device>};
const kc::registrar method_h2o_prefill{handlers_backend, "method.h2o.prefill",
                                       mk::h2o_prefill<device>};
const kc::registrar method_streaming_llm_prefill{handlers_backend, "method.streaming_llm.prefill",
                                                 mk::streaming_llm_prefill<device>};
const kc::registrar method_streaming_llm_decode{handlers_backend, "method.streaming_llm.decode",
                                                mk::streaming_llm_decode<device>};
const kc::registrar method_h2o_decode{handlers_backend, "method.h2o.decode",
                                      mk::h2o_decode<device>};
const kc::registrar method_quest_decode{handlers_backend, "method.quest.decode",
                                        mk::quest_decode<device>};
const kc::registrar method_lagkv_prefill{handlers_backend, "method.lagkv.prefill",
                                         mk::lagkv_prefill<device>};
const kc::registrar method_lagkv_decode{handlers_backend, "method.lagkv.decode",
                                        mk::lagkv_decode<device>};
const kc::registrar method_dynamickv_prefill{handlers_backend, "method.dynamickv.prefill",
                                             mk::dynamickv_prefill<device>};

// The two-tier methods' kinds (../two_tier_kinds.hpp) over a thrust::tiered_store<float, E>.
namespace tk = kvsift::conformance::two_tier_kinds;

const kc::registrar method_synckv_decode{handlers_backend, "method.synckv.decode",
                                         tk::synckv_decode<device>};
const kc::registrar method_freekv_decode{handlers_backend, "method.freekv.decode",
                                         tk::freekv_decode<device>};

// method.heterocache.prefill's `scores`: the prefill scorer on its own, Thrust's
// query_attention_scores of the prompt's last query (kernel-pooled with avg, GQA max).
void heterocache_scores(const kc::case_data& c, kc::outputs& out) {
  const auto& k = c.in("keys");
  const auto& q = c.in("query");
  const int h = dim(k, 0), n = dim(k, 1), d = dim(k, 2), hq = dim(q, 0);
  const std::int64_t N = static_cast<std::int64_t>(h) * n;
  std::vector<i32> positions(static_cast<std::size_t>(N));
  for (std::int64_t e = 0; e < N; ++e) positions[static_cast<std::size_t>(e)] = static_cast<i32>(e % n);
  const dvec<float> keys = to_device(k.f32), query = to_device(q.f32);
  const dvec<i32> offsets = to_device(uniform_offsets(h, n)), pos = to_device(positions);
  const dvec<i32> first(1, n - 1);
  const kt::window_queries wq{raw(query), raw(first), 1, h, hq / h};
  dvec<float> scores(static_cast<std::size_t>(N));
  dvec<unsigned char> ws(kt::query_attention_workspace_bytes(N, hq / h, 1));
  kt::query_attention_scores(::thrust::device,
                             kt::segmented_rows<float>{raw(keys), raw(offsets), raw(pos),
                                                       static_cast<std::int64_t>(n) * d, h, d},
                             wq, N, param(c, "kernel"), kvsift::pooling::avg,
                             kvsift::gqa_reduce::max, raw(scores), raw(ws), ws.size());
  out.put_f32("scores", {h, n}, to_host(scores));
}

const kc::registrar method_heterocache_prefill{
    handlers_backend, "method.heterocache.prefill", [](const kc::case_data& c, kc::outputs& out) {
      tk::heterocache_prefill<device>(c, out, heterocache_scores);
    }};
const kc::registrar method_heterocache_decode{handlers_backend, "method.heterocache.decode",
                                              tk::heterocache_decode<device>};

}  // namespace
