// SPDX-License-Identifier: Apache-2.0
// GPU benchmarks of the CUDA backend, timed with CUDA events (UseManualTime), with the limits
// they are judged against measured in the same run: the HBM read rate (a streaming read of
// 2 GiB), a device-to-device copy and a pinned host-to-device copy. Every kernel figure reports
// bytes/s and its share of the matching limit (`of_hbm`, `of_h2d`). L2 (50 MB on an H100) is
// flushed before each timed iteration, so no figure is served from a previous iteration's cache.
// Without a device the program prints a message and exits 0.
//
//   kvsift_cuda_bench --benchmark_filter=attention
//
// cuda/torch_reference.py times what a PyTorch user would write on the same shapes.

#include "instantiations.cuh"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

namespace kc = kvsift::cuda;
using i32 = std::int32_t;

namespace {

double g_hbm_read = 0;  // bytes/s, measured in main()
double g_h2d = 0;       // bytes/s, pinned host -> device
int g_sms = 132;        // the device's multiprocessors, read in main()

template <class T>
kc::device_buffer<T> upload(const std::vector<T>& h) {
  kc::device_buffer<T> d(h.size());
  kc::check(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice),
            "bench upload");
  return d;
}

template <class T>
std::vector<T> download(const kc::device_buffer<T>& d) {
  std::vector<T> h(d.size());
  kc::check(cudaMemcpy(h.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost), "bench download");
  return h;
}

// Random contents (the memory system must not see zeros).
template <class T>
__global__ void fill_kernel(T* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    p[i] = kvsift::from_float<T>(static_cast<float>(x & 0xffff) / 65536.0f - 0.5f);
  }
}

template <class T>
void fill(kc::device_buffer<T>& b, std::uint32_t seed) {
  fill_kernel<<<1024, 256>>>(b.data(), b.size(), seed);
  kc::check(cudaDeviceSynchronize(), "bench fill");
}

// Streaming read of n 16-byte words; the sum keeps the loads alive.
__global__ void read_kernel(const uint4* __restrict__ p, std::size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) {
    *sink = acc;
  }
}

// Reads the K and V rows a token set names, one 16-byte word per thread, all in flight at once:
// the fastest this access pattern (random rows of one head) can be read, without any arithmetic.
template <class T>
__global__ void rows_read_kernel(kc::dense_kv<T> kv, const i32* __restrict__ idx, i32 kept,
                                 std::int64_t words, unsigned* sink) {
  constexpr int per_row = 128 * sizeof(T) / 16;  // d = 128
  unsigned acc = 0;
  for (std::int64_t w = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; w < words;
       w += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t row = w / per_row;  // (segment, j) of the set, K and V interleaved
    const int which = static_cast<int>(row % 2);
    const std::int64_t e = row / 2;
    const i32 s = static_cast<i32>(e / kept);
    const i32 t = idx[e];
    const uint4 v = __ldcs(reinterpret_cast<const uint4*>(
                               kv.row(which, s / kv.num_kv_heads, s % kv.num_kv_heads, t)) +
                           w % per_row);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) {
    *sink = acc;
  }
}

// Evicts L2 by reading a buffer five times its size (outside the timed region). A read leaves
// clean lines: a write (memset) would leave dirty ones that the timed kernel pays to write back.
struct l2_flush {
  kc::device_buffer<uint4> junk{(std::size_t(256) << 20) / 16};
  kc::device_buffer<unsigned> sink{1};
  l2_flush() { kc::check(cudaMemset(junk.data(), 0, junk.bytes()), "bench flush"); }
  void operator()(cudaStream_t s) {
    read_kernel<<<g_sms * 8, 512, 0, s>>>(junk.data(), junk.size(), sink.data());
  }
};

l2_flush& flusher() {
  static l2_flush flush;  // one buffer for the whole run
  return flush;
}

