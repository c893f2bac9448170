// SPDX-License-Identifier: Apache-2.0
// CUDA-graph capture of a decode-like step of the Thrust backend on the CUDA system: the step
// exec::sim proves allocation- and read-back-free on the CPU (tests/thrust/test_sim_exec.cpp:
// segmented top-k with a protected sink and window, then a gather of the kept rows and their
// positions), captured once in global mode and replayed for 64 steps whose data (the scores)
// arrives by a copy into a fixed buffer before each launch. The law: every replayed step equals
// the same step run uncaptured, and both equal the same algorithms under Thrust's CPP system on
// the host (the CPU parity of the device path). Thrust's temporary storage comes from a cache
// filled by the uncaptured warm-up, so nothing is allocated inside the capture; an allocation
// there would fail the capture (cudaMalloc is not capturable in global mode) and the test.
// Skips without a device.

#include <kvsift/thrust/gather.hpp>
#include <kvsift/thrust/segmented_topk.hpp>

#include <thrust/system/cpp/execution_policy.h>
#include <thrust/system/cuda/execution_policy.h>

#include <cuda_runtime.h>

#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <cstdint>
#include <new>
#include <random>
#include <string>
#include <vector>

namespace {

using i32 = std::int32_t;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) FAIL(what << ": " << cudaGetErrorName(e) << " " << cudaGetErrorString(e));
}

bool gpu_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Thrust's temporary storage from blocks of exact sizes, kept for reuse: after the warm-up every
// request is served from the cache, so a captured step makes no cudaMalloc or cudaFree.
class block_cache {
 public:
  using value_type = char;
  block_cache() = default;
  block_cache(const block_cache&) = delete;
  block_cache& operator=(const block_cache&) = delete;
  ~block_cache() {
    for (const auto& b : blocks_) cudaFree(b.p);
  }
  char* allocate(std::ptrdiff_t n) {
    for (auto& b : blocks_) {
      if (!b.used && b.n == static_cast<std::size_t>(n)) {
        b.used = true;
        return b.p;
      }
    }
    char* p = nullptr;
    if (cudaMalloc(&p, static_cast<std::size_t>(n)) != cudaSuccess) throw std::bad_alloc();
    ++mallocs_;
    blocks_.push_back({p, static_cast<std::size_t>(n), true});
    return p;
  }
  void deallocate(char* p, std::size_t) {
    for (auto& b : blocks_) {
      if (b.p == p) b.used = false;
    }
  }
  [[nodiscard]] int mallocs() const { return mallocs_; }

 private:
  struct block {
    char* p;
    std::size_t n;
    bool used;
  };
  std::vector<block> blocks_;
  int mallocs_ = 0;
};

