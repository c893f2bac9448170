// SPDX-License-Identifier: Apache-2.0
// LagKV kinds (SPEC §5) on the CPU backend: score.lagkv (one round's scores through
// score::lag_relative, host code; its Thrust handler is thrust/kinds_thrust.cpp's), and
// method.lagkv.prefill / method.lagkv.decode: method_kinds.hpp's bodies on host_backend
// (kvsift::lagkv over a store::dense<float>; the Thrust runners run the same bodies on the
// device, thrust/kinds_thrust_methods.cpp).

#include "method_kinds.hpp"
#include "runner.hpp"

#include <kvsift/score/lag.hpp>
#include <kvsift/store/dense.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {
namespace kc = kvsift::conformance;
using store_t = kvsift::store::dense<float>;

using kc::method_kinds::detail::to_nhd;
using host = kc::method_kinds::host_backend;

const kc::registrar score_lagkv{
    "score.lagkv", [](const kc::case_data& c, kc::outputs& out) {
      const auto& keys = c.in("keys");
      const int H = static_cast<int>(keys.dim(0)), n = static_cast<int>(keys.dim(1)),
                d = static_cast<int>(keys.dim(2));
      const int base = static_cast<int>(c.param_i("base"));
      const auto variant = kvsift::score::parse_lag_variant(c.param_s("variant"));
      store_t st({.layers = 1, .q_heads = H, .kv_heads = H, .head_dim = d}, 1, n);
      const auto k = to_nhd(keys), v = to_nhd(c.in("values"));
      st.append(0, 0, kvsift::kv_view<const float, kvsift::nhd>::contiguous(k.data(), n, H, d),
                kvsift::kv_view<const float, kvsift::nhd>::contiguous(v.data(), n, H, d), 0);
      kvsift::score::lag_relative sc{{.sink = 1,  // the case's base is the frozen prefix
                                      .lag = static_cast<int>(c.param_i("lag")),
                                      .value_weight = c.param_d("value_weight"),
                                      .variant = variant}};
      sc.validate("score.lagkv");
      const std::vector<int> requests{0};
      const std::vector<int> frozen(static_cast<std::size_t>(H), base);
      kvsift::score_input<store_t> in{
          &st, 0, kvsift::lifecycle_event::prefill_end, requests, {}, {}, frozen};
      kvsift::score_sets s, sk, sv;
      sc.score(in, s, &sk, &sv);
      const int P = sc.partitions(n, base);
      const int m = P >= 2 ? (P - 1) * sc.p.lag : 0;
      const auto slice = [&](const kvsift::score_sets& x) {
        std::vector<float> r;
        for (int h = 0; h < H; ++h) r.insert(r.end(), x[h].begin() + base, x[h].begin() + base + m);
        return r;
      };
      out.put_f32("scores", {H, m}, slice(s));
      if (variant != kvsift::score::lag_variant::knorm) {
        out.put_f32("score_k", {H, m}, slice(sk));
        out.put_f32("score_v", {H, m}, slice(sv));
      }
    }};

const kc::registrar method_lagkv_prefill{"method.lagkv.prefill",
                                         kc::method_kinds::lagkv_prefill<host>};
const kc::registrar method_lagkv_decode{"method.lagkv.decode", kc::method_kinds::lagkv_decode<host>};

}  // namespace
