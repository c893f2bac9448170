// kernel.cpp (../2026-11-28d) with its K and V in kv_vector (2 MiB-aligned, advised as huge pages, as
// the stores allocate them). Same usage: ./kernel-hugepages ROWS STRIDE REPS b|f
// One GQA group's decode attention alone (cpu::detail::avx512::attend_group: 4 query heads, head_dim
// 128), one thread, best of `reps` calls. Rows in pages of 16; consecutive pages of the group lie
// `stride` pages apart in the pool (1: one contiguous run; 8: a layer's 8 KV heads interleaved, as a
// paged store fills them). Build against a tree's include/:
//   g++ -std=gnu++20 -O3 -DNDEBUG -I<tree>/include kernel.cpp -o kernel
//   ./kernel ROWS STRIDE REPS b|f      (b: bf16 KV, f: f32 KV)
#include <kvsift/cpu/decode_attention.hpp>
#include <kvsift/core/kv_memory.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

using namespace kvsift;

template <class T>
void run(const char* name, std::size_t m, int stride, int reps) {
  const int G = 4, d = 128;
  const std::size_t pages = (m + 15) / 16;
  kv_vector<T> K(pages * stride * 16 * d), V(K.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& x : K) x = T(nd(rng));
  for (auto& x : V) x = T(nd(rng));
  std::vector<const T*> kr(m), vr(m);
  for (std::size_t j = 0; j < m; ++j) {
    const std::size_t row = (j / 16) * stride * 16 + j % 16;
    kr[j] = K.data() + row * d;
    vr[j] = V.data() + row * d;
  }
  std::vector<float> q(G * d), out(G * d), logits;
  for (auto& x : q) x = nd(rng) * 0.1f;
  double best = 1e9;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::detail::avx512::attend_group<T>(q.data(), G, d, m, kr.data(), vr.data(), out.data(),
                                         0.088f, logits);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double macs = 2.0 * G * d * m;  // q.k and p.v for each head and row
  std::printf("%s m=%zu stride=%d: %.1f us, %.1f G MAC/s, %.1f GB/s\n", name, m, stride, best * 1e6,
              macs / best * 1e-9, 2.0 * m * d * sizeof(T) / best * 1e-9);
}

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: kernel ROWS STRIDE REPS b|f\n");
    return 2;
  }
  const std::size_t m = std::strtoul(argv[1], nullptr, 10);
  const int stride = std::atoi(argv[2]), reps = std::atoi(argv[3]);
  if (argv[4][0] == 'b') run<bfloat16>("bf16", m, stride, reps);
  else run<float>("f32", m, stride, reps);
}
