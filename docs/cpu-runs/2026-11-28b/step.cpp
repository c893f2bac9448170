// H2O decode step driver, llama31_8b shape, one layer filled, like bench/methods.cpp
#include <kvsift/kvsift.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <algorithm>
#include <optional>
#include <string>
using namespace kvsift;
template <class T> std::vector<T> rv(std::size_t n, int seed) { std::mt19937 r(seed); std::normal_distribution<float> d; std::vector<T> v(n); for (auto& x : v) x = T(d(r)); return v; }
int main(int argc, char** argv) {
  using T = bfloat16;
  const char* th = std::getenv("TH");
  std::optional<cpu::scoped_threading> guard;
  if (th && std::string(th) == "caller") guard.emplace(cpu::threading::caller);
  const int steps = argc > 1 ? std::atoi(argv[1]) : 20000;
  model_shape sh{32, 32, 8, 128};
  const int n = 1024, B = 256, page = 16, layer = 16;
  using S = store::paged<T>;
  S st(sh, 1, page, sh.kv_heads * ((n + 2048 + page - 1) / page + 1));
  h2o<S> m(st, h2o_params<S>(B));
  auto ck = rv<T>(n * 8 * 128, 21), cv = rv<T>(n * 8 * 128, 22);
  auto cq = rv<float>(n * 32 * 128, 23);
  std::vector<prefill_chunk<T>> ch{{0, kv_view<const T, nhd>::contiguous(ck.data(), n, 8, 128), kv_view<const T, nhd>::contiguous(cv.data(), n, 8, 128), kv_view<const float, nhd>::contiguous(cq.data(), n, 32, 128), 0, true}};
  m.prefill(layer, ch);
  auto dk = rv<T>(8 * 128, 24), dv = rv<T>(8 * 128, 25); auto dq = rv<float>(32 * 128, 26);
  std::vector<float> out(32 * 128);
  std::vector<decode_token<T>> tok{{0, dq.data(), dk.data(), dv.data()}};
  std::vector<double> t;
  for (int s = 0; s < steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    m.decode(layer, tok); m.attend(layer, tok, out.data()); m.after_attention(layer, tok);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  std::printf("p50 %.1f us  p10 %.1f us\n", t[t.size() / 2] * 1e6, t[t.size() / 10] * 1e6);
}
