// full_kv decode step at 32K split into phases (decode / attend / after_attention), the attend
// alternating between the method and attention::attend_plan over its plan. Build from the
// repository root: g++ -std=gnu++20 -O3 -DNDEBUG -fopenmp -Iinclude -Ibench fullkv-step.cpp
// -lbenchmark -lpthread (results.txt, item 8).
#include "common.hpp"
#include <kvsift/kvsift.hpp>
#include <chrono>
#include <cstdio>
#include <algorithm>
using namespace kvbench;
template <class T> void run(int steps) {
  using S = kvsift::store::paged<T>;
  const model& m = llama31_8b; const int n = 32768, r = 1, page = 16, layer = 16, c = 4096;
  S store(m.shape(), r, page, r * m.kv_heads * ((n + steps + 64 + page - 1) / page + 1));
  kvsift::full_kv<S> meth(store, kvsift::full_kv_params<S>());
  auto ck = random_vector<T>(size_t(c) * m.kv_heads * m.head_dim, 21), cv = random_vector<T>(ck.size(), 22);
  for (int t = 0; t < n; t += c) {
    std::vector<kvsift::prefill_chunk<T>> ch{{0, kvsift::kv_view<const T, kvsift::nhd>::contiguous(ck.data(), c, m.kv_heads, m.head_dim),
      kvsift::kv_view<const T, kvsift::nhd>::contiguous(cv.data(), c, m.kv_heads, m.head_dim), {}, t, t + c == n}};
    meth.prefill(layer, ch);
  }
  auto dk = random_vector<T>(size_t(m.kv_heads) * m.head_dim, 24), dv = random_vector<T>(dk.size(), 25);
  auto dq = random_vector<float>(size_t(m.q_heads) * m.head_dim, 26); std::vector<float> out(dq.size());
  std::vector<kvsift::decode_token<T>> tok{{0, dq.data(), dk.data(), dv.data()}};
  std::span<const kvsift::decode_token<T>> tk(tok);
  std::vector<double> a, bb, bb2, cc, tot;
  for (int i = 0; i < steps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    meth.decode(layer, tk);
    auto t1 = std::chrono::steady_clock::now();
    if (i % 2) meth.attend(layer, tk, out.data());
    else kvsift::attention::attend_plan(store, 0, layer, dq.data(), meth.plan().slots, out.data());
    auto t2 = std::chrono::steady_clock::now();
    meth.after_attention(layer, tk);
    auto t3 = std::chrono::steady_clock::now();
    if (i < 5) continue;
    a.push_back((t1 - t0).count() * 1e-3); (i % 2 ? bb : bb2).push_back((t2 - t1).count() * 1e-3); cc.push_back((t3 - t2).count() * 1e-3); tot.push_back((t3 - t0).count() * 1e-3);
  }
  auto med = [](std::vector<double> v) { std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end()); return v[v.size() / 2]; };
  printf("full_kv %s 32K: decode %.1f attend %.1f attend_plan %.1f after %.1f total %.1f us (medians)\n", sizeof(T) == 2 ? "bf16" : "f32 ", med(a), med(bb), med(bb2), med(cc), med(tot));
}
int main(int argc, char** argv) { int s = argc > 1 ? atoi(argv[1]) : 200; run<kvsift::bfloat16>(s); run<float>(s); run<kvsift::bfloat16>(s); run<float>(s); }
