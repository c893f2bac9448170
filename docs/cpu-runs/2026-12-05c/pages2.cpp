// A paged store's whole-cache lookups at 32K x 8 heads (pages of 16, prompt appended in chunks
// of 4096): positions_prefix and row_addresses, each over the 8 heads, three repetitions; built
// against the library before and after adjacent_run (results.txt, item 4).
// Build from the repository root: g++ -std=gnu++20 -O3 -DNDEBUG -fopenmp -Iinclude pages2.cpp
#include <kvsift/kvsift.hpp>
#include <chrono>
#include <cstdio>
using namespace kvsift;
int main() {
  model_shape sh{32, 32, 8, 128}; const int n = 32768, c = 4096;
  store::paged<bfloat16> st(sh, 1, 16, 8 * (n / 16 + 8));
  std::vector<bfloat16> k((size_t)c * 8 * 128), v(k.size());
  for (int t = 0; t < n; t += c) st.append(0, 16, kv_view<const bfloat16, nhd>::contiguous(k.data(), c, 8, 128), kv_view<const bfloat16, nhd>::contiguous(v.data(), c, 8, 128), t);
  std::vector<std::int32_t> pos(n), slots(n); for (int i = 0; i < n; ++i) slots[i] = i;
  std::vector<const bfloat16*> kr(n), vr(n);
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int h = 0; h < 8; ++h) st.positions_prefix(sh.sequence(0, 16, h), n, pos.data());
    auto t1 = std::chrono::steady_clock::now();
    for (int h = 0; h < 8; ++h) st.row_addresses(sh.sequence(0, 16, h), slots, kr.data(), vr.data());
    auto t2 = std::chrono::steady_clock::now();
    printf("positions_prefix x8 %.1f us  row_addresses x8 %.1f us\n", std::chrono::duration<double>(t1 - t0).count() * 1e6, std::chrono::duration<double>(t2 - t1).count() * 1e6);
  }
}