// Times `launch` on `s` with events, L2 flushed before each iteration; returns the timed
// seconds in all (the share counters divide by it).
template <class F>
double time_with_events(benchmark::State& state, cudaStream_t s, F&& launch) {
  l2_flush& flush = flusher();
  kc::event start(true), stop(true);
  launch();  // warm-up
  kc::check(cudaStreamSynchronize(s), "bench warm-up");
  double total = 0;
  for (auto _ : state) {
    flush(s);
    start.record(s);
    launch();
    stop.record(s);
    stop.synchronize();
    const double seconds = static_cast<double>(stop.elapsed_ms_since(start)) / 1e3;
    state.SetIterationTime(seconds);
    total += seconds;
  }
  return total;
}

// Share of a limit: the rate reached over the timed seconds (from time_with_events) over the
// limit's. A plain counter: Google Benchmark's rate flags would divide by its own clock.
void share_of(benchmark::State& state, const char* name, double bytes_per_iter, double limit,
              double seconds) {
  state.counters[name] =
      seconds > 0 ? bytes_per_iter * static_cast<double>(state.iterations()) / seconds / limit
                  : 0.0;
}

// ---- references -------------------------------------------------------------------------------

// The two limits, as callables on a stream (the benchmarks time them, main() takes their
// medians for the shares).
struct hbm_read_ref {
  kc::device_buffer<uint4> buf{(std::size_t(2) << 30) / 16};
  kc::device_buffer<unsigned> sink{1};
  hbm_read_ref() { kc::check(cudaMemset(buf.data(), 7, buf.bytes()), "bench"); }
  [[nodiscard]] double bytes() const { return double(buf.bytes()); }
  void operator()(cudaStream_t s) {
    read_kernel<<<g_sms * 16, 512, 0, s>>>(buf.data(), buf.size(), sink.data());
  }
};

struct pinned_h2d_ref {
  static constexpr std::size_t size = std::size_t(256) << 20;
  kc::pinned_buffer<std::byte> host{size};
  kc::device_buffer<std::byte> dev{size};
  pinned_h2d_ref() { std::fill(host.data(), host.data() + size, std::byte{5}); }
  [[nodiscard]] double bytes() const { return double(size); }
  void operator()(cudaStream_t s) {
    kc::check(cudaMemcpyAsync(dev.data(), host.data(), size, cudaMemcpyHostToDevice, s),
              "bench");
  }
};

void bm_hbm_read(benchmark::State& state) {
  hbm_read_ref ref;
  kc::stream st;
  time_with_events(state, st.get(), [&] { ref(st.get()); });
  state.SetBytesProcessed(state.iterations() * std::int64_t(ref.bytes()));
}

void bm_device_copy(benchmark::State& state) {
  const std::size_t bytes = std::size_t(1) << 30;
  kc::device_buffer<std::byte> a(bytes), b(bytes);
  kc::check(cudaMemset(a.data(), 3, bytes), "bench");
  kc::stream st;
  time_with_events(state, st.get(), [&] {
    kc::check(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, st.get()),
              "bench");
  });
  state.SetBytesProcessed(state.iterations() * std::int64_t(2 * bytes));  // read + write
}

void bm_pinned_h2d(benchmark::State& state) {
  pinned_h2d_ref ref;
  kc::stream st;
  time_with_events(state, st.get(), [&] { ref(st.get()); });
  state.SetBytesProcessed(state.iterations() * std::int64_t(ref.bytes()));
}

