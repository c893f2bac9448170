// store.row_addresses over H2O's whole-cache plan after N decode steps (8 KV heads, 257 slots each),
// on the caller's thread (results.txt, item 4). Built like ../2026-11-29d/h2o-step.cpp; ./rowaddr STEPS
#include "common.hpp"
#include <kvsift/kvsift.hpp>
#include <chrono>
#include <cstdio>
#include <algorithm>
using namespace kvbench;
int main(int argc, char** argv) {
  using T = kvsift::bfloat16;
  using S = kvsift::store::paged<T>;
  const model& m = llama31_8b; const int n = 1024, b = 256, r = 1, page = 16, layer = 16;
  int steps = atoi(argv[1]);
  S store(m.shape(), r, page, r * m.kv_heads * ((n + 4096 + page - 1) / page + 1));
  auto meth = std::make_optional<kvsift::h2o<S>>(store, kvsift::h2o_params<S>(b));
  auto ck = random_vector<T>(size_t(n) * m.kv_heads * m.head_dim, 21), cv = random_vector<T>(ck.size(), 22);
  auto cq = random_vector<float>(size_t(n) * m.q_heads * m.head_dim, 23);
  std::vector<kvsift::prefill_chunk<T>> ch{{0, kvsift::kv_view<const T, kvsift::nhd>::contiguous(ck.data(), n, m.kv_heads, m.head_dim),
    kvsift::kv_view<const T, kvsift::nhd>::contiguous(cv.data(), n, m.kv_heads, m.head_dim),
    kvsift::kv_view<const float, kvsift::nhd>::contiguous(cq.data(), n, m.q_heads, m.head_dim), 0, true}};
  meth->prefill(layer, ch);
  auto dk = random_vector<T>(size_t(m.kv_heads) * m.head_dim, 24), dv = random_vector<T>(dk.size(), 25);
  auto dq = random_vector<float>(size_t(m.q_heads) * m.head_dim, 26); std::vector<float> out(dq.size());
  std::vector<kvsift::decode_token<T>> tok{{0, dq.data(), dk.data(), dv.data()}};
  std::span<const kvsift::decode_token<T>> t(tok);
  kvsift::cpu::scoped_threading sc(kvsift::cpu::threading::caller);
  for (int i = 0; i < steps; ++i) { meth->decode(layer, t); meth->attend(layer, t, out.data()); meth->after_attention(layer, t); }
  const auto& plan = meth->decode(layer, t);
  std::vector<const T*> kr(4096), vr(4096);
  std::vector<double> ts;
  for (int rep = 0; rep < 2000; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int h = 0; h < m.kv_heads; ++h) store.row_addresses(m.shape().sequence(0, layer, h), plan.slots[h], kr.data(), vr.data());
    ts.push_back((std::chrono::steady_clock::now() - t0).count() * 1e-3);
  }
  std::sort(ts.begin(), ts.end());
  printf("steps %d: row_addresses for 8 heads (%d slots each): median %.3f us, p10 %.3f\n", steps, int(plan.slots[0].size()), ts[ts.size()/2], ts[ts.size()/10]);
}
