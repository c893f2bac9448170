// SPDX-License-Identifier: Apache-2.0
// score::window_attention (SnapKV, PyramidKV, DynamicKV) gives the bits of its definition: each
// window query's logits by kvsift::dot one key at a time, times 1/sqrt(d), the exact softmax over
// the keys it sees, the past columns averaged over the window, pooled, reduced over the group.
// The scorer computes the logits four query rows per pass over a key (cpu::group_dots_rows, the
// CPU's vector path); a selection needs the same bits from that as from the definition.

#include <kvsift/score/window_attention.hpp>
#include <kvsift/store/dense.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

using namespace kvsift;

namespace {

// The scorer's definition for one (request, KV head), one key at a time.
template <class Store>
std::vector<float> window_scores_by_definition(const Store& st, const float* q, int tokens,
                                               int q_heads, std::int32_t first_position, int h,
                                               const score::window_attention::params& p) {
  const model_shape& sh = st.shape();
  const int G = sh.group_size(), d = sh.head_dim;
  const auto seq = sh.sequence(0, 0, h);
  const int nq = std::min(tokens, p.window);
  const std::int32_t first_q = first_position + (tokens - nq);
  const int past = cpu::visible_slots(st, seq, first_q - 1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> rows(static_cast<std::size_t>(G) * past, 0.0f), pooled(past);
  for (int g = 0; g < G; ++g) {
    std::span<float> acc(rows.data() + static_cast<std::size_t>(g) * past, past);
    for (int i = 0; i < nq; ++i) {
      const float* qv = q + (static_cast<std::size_t>(tokens - nq + i) * q_heads + h * G + g) * d;
      const int visible = cpu::visible_slots(st, seq, first_q + i);
      std::vector<float> probs(visible);
      for (int j = 0; j < visible; ++j) probs[j] = kvsift::dot(qv, st.key(seq, j), d) * scale;
      cpu::softmax(probs);
      for (int j = 0; j < past; ++j) acc[j] += probs[j];
    }
    for (float& x : acc) x /= static_cast<float>(nq);
    cpu::pool1d(acc, pooled, p.kernel, p.pool);
    std::copy(pooled.begin(), pooled.end(), acc.begin());
  }
  std::vector<float> out(past);
  cpu::reduce_group(rows, G, out, p.gqa);
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("window_attention's scores are its definition's bits", "[window_attention]",
                   float, bfloat16) {
  const cpu::simd level = GENERATE(cpu::simd::portable, cpu::simd::avx2, cpu::simd::avx512);
  if (level > cpu::detected_simd()) SKIP("this CPU has no " << cpu::simd_name(level) << " path");
  const cpu::scoped_simd pin(level);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct shape_case { int H, G, d, n, tokens, window; };
  for (const shape_case c : {shape_case{2, 4, 128, 300, 40, 32}, shape_case{1, 5, 24, 150, 9, 16},
                             shape_case{2, 1, 8, 77, 77, 32}, shape_case{1, 3, 20, 260, 3, 8}}) {
    const model_shape sh{.layers = 1, .q_heads = c.H * c.G, .kv_heads = c.H, .head_dim = c.d};
    std::vector<TestType> k(static_cast<std::size_t>(c.n) * c.H * c.d), v(k.size());
    for (auto& x : k) x = from_float<TestType>(2.0f * nd(rng));
    for (auto& x : v) x = from_float<TestType>(nd(rng));
    store::dense<TestType> st(sh, 1, c.n);
    st.append(0, 0, kv_view<const TestType, nhd>::contiguous(k.data(), c.n, c.H, c.d),
              kv_view<const TestType, nhd>::contiguous(v.data(), c.n, c.H, c.d), 0);
    std::vector<float> q(static_cast<std::size_t>(c.tokens) * sh.q_heads * c.d);
    for (float& x : q) x = 2.0f * nd(rng);
    const auto qv = kv_view<const float, nhd>::contiguous(q.data(), c.tokens, sh.q_heads, c.d);
    const std::int32_t first_position = c.n - c.tokens;  // the newest `tokens` of the prompt
    for (const auto gqa : {gqa_reduce::mean, gqa_reduce::max}) {
      const score::window_attention sc{{.window = c.window, .kernel = 5, .pool = pooling::avg, .gqa = gqa}};
      const std::vector<int> req{0};
      const std::vector<std::int32_t> pos{first_position};
      score_input<store::dense<TestType>> in{&st, 0, lifecycle_event::prefill_end, req,
                                             std::span(&qv, 1), pos, {}};
      score_sets got;
      sc.score(in, got);
      for (int h = 0; h < c.H; ++h) {
        const auto want = window_scores_by_definition(st, q.data(), c.tokens, sh.q_heads,
                                                      first_position, h, sc.p);
        REQUIRE(got[h].size() >= want.size());
        for (std::size_t j = 0; j < want.size(); ++j) {
          CAPTURE(c.H, c.G, c.d, c.n, c.tokens, c.window, h, j);
          REQUIRE(std::bit_cast<std::uint32_t>(got[h][j]) == std::bit_cast<std::uint32_t>(want[j]));
        }
      }
    }
  }
}