// Median bytes/s of `reps` timed calls (for the shares, before the benchmarks run).
template <class F>
double measure_rate(double bytes, int reps, F&& launch) {
  l2_flush& flush = flusher();
  kc::stream st;
  kc::event start(true), stop(true);
  launch(st.get());
  std::vector<double> rates;
  for (int i = 0; i < reps; ++i) {
    flush(st.get());
    start.record(st.get());
    launch(st.get());
    stop.record(st.get());
    stop.synchronize();
    rates.push_back(bytes / (stop.elapsed_ms_since(start) / 1e3));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// ---- kernels ------------------------------------------------------------------------------------

// Segmented top-k: segments of n scores keeping k = n / 10 each (range(0) = n, range(1) =
// segments), the shapes cuda/torch_reference.py gives torch.topk.
struct topk_case {
  i32 n, segments, k;
  kc::device_buffer<float> scores;
  kc::device_buffer<i32> off, out_off, out;
  kc::segmented_topk_plan plan;
  kc::device_buffer<std::byte> ws;  // the split path's (a few long segments), else empty

  explicit topk_case(const benchmark::State& state)
      : n(static_cast<i32>(state.range(0))), segments(static_cast<i32>(state.range(1))),
        k(n / 10), scores(std::size_t(n) * segments), out(std::size_t(k) * segments),
        plan(kc::make_segmented_topk_plan(std::int64_t{n} * segments, segments,
                                          std::int64_t{k} * segments)),
        ws(plan.workspace_bytes) {
    fill(scores, 3);
    std::vector<i32> o(segments + 1), oo(segments + 1);
    for (i32 s = 0; s <= segments; ++s) {
      o[s] = s * n;
      oo[s] = s * k;
    }
    off = upload(o);
    out_off = upload(oo);
  }
  // the library's top-k into `into`
  void run(cudaStream_t st, i32* into) const {
    kc::segmented_topk(kc::par{st}, plan, ws.data(), ws.size(), scores.data(), off.data(),
                       out_off.data(), into);
  }
  [[nodiscard]] double bytes() const { return double(n) * segments * sizeof(float); }
};

void bm_segmented_topk(benchmark::State& state) {
  topk_case c(state);
  kc::stream st;
  const double seconds =
      time_with_events(state, st.get(), [&] { c.run(st.get(), c.out.data()); });
  state.SetItemsProcessed(state.iterations() * std::int64_t{c.n} * c.segments);
  state.SetBytesProcessed(state.iterations() * std::int64_t(c.bytes()));
  share_of(state, "of_hbm", c.bytes(), g_hbm_read, seconds);
}

// The top-k kernel at a given block size on the same segments (the library picks 256 or 1024 by
// the average segment length, detail::topk_long_segment), checked against the library's.
template <int Block, bool WarpAggregated>
void bm_topk_block(benchmark::State& state) {
  topk_case c(state);
  kc::device_buffer<i32> ref(c.out.size());
  kc::stream st;
  time_with_events(state, st.get(), [&] {
    kc::detail::radix_topk_kernel<float, Block, WarpAggregated><<<c.segments, Block, 0, st.get()>>>(
        c.scores.data(), c.off.data(), c.out_off.data(), c.segments, c.out.data());
  });
  c.run(st.get(), ref.data());
  kc::check(cudaStreamSynchronize(st.get()), "bench topk check");
  if (download(c.out) != download(ref)) {
    state.SkipWithError("block-size variant differs from the library's top-k");
  }
  state.SetItemsProcessed(state.iterations() * std::int64_t{c.n} * c.segments);
}

// Sparse decode attention, Llama-3.1-8B layer: 8 KV heads, 32 query heads, d = 128, a dense NHD
// cache of `context` tokens per request; each KV head keeps `kept` random tokens (sorted).
template <class T>
struct attention_case {
  static constexpr i32 heads = 8, q_heads = 32, d = 128;
  i32 context, kept, batch;
  kc::device_buffer<T> k, v, q, out;
  kc::device_buffer<i32> d_lens, d_off, d_idx;
  kc::dense_kv<T> view;
  kc::sparse_attention_shape shape;

  attention_case(i32 context_, i32 kept_, i32 batch_)
      : context(context_), kept(kept_), batch(batch_),
        k(std::size_t(batch) * context * heads * d), v(k.size()),
        q(std::size_t(batch) * q_heads * d), out(q.size()), shape{batch, q_heads, 0.0f} {
    fill(k, 1);
    fill(v, 2);
    fill(q, 3);
    std::vector<i32> lens(batch, context), off(batch * heads + 1), idx;
    std::mt19937 rng(5);
    std::vector<i32> all(context);
    std::iota(all.begin(), all.end(), 0);
    for (i32 s = 0; s < batch * heads; ++s) {
      off[s] = static_cast<i32>(idx.size());
      std::shuffle(all.begin(), all.end(), rng);
      std::vector<i32> pick(all.begin(), all.begin() + kept);
      std::sort(pick.begin(), pick.end());
      idx.insert(idx.end(), pick.begin(), pick.end());
    }
    off.back() = static_cast<i32>(idx.size());
    d_lens = upload(lens);
    d_off = upload(off);
    d_idx = upload(idx);
    view = kc::make_dense_nhd<T>(k.data(), v.data(), d_lens.data(), context, heads, d);
  }
  [[nodiscard]] kc::token_set set() const { return {d_off.data(), d_idx.data()}; }
  // what it must read: K and V rows of the kept tokens, once per KV head
  [[nodiscard]] double bytes() const { return 2.0 * batch * heads * kept * d * sizeof(T); }
  void report(benchmark::State& state, double seconds) const {
    state.SetBytesProcessed(state.iterations() * std::int64_t(bytes()));
    state.SetItemsProcessed(state.iterations() * std::int64_t{batch} * heads * kept);
    share_of(state, "of_hbm", bytes(), g_hbm_read, seconds);
  }
};

// The library's attention. range: context, kept, batch, split (1: the plan form, 0: one block
// per head tile). Beside it, the same rows read by rows_read_kernel: the access pattern's limit.
template <class T>
void bm_sparse_attention(benchmark::State& state) {
  attention_case<T> c(static_cast<i32>(state.range(0)), static_cast<i32>(state.range(1)),
                      static_cast<i32>(state.range(2)));
  const bool split = state.range(3) != 0;
  const auto plan = kc::make_sparse_attention_plan(c.shape, c.heads, c.d, c.kept);
  kc::device_buffer<std::byte> ws(std::max<std::size_t>(plan.workspace_bytes, 1));
  kc::stream st;
  const double seconds = time_with_events(state, st.get(), [&] {
    if (split) {
      kc::sparse_decode_attention(kc::par{st.get()}, plan, ws.data(), ws.size(), c.q.data(),
                                  c.view, c.set(), c.shape, c.out.data());
    } else {
      kc::sparse_decode_attention(kc::par{st.get()}, c.q.data(), c.view, c.set(), c.shape,
                                  c.out.data());
    }
  });
  c.report(state, seconds);
  kc::device_buffer<unsigned> sink(1);
  const std::int64_t words = static_cast<std::int64_t>(c.bytes()) / 16;
  const double rows_rate = measure_rate(c.bytes(), 11, [&](cudaStream_t s) {
    rows_read_kernel<T><<<g_sms * 16, 512, 0, s>>>(c.view, c.d_idx.data(), c.kept, words,
                                                   sink.data());
  });
  share_of(state, "of_rows_read", c.bytes(), rows_rate, seconds);
  state.counters["rows_read_GBps"] = rows_rate / 1e9;
  state.counters["splits"] = split ? plan.num_splits : 1;
}

// The split form with another row pipeline (Pipe: ring depth, rows per lane-group; the library
// runs detail::default_attention_pipeline) and plan. range: kept, batch, merge in kernel (1) or
// by a merge kernel (0), min_chunk_tokens, target_blocks; context 32K.
template <class T, class Pipe>
void bm_attention_variant(benchmark::State& state) {
  attention_case<T> c(32768, static_cast<i32>(state.range(0)), static_cast<i32>(state.range(1)));
  auto plan = kc::make_sparse_attention_plan(c.shape, c.heads, c.d, c.kept, 1,
                                             static_cast<i32>(state.range(4)),
                                             static_cast<i32>(state.range(3)));
  plan.merge_in_kernel = state.range(2) != 0;
  plan.workspace_bytes = kc::detail::attention_workspace_bytes(plan);
  kc::device_buffer<std::byte> ws(std::max<std::size_t>(plan.workspace_bytes, 1));
  kc::stream st;
  kc::prepare_sparse_attention_workspace(kc::par{st.get()}, plan, ws.data());
  const auto launch = [&] {
    kc::detail::run_attention_plan<Pipe>(kc::par{st.get()}, plan, ws.data(), ws.size(),
                                         c.q.data(), c.view, c.set(), c.shape, c.out.data());
  };
  const double seconds = time_with_events(state, st.get(), launch);
  c.report(state, seconds);
  state.counters["splits"] = plan.num_splits;
  // the variant's output against the library's (the single-kernel form): a wrong variant's
  // time is no result
  kc::device_buffer<T> ref(c.out.size());
  kc::sparse_decode_attention(kc::par{st.get()}, c.q.data(), c.view, c.set(), c.shape,
                              ref.data());
  // one more launch into an output of NaN: a variant that wrote nothing after its first launch
  // (its in-kernel merge's counters not back at zero) fails here
  kc::check(cudaMemsetAsync(c.out.data(), 0xff, c.out.bytes(), st.get()), "bench variant check");
  launch();
  kc::check(cudaStreamSynchronize(st.get()), "bench variant check");
  const auto got = download(c.out);
  const auto want = download(ref);
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double a = kvsift::to_float(got[i]), b = kvsift::to_float(want[i]);
    const double e = std::abs(a - b) / (1.0 + std::abs(b));
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);  // NaN: a row never written
  }
  state.counters["max_rel_diff"] = worst;
  if (!(worst <= 2e-2)) {
    state.SkipWithError("variant output differs from the library's");
  }
}