template <class T>
struct device_array {
  T* p = nullptr;
  std::size_t n = 0;
  explicit device_array(std::size_t count) : n(count) {
    cuda_ok(cudaMalloc(&p, count * sizeof(T) + 1), "cudaMalloc");
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { cudaFree(p); }
  void upload(const std::vector<T>& h) {
    cuda_ok(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    cuda_ok(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
};

std::vector<i32> csr(const std::vector<int>& counts) {
  std::vector<i32> o{0};
  for (const int c : counts) o.push_back(o.back() + c);
  return o;
}

}  // namespace

TEST_CASE("cuda graph: a captured decode step replays 64 steps equal to uncaptured and to the "
          "CPP system",
          "[cuda][graph][capture]") {
  if (!gpu_present()) SKIP("no CUDA device (cudaGetDeviceCount failed or returned 0)");
  const std::vector<int> lengths = {40, 33, 57, 12, 64, 25, 64, 1};  // (request, KV head) segments
  const int S = static_cast<int>(lengths.size());
  const int capacity = 64, dim = 16, budget = 16, sink = 2, steps = 64;
  const std::vector<i32> offsets = csr(lengths);
  const std::int64_t N = offsets.back();
  std::vector<int> kept_counts;
  for (const int n : lengths) kept_counts.push_back(n < budget ? n : budget);
  const std::vector<i32> kept_offsets = csr(kept_counts);  // shapes: host-known
  const std::int64_t K = kept_offsets.back();
  std::vector<i32> window(static_cast<std::size_t>(S));
  for (int s = 0; s < S; ++s) window[s] = lengths[s] < 3 ? 0 : 1 + s % 3;

  std::mt19937 rng(64);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> keys(static_cast<std::size_t>(S) * capacity * dim);
  for (auto& k : keys) k = unit(rng);
  std::vector<i32> positions(static_cast<std::size_t>(S) * capacity);
  for (int s = 0; s < S; ++s) {
    for (int j = 0; j < capacity; ++j) positions[static_cast<std::size_t>(s) * capacity + j] = 5 * j + s;
  }
  // Every step's scores, quantised to eighths so that ties occur (ties go to the lower index).
  std::vector<float> scores(static_cast<std::size_t>(steps) * N);
  for (auto& x : scores) x = static_cast<float>(static_cast<int>(unit(rng) * 16)) / 8.0f;

  // The host reference: the same algorithms under Thrust's CPP system, step by step.
  const std::size_t ws_bytes = kvsift::thrust::segmented_topk_workspace_bytes(N);
  const std::size_t rows_per_step = static_cast<std::size_t>(S) * budget;
  std::vector<float> want_rows(static_cast<std::size_t>(steps) * rows_per_step * dim, 0.0f);
  std::vector<i32> want_pos(static_cast<std::size_t>(steps) * rows_per_step, -1);
  {
    std::vector<std::byte> ws(ws_bytes);
    std::vector<i32> kept(static_cast<std::size_t>(K));
    kvsift::thrust::segmented_rows<float> src{keys.data(), offsets.data(), positions.data(),
                                              static_cast<std::int64_t>(capacity) * dim, S, dim};
    for (int t = 0; t < steps; ++t) {
      kvsift::thrust::segmented_topk(::thrust::cpp::par, scores.data() + t * N, offsets.data(), S,
                                     N, kept_offsets.data(), K, kept.data(), ws.data(), ws_bytes,
                                     {sink, window.data()});
      kvsift::thrust::gather_rows(::thrust::cpp::par, src, kept_offsets.data(), kept.data(), K,
                                  want_rows.data() + t * rows_per_step * dim, budget,
                                  want_pos.data() + t * rows_per_step);
    }
  }

  // The device: everything allocated and uploaded once.
  device_array<float> d_keys(keys.size()), d_all_scores(scores.size()), d_scores(N);
  device_array<i32> d_positions(positions.size()), d_offsets(offsets.size()),
      d_kept_offsets(kept_offsets.size()), d_window(window.size()), d_kept(K);
  device_array<std::byte> d_ws(ws_bytes);
  device_array<float> d_rows(rows_per_step * dim);
  device_array<i32> d_rows_pos(rows_per_step);
  device_array<float> d_out_rows(want_rows.size()), d_graph_rows(want_rows.size());
  device_array<i32> d_out_pos(want_pos.size()), d_graph_pos(want_pos.size());
  d_keys.upload(keys);
  d_all_scores.upload(scores);
  d_positions.upload(positions);
  d_offsets.upload(offsets);
  d_kept_offsets.upload(kept_offsets);
  d_window.upload(window);
  cuda_ok(cudaMemset(d_rows.p, 0, d_rows.n * sizeof(float)), "memset rows");
  cuda_ok(cudaMemset(d_rows_pos.p, 0xff, d_rows_pos.n * sizeof(i32)), "memset positions");

  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  block_cache cache;
  const auto policy = ::thrust::cuda::par_nosync(cache).on(stream);
  const kvsift::thrust::segmented_rows<float> src{d_keys.p, d_offsets.p, d_positions.p,
                                                  static_cast<std::int64_t>(capacity) * dim, S,
                                                  dim};
  // The step a graph captures: reads d_scores, writes d_rows / d_rows_pos.
  const auto step = [&] {
    kvsift::thrust::segmented_topk(policy, d_scores.p, d_offsets.p, S, N, d_kept_offsets.p, K,
                                   d_kept.p, d_ws.p, ws_bytes, {sink, d_window.p},
                                   /*check=*/false);
    kvsift::thrust::gather_rows(policy, src, d_kept_offsets.p, d_kept.p, K, d_rows.p, budget,
                                d_rows_pos.p);
  };
  const auto feed = [&](int t) {  // the step's data into the fixed buffer
    cuda_ok(cudaMemcpyAsync(d_scores.p, d_all_scores.p + t * N, N * sizeof(float),
                            cudaMemcpyDeviceToDevice, stream),
            "feed");
  };
  const auto keep = [&](int t, float* rows, i32* pos) {  // the step's outputs, kept apart
    cuda_ok(cudaMemcpyAsync(rows + t * rows_per_step * dim, d_rows.p,
                            rows_per_step * dim * sizeof(float), cudaMemcpyDeviceToDevice, stream),
            "keep rows");
    cuda_ok(cudaMemcpyAsync(pos + t * rows_per_step, d_rows_pos.p, rows_per_step * sizeof(i32),
                            cudaMemcpyDeviceToDevice, stream),
            "keep positions");
  };

  // Uncaptured: 64 steps (the first one warms the cache).
  for (int t = 0; t < steps; ++t) {
    feed(t);
    step();
    keep(t, d_out_rows.p, d_out_pos.p);
  }
  cuda_ok(cudaStreamSynchronize(stream), "uncaptured steps");
  const int warm_mallocs = cache.mallocs();

  // Captured once, in global mode; replayed 64 times.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  step();
  cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  CHECK(cache.mallocs() == warm_mallocs);  // nothing allocated inside the capture
  for (int t = 0; t < steps; ++t) {
    feed(t);
    cuda_ok(cudaGraphLaunch(exec, stream), "graph launch");
    keep(t, d_graph_rows.p, d_graph_pos.p);
  }
  cuda_ok(cudaStreamSynchronize(stream), "replayed steps");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);

  const auto out_pos = d_out_pos.download();
  const auto graph_pos = d_graph_pos.download();
  const auto out_rows = d_out_rows.download();
  const auto graph_rows = d_graph_rows.download();
  // Only the kept rows of each segment are written; compare those.
  for (int t = 0; t < steps; ++t) {
    CAPTURE(t);
    for (int s = 0; s < S; ++s) {
      for (int i = 0; i < kept_counts[s]; ++i) {
        const std::size_t r = static_cast<std::size_t>(t) * rows_per_step + s * budget + i;
        REQUIRE(graph_pos[r] == out_pos[r]);
        REQUIRE(out_pos[r] == want_pos[r]);
        for (int c = 0; c < dim; ++c) {
          REQUIRE(graph_rows[r * dim + c] == out_rows[r * dim + c]);
          REQUIRE(out_rows[r * dim + c] == want_rows[r * dim + c]);
        }
      }
    }
  }
}
