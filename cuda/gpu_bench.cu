// SPDX-License-Identifier: Apache-2.0
// GPU benchmarks of the CUDA backend, timed with CUDA events (UseManualTime) and reporting
// bytes/s. Without a device the program prints a message and exits 0.
//
//   kvsift_cuda_bench --benchmark_filter=attention

#include "instantiations.cuh"

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

namespace kc = kvsift::cuda;
using i32 = std::int32_t;

namespace {

template <class T>
kc::device_buffer<T> upload(const std::vector<T>& h) {
  kc::device_buffer<T> d(h.size());
  kc::check(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice),
            "bench upload");
  return d;
}

// Times `launch` on `s` with events; one iteration per benchmark iteration.
template <class F>
void time_with_events(benchmark::State& state, cudaStream_t s, F&& launch) {
  kc::event start(true), stop(true);
  launch();  // warm-up
  kc::check(cudaStreamSynchronize(s), "bench warm-up");
  for (auto _ : state) {
    start.record(s);
    launch();
    stop.record(s);
    stop.synchronize();
    state.SetIterationTime(static_cast<double>(stop.elapsed_ms_since(start)) / 1e3);
  }
}

// Segmented top-k: segments of n scores keeping k each (range(0) = n, range(1) = segments).
void bm_segmented_topk(benchmark::State& state) {
  const i32 n = static_cast<i32>(state.range(0));
  const i32 segments = static_cast<i32>(state.range(1));
  const i32 k = n / 10;
  std::vector<float> scores(std::size_t(n) * segments);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto& x : scores) {
    x = u(rng);
  }
  std::vector<i32> off(segments + 1), out_off(segments + 1);
  for (i32 s = 0; s <= segments; ++s) {
    off[s] = s * n;
    out_off[s] = s * k;
  }
  auto d_scores = upload(scores);
  auto d_off = upload(off);
  auto d_out_off = upload(out_off);
  kc::device_buffer<i32> out(std::size_t(k) * segments);
  const auto plan = kc::make_segmented_topk_plan(n * segments, segments, k * segments);
  kc::device_buffer<std::byte> ws(plan.workspace_bytes);
  kc::stream st;
  time_with_events(state, st.get(), [&] {
    kc::segmented_topk(kc::par{st.get()}, plan, ws.data(), ws.size(), d_scores.data(),
                       d_off.data(), d_out_off.data(), out.data());
  });
  state.SetItemsProcessed(state.iterations() * std::int64_t{n} * segments);
  state.SetBytesProcessed(state.iterations() * std::int64_t{n} * segments * sizeof(float));
}

// Sparse decode attention over a token set of `kept` tokens per KV head, Llama-3.1-8B-like
// layer: 8 KV heads, 32 query heads, d = 128, bf16, dense NHD cache of `context` tokens.
template <class T>
void bm_sparse_attention(benchmark::State& state) {
  const i32 context = static_cast<i32>(state.range(0));
  const i32 kept = static_cast<i32>(state.range(1));
  const i32 batch = 4, heads = 8, q_heads = 32, d = 128;
  const std::size_t cache = std::size_t(batch) * context * heads * d;
  kc::device_buffer<T> k(cache), v(cache), q(std::size_t(batch) * q_heads * d),
      out(std::size_t(batch) * q_heads * d);
  kc::check(cudaMemset(k.data(), 0, k.bytes()), "bench");
  kc::check(cudaMemset(v.data(), 0, v.bytes()), "bench");
  kc::check(cudaMemset(q.data(), 0, q.bytes()), "bench");
  std::vector<i32> lens(batch, context), off(batch * heads + 1), idx;
  const i32 stride = context / kept;
  for (i32 s = 0; s < batch * heads; ++s) {
    off[s] = static_cast<i32>(idx.size());
    for (i32 j = 0; j < kept; ++j) {
      idx.push_back(j * stride);
    }
  }
  off.back() = static_cast<i32>(idx.size());
  auto d_lens = upload(lens);
  auto d_off = upload(off);
  auto d_idx = upload(idx);
  const auto view = kc::make_dense_nhd<T>(k.data(), v.data(), d_lens.data(), context, heads, d);
  kc::stream st;
  time_with_events(state, st.get(), [&] {
    kc::sparse_decode_attention(kc::par{st.get()}, q.data(), view,
                                kc::token_set{d_off.data(), d_idx.data()},
                                kc::sparse_attention_shape{batch, q_heads, 0.0f}, out.data());
  });
  const std::int64_t bytes = std::int64_t{2} * batch * heads * kept * d * sizeof(T);
  state.SetBytesProcessed(state.iterations() * bytes);  // K and V rows read once per head
}

// FreeKV streamed recall of `items` (page, head) blocks of 32 x 128 bf16 from pinned memory.
void bm_streamed_recall(benchmark::State& state) {
  using T = kvsift::bfloat16;
  const int items = static_cast<int>(state.range(0));
  const kc::recall_shape shape{32, 8, 128, 64};
  const int pages = items / shape.num_kv_heads + 1;
  const std::size_t blk = kc::streamed_recall<T>::block_elems(shape);
  kc::pinned_buffer<T> pool(std::size_t(pages) * shape.num_kv_heads * blk);
  std::vector<kc::recall_item> list;
  for (int i = 0; i < items; ++i) {
    list.push_back({i / shape.num_kv_heads, i % shape.num_kv_heads, i / shape.num_kv_heads});
  }
  const std::size_t slot = std::size_t(shape.page_size) * shape.num_kv_heads * shape.head_dim;
  kc::device_buffer<T> k(std::size_t(pages) * slot), v(std::size_t(pages) * slot);
  kc::device_buffer<std::byte> ws(kc::streamed_recall<T>::workspace_bytes(shape));
  kc::stream compute, copy;
  kc::streamed_recall<T> recall(shape);
  time_with_events(state, compute.get(), [&] {
    recall.run(kc::par{compute.get()}, copy.get(), pool.data(), list, k.data(), v.data(),
               ws.data(), ws.size());
  });
  state.SetBytesProcessed(state.iterations() * std::int64_t{items} * blk * sizeof(T));
}

void register_all() {
  benchmark::RegisterBenchmark("segmented_topk", bm_segmented_topk)
      ->Args({4096, 256})
      ->Args({32768, 256})
      ->Args({131072, 32})
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("sparse_attention/bf16", bm_sparse_attention<kvsift::bfloat16>)
      ->Args({32768, 2048})
      ->Args({131072, 2048})
      ->Args({32768, 9830})
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("sparse_attention/f16", bm_sparse_attention<kvsift::half>)
      ->Args({32768, 2048})
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("streamed_recall/bf16", bm_streamed_recall)
      ->Arg(64)
      ->Arg(512)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (kc::device_count() == 0) {
    std::printf("kvsift_cuda_bench: no CUDA device; skipping all GPU benchmarks\n");
    return 0;
  }
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