// FreeKV's recall of `items` (page, head) blocks of 32 x 128 bf16 from pinned host memory:
// range(1) = 0 streamed_recall (staged copies), 1 recall_gather (one kernel over the mapping).
void bm_recall(benchmark::State& state) {
  using T = kvsift::bfloat16;
  const int items = static_cast<int>(state.range(0));
  const bool gather = state.range(1) != 0;
  const kc::recall_shape shape{32, 8, 128, 64};
  const int pages = items / shape.num_kv_heads + 1;
  const std::size_t blk = kc::streamed_recall<T>::block_elems(shape);
  kc::pinned_buffer<T> pool(std::size_t(pages) * shape.num_kv_heads * blk);
  for (std::size_t i = 0; i < pool.size(); ++i) {
    pool[i] = kvsift::from_float<T>(static_cast<float>(i % 97));
  }
  std::vector<kc::recall_item> list;
  for (int i = 0; i < items; ++i) {
    list.push_back({i / shape.num_kv_heads, i % shape.num_kv_heads, i / shape.num_kv_heads});
  }
  auto d_list = upload(list);
  const std::size_t slot = std::size_t(shape.page_size) * shape.num_kv_heads * shape.head_dim;
  kc::device_buffer<T> k(std::size_t(pages) * slot), v(std::size_t(pages) * slot);
  kc::device_buffer<std::byte> ws(kc::streamed_recall<T>::workspace_bytes(shape));
  kc::stream compute, copy;
  kc::streamed_recall<T> recall(shape);
  const double seconds = time_with_events(state, compute.get(), [&] {
    if (gather) {
      kc::recall_gather<T>(kc::par{compute.get()}, shape, pool.data(), pages, d_list.data(),
                           items, k.data(), v.data());
    } else {
      recall.run(kc::par{compute.get()}, copy.get(), pool.data(), list, k.data(), v.data(),
                 ws.data(), ws.size());
    }
  });
  const double bytes = double(items) * blk * sizeof(T);
  state.SetBytesProcessed(state.iterations() * std::int64_t(bytes));
  share_of(state, "of_h2d", bytes, g_h2d, seconds);
}

