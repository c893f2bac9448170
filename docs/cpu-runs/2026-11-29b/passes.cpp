// One GQA group (4 query heads, head_dim 128, bf16), one thread: attend_group, then its logits pass
// and its value pass alone, rows contiguous in huge-page-advised memory; FLAT=1 gives the passes row
// addresses computed from j instead of the table. ./passes ROWS REPS (1048576 rows: 537 MB).
#include <kvsift/cpu/decode_attention.hpp>
#include <kvsift/core/kv_memory.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
using namespace kvsift;
using namespace kvsift::cpu::detail::avx512;
template <class F> double best_of(int reps, F&& f) {
  double best = 1e9;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now(); f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}
int main(int argc, char** argv) {
  using T = bfloat16;
  const std::size_t m = std::strtoul(argv[1], nullptr, 10); const int reps = std::atoi(argv[2]);
  const int G = 4, d = 128; const bool getenv_flat = std::getenv("FLAT") != nullptr;
  kv_vector<T> K(m * d), V(m * d);
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  for (auto& x : K) x = T(nd(rng)); for (auto& x : V) x = T(nd(rng));
  std::vector<const T*> kr(m), vr(m);
  for (std::size_t j = 0; j < m; ++j) { kr[j] = K.data() + j * d; vr[j] = V.data() + j * d; }
  std::vector<float> q(G * d), out(G * d), logits(G * m), w(G * m, 1e-4f), inv(G, 1.0f);
  for (auto& x : q) x = nd(rng) * 0.1f;
  const T* K0 = K.data(); const T* V0 = V.data();
  auto key = [&](std::size_t j) { return getenv_flat ? K0 + j * d : kr[j]; };
  auto value = [&](std::size_t j) { return getenv_flat ? V0 + j * d : vr[j]; };
  const double all = best_of(reps, [&] { attend_group<T>(q.data(), G, d, m, kr.data(), vr.data(), out.data(), 0.088f, logits); });
  const double lg = best_of(reps, [&] { logits_block<4, T, true>(q.data(), d, m, key, 0.088f, logits.data(), m); });
  const double ac = best_of(reps, [&] { accumulate_heads<4, T, true>(w.data(), m, inv.data(), d, m, value, out.data()); });
  const double half = m * d * sizeof(T) * 1e-9;
  std::printf("m=%zu all %.1f us (%.1f GB/s) logits %.1f us (%.1f GB/s) values %.1f us (%.1f GB/s)\n", m,
              all * 1e6, 2 * half / all, lg * 1e6, half / lg, ac * 1e6, half / ac);
}
