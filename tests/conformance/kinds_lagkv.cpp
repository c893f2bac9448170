// SPDX-License-Identifier: Apache-2.0
// LagKV kinds (SPEC §5): score.lagkv (one round's scores through score::lag_relative),
// method.lagkv.prefill (kvsift::lagkv fed as SPEC says: the first min(n, S + 2L) tokens, then
// chunks of L) and method.lagkv.decode (that prefill, then decode / attend / after_attention).

#include "runner.hpp"

#include <kvsift/method/lagkv.hpp>
#include <kvsift/store/dense.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {
namespace kc = kvsift::conformance;
using store_t = kvsift::store::dense<float>;

// [H, n, d] -> [n, H, d], the layout prefill chunks arrive in.
std::vector<float> to_nhd(const kc::tensor& t) {
  const auto H = t.dim(0), n = t.dim(1), d = t.dim(2);
  std::vector<float> out(t.f32.size());
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t j = 0; j < n; ++j) {
      std::copy_n(t.f32.data() + (h * n + j) * d, d, out.data() + (j * H + h) * d);
    }
  }
  return out;
}

kvsift::lagkv<store_t>::params params_of(const kc::case_data& c) {
  return kvsift::lagkv_params<store_t>(static_cast<int>(c.param_i("sink")),
                                       static_cast<int>(c.param_i("lag")),
                                       c.param_d("keep_fraction"), c.param_d("value_weight"),
                                       kvsift::score::parse_lag_variant(c.param_s("variant")));
}

// Feeds the prompt as SPEC's method.lagkv.prefill says; the method runs a round after each
// arrival when its trigger fires.
void prefill(kvsift::lagkv<store_t>& m, const kc::case_data& c) {
  const auto& keys = c.in("keys");
  const int H = static_cast<int>(keys.dim(0)), n = static_cast<int>(keys.dim(1)),
            d = static_cast<int>(keys.dim(2));
  const auto k = to_nhd(keys), v = to_nhd(c.in("values"));
  const auto& p = m.parameters().selector;
  int first = 0;
  int chunk = std::min(n, p.sink + 2 * p.lag);
  while (first < n) {
    kvsift::prefill_chunk<float> ch;
    ch.keys = kvsift::kv_view<const float, kvsift::nhd>::contiguous(k.data(), n, H, d)
                  .slice(first, chunk);
    ch.values = kvsift::kv_view<const float, kvsift::nhd>::contiguous(v.data(), n, H, d)
                    .slice(first, chunk);
    ch.first_position = first;
    ch.last = first + chunk == n;
    m.prefill(0, ch);
    first += chunk;
    chunk = std::min(p.lag, n - first);
  }
}

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

const kc::registrar method_lagkv_prefill{
    "method.lagkv.prefill", [](const kc::case_data& c, kc::outputs& out) {
      const auto& keys = c.in("keys");
      const int H = static_cast<int>(keys.dim(0)), n = static_cast<int>(keys.dim(1)),
                d = static_cast<int>(keys.dim(2));
      store_t st({.layers = 1, .q_heads = H, .kv_heads = H, .head_dim = d}, 1, n);
      kvsift::lagkv<store_t> m(st, params_of(c));
      prefill(m, c);
      const int kept = st.length(0, 0, 0);
      std::vector<std::int32_t> pos;
      for (int h = 0; h < H; ++h) {
        if (st.length(0, 0, h) != kept) throw kc::runner_error("heads kept different counts");
        for (int j = 0; j < kept; ++j) pos.push_back(st.position(st.shape().sequence(0, 0, h), j));
      }
      out.put_i32("kept", {H, kept}, pos);
      out.put_i32("base", {1}, {kvsift::lagkv_base(m, 0, 0, 0)});
      out.put_i32("rounds", {1}, {static_cast<std::int32_t>(m.stats().refreshes)});
    }};

const kc::registrar method_lagkv_decode{
    "method.lagkv.decode", [](const kc::case_data& c, kc::outputs& out) {
      const auto& keys = c.in("keys");
      const auto& q = c.in("step_queries");
      const auto& sk = c.in("step_keys");
      const auto& sv = c.in("step_values");
      const int H = static_cast<int>(keys.dim(0)), n = static_cast<int>(keys.dim(1)),
                d = static_cast<int>(keys.dim(2));
      const int T = static_cast<int>(q.dim(0)), Hq = static_cast<int>(q.dim(1));
      store_t st({.layers = 1, .q_heads = Hq, .kv_heads = H, .head_dim = d}, 1, n + T);
      kvsift::lagkv<store_t> m(st, params_of(c));
      prefill(m, c);
      std::vector<std::int32_t> plan, offsets{0}, compressed, base;
      std::vector<float> att(static_cast<std::size_t>(T) * Hq * d);
      for (int t = 0; t < T; ++t) {
        const kvsift::decode_token<float> tok{0,
                                              q.f32.data() + static_cast<std::size_t>(t) * Hq * d,
                                              sk.f32.data() + static_cast<std::size_t>(t) * H * d,
                                              sv.f32.data() + static_cast<std::size_t>(t) * H * d};
        const std::span<const kvsift::decode_token<float>> toks(&tok, 1);
        const auto& pl = m.decode(0, toks);
        for (int h = 0; h < H; ++h) {
          plan.insert(plan.end(), pl.positions[h].begin(), pl.positions[h].end());
          offsets.push_back(static_cast<std::int32_t>(plan.size()));
        }
        m.attend(0, toks, att.data() + static_cast<std::size_t>(t) * Hq * d);
        const auto before = m.stats().refreshes;
        m.after_attention(0, toks);
        compressed.push_back(m.stats().refreshes > before ? 1 : 0);
        base.push_back(kvsift::lagkv_base(m, 0, 0, 0));
      }
      out.put_i32("plan", {static_cast<std::int64_t>(plan.size())}, plan);
      out.put_i32("plan_offsets", {static_cast<std::int64_t>(offsets.size())}, offsets);
      out.put_f32("out", {T, Hq, d}, att);
      out.put_i32("compressed", {T}, compressed);
      out.put_i32("base", {T}, base);
    }};

}  // namespace
