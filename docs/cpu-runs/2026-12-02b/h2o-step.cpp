// H2O bf16 decode step split into phases (decode / attend / after_attention), pool vs caller.
#include "common.hpp"
#include <kvsift/kvsift.hpp>
#include <chrono>
#include <cstdio>
#include <algorithm>
using namespace kvbench;
int steps = 3000;
template <class T> void run(kvsift::cpu::threading th) {
  using S = kvsift::store::paged<T>;
  const model& m = llama31_8b; const int n = 1024, b = 256, r = 1, page = 16, layer = 16;
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
  kvsift::cpu::scoped_threading sc(th);
  std::vector<double> a, bb, c, tot;
  for (int i = 0; i < steps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    { std::optional<kvsift::cpu::scoped_threading> cs; if (getenv("MIX")) cs.emplace(kvsift::cpu::threading::caller); meth->decode(layer, t); }
    auto t1 = std::chrono::steady_clock::now();
    meth->attend(layer, t, out.data());
    auto t2 = std::chrono::steady_clock::now();
    { std::optional<kvsift::cpu::scoped_threading> cs; if (getenv("MIX")) cs.emplace(kvsift::cpu::threading::caller); meth->after_attention(layer, t); }
    auto t3 = std::chrono::steady_clock::now();
    if (i < 100) continue;
    a.push_back((t1 - t0).count() * 1e-3); bb.push_back((t2 - t1).count() * 1e-3); c.push_back((t3 - t2).count() * 1e-3); tot.push_back((t3 - t0).count() * 1e-3);
  }
  auto med = [](std::vector<double> v) { std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end()); return v[v.size() / 2]; };
  printf("%s %s: decode %.1f attend %.1f after %.1f total %.1f us (medians)\n", th == kvsift::cpu::threading::caller ? "caller" : "pool  ",
         sizeof(T) == 2 ? "bf16" : "f32 ", med(a), med(bb), med(c), med(tot));
}
int main(int argc, char** argv) {
  if (argc > 1) { steps = atoi(argv[1]); run<kvsift::bfloat16>(argc > 2 ? kvsift::cpu::threading::pool : kvsift::cpu::threading::caller); return 0; }
  for (int k = 0; k < 2; ++k) {
    run<kvsift::bfloat16>(kvsift::cpu::threading::pool); run<kvsift::bfloat16>(kvsift::cpu::threading::caller);
    run<float>(kvsift::cpu::threading::pool); run<float>(kvsift::cpu::threading::caller);
  }
}