// Fixed counts: each iteration flushes L2 first, so the time-based count would run far too long.
void timed_runs(benchmark::internal::Benchmark* b) {
  b->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(100)->Repetitions(5);
  b->ReportAggregatesOnly(true);
}

void register_all() {
  benchmark::RegisterBenchmark("ref/hbm_read_2GiB", bm_hbm_read)
      ->Apply(timed_runs);
  benchmark::RegisterBenchmark("ref/device_copy_1GiB", bm_device_copy)
      ->Apply(timed_runs);
  benchmark::RegisterBenchmark("ref/pinned_h2d_256MiB", bm_pinned_h2d)
      ->Apply(timed_runs);
  benchmark::RegisterBenchmark("segmented_topk", bm_segmented_topk)
      ->Args({4096, 256})
      ->Args({32768, 256})
      ->Args({131072, 32})
      ->Apply(timed_runs);
  // context, kept, batch, split
  auto* bf16 = benchmark::RegisterBenchmark("sparse_attention/bf16",
                                            bm_sparse_attention<kvsift::bfloat16>);
  for (const int kept : {2048, 10240}) {
    for (const int batch : {1, 64}) {
      for (const int split : {0, 1}) {
        bf16->Args({32768, kept, batch, split});
      }
    }
  }
  bf16->Apply(timed_runs);
  for (auto* b : {benchmark::RegisterBenchmark("topk_block/256", bm_topk_block<256, false>),
                  benchmark::RegisterBenchmark("topk_block/512", bm_topk_block<512, false>),
                  benchmark::RegisterBenchmark("topk_block/1024", bm_topk_block<1024, false>),
                  benchmark::RegisterBenchmark("topk_block/256_aggregated", bm_topk_block<256, true>),
                  benchmark::RegisterBenchmark("topk_block/1024_aggregated",
                                               bm_topk_block<1024, true>)}) {
    b->Args({4096, 256})->Args({32768, 256})->Args({131072, 32})->Apply(timed_runs);
  }
  // row pipelines x merge x chunking, bf16 (kept, batch, merge_in_kernel, min_chunk, target)
  const auto variants = [](benchmark::internal::Benchmark* b) {
    for (const int kept : {2048, 10240}) {
      for (const int batch : {1, 64}) {
        b->Args({kept, batch, 0, 64, 1024});
      }
      b->Args({kept, 1, 1, 64, 1024});  // the in-kernel merge at batch 1
      for (const int min_chunk : {32, 128}) {  // batch 1: chunk length, blocks
        for (const int target : {512, 2048}) {
          b->Args({kept, 1, 0, min_chunk, target});
        }
      }
    }
    b->Apply(timed_runs);
  };
  using bf = kvsift::bfloat16;
  namespace kd = kc::detail;
  benchmark::RegisterBenchmark("attention_variant/bf16/regs_u4",
                               bm_attention_variant<bf, kd::attention_pipeline<0, 4>>)
      ->Apply(variants);
  benchmark::RegisterBenchmark("attention_variant/bf16/regs_u8",
                               bm_attention_variant<bf, kd::attention_pipeline<0, 8>>)
      ->Apply(variants);
  benchmark::RegisterBenchmark("attention_variant/bf16/ring3_u3",
                               bm_attention_variant<bf, kd::attention_pipeline<3, 3>>)
      ->Apply(variants);
  benchmark::RegisterBenchmark("sparse_attention/f16", bm_sparse_attention<kvsift::half>)
      ->Args({32768, 2048, 1, 1})
      ->Args({32768, 2048, 64, 1})
      ->Apply(timed_runs);
  benchmark::RegisterBenchmark("recall/bf16", bm_recall)
      ->Args({64, 0})
      ->Args({64, 1})
      ->Args({512, 0})
      ->Args({512, 1})
      ->Args({4096, 1})
      ->Apply(timed_runs);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (kc::device_count() == 0) {
    std::printf("kvsift_cuda_bench: no CUDA device; skipping all GPU benchmarks\n");
    return 0;
  }
  {  // the limits every share is taken of, measured before the kernels in the same run
    cudaDeviceProp prop{};
    kc::check(cudaGetDeviceProperties(&prop, 0), "bench");
    g_sms = prop.multiProcessorCount;
    {
      hbm_read_ref ref;
      g_hbm_read = measure_rate(ref.bytes(), 11, ref);
    }
    {
      pinned_h2d_ref ref;
      g_h2d = measure_rate(ref.bytes(), 11, ref);
    }
    std::printf("device: %s, %d SMs, L2 %d MB\nlimits (median of 11): HBM read %.0f GB/s, "
                "pinned H2D %.1f GB/s\n",
                prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, g_hbm_read / 1e9,
                g_h2d / 1e9);
    benchmark::AddCustomContext("hbm_read_GBps", std::to_string(g_hbm_read / 1e9));
    benchmark::AddCustomContext("pinned_h2d_GBps", std::to_string(g_h2d / 1e9));
    benchmark::AddCustomContext("device", prop.name);
  }
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
