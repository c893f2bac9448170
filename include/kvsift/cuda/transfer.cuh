// SPDX-License-Identifier: Apache-2.0
#pragma once

// Asynchronous host <-> device movement of KV (the CUDA Transfer models) and FreeKV's
// double-buffered recall with HND -> NHD conversion. Mirrors transfer/basic.hpp (transfer::sync_copy).
//
// - async_transfer: submit a copy on a stream, poll it or make another stream wait for it;
//   the "submit/poll" seam of DESIGN §8. Host memory must be pinned for real overlap.
// - recall_gather<T>: the same recall as one kernel that reads the pinned host pool through
//   its device mapping (item list in device memory; graph-capturable).
// - streamed_recall<T>: recalls (page, kv_head) blocks from a pinned host pool stored as
//   HND pages [pages][kv_heads][2][page_size][d] into device page slots stored NHD
//   [slots][page_size][kv_heads][d] (keys and values apart). Copies go on a copy stream
//   into one of two staging buffers while the other is converted on the compute stream.

#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail.cuh>
#include <kvsift/cuda/error.cuh>
#include <kvsift/cuda/memory.cuh>
#include <kvsift/cuda/policy.cuh>

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvsift::cuda {

// Enqueues a copy of `count` elements between any two memory spaces on policy.stream
// (cudaMemcpyAsync with unified addressing). Overlaps with kernels only from pinned memory.
template <class T>
void copy_async(par policy, T* dst, const T* src, std::size_t count) {
  if (count == 0) {
    return;
  }
  require(dst != nullptr && src != nullptr, "cuda::copy_async", "dst/src", "null", "memory");
  check(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDefault, policy.stream),
        "cuda::copy_async");
}

// One in-flight transfer: submit(), then poll() (never blocks), wait_on(stream) (the stream
// waits on the device) or synchronize() (the host waits). Owns one event, created up front.
class async_transfer {
 public:
  async_transfer() = default;

  // Enqueues dst <- src (count elements) on policy.stream and marks its completion.
  template <class T>
  void submit(par policy, T* dst, const T* src, std::size_t count) {
    copy_async(policy, dst, src, count);
    done_.record(policy.stream);
    bytes_ += count * sizeof(T);
    submitted_ = true;
  }
  // Marks completion of whatever was enqueued on policy.stream so far (e.g. several copies).
  void mark(par policy) {
    done_.record(policy.stream);
    submitted_ = true;
  }
  // True when nothing was submitted or the last submission completed.
  [[nodiscard]] bool poll() const { return !submitted_ || done_.ready(); }
  // Orders later work on `policy.stream` after the last submission (no host blocking).
  void wait_on(par policy) const {
    if (submitted_) {
      done_.wait_on(policy.stream);
    }
  }
  void synchronize() const {
    if (submitted_) {
      done_.synchronize();
    }
  }
  // Bytes submitted through this object since construction (for stats()).
  [[nodiscard]] std::size_t bytes_submitted() const noexcept { return bytes_; }

 private:
  event done_{};
  std::size_t bytes_ = 0;
  bool submitted_ = false;
};

// One (page, kv_head) block to recall: host page `host_page`, KV head `head`, into device page
// slot `slot` of that head.
struct recall_item {
  std::int32_t host_page;
  std::int32_t head;
  std::int32_t slot;
};

// POD shape of a recall pool.
struct recall_shape {
  std::int32_t page_size = 32;     // tokens per page (FreeKV p = 32)
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t chunk_items = 64;   // items per staging buffer, 1 .. max_recall_chunk
  std::int32_t num_slots = -1;     // device page slots, when known: slot ids are checked against it
};

inline constexpr int max_recall_chunk = 64;

namespace detail {

inline void check_recall_shape(const char* where, const recall_shape& shape) {
  require(shape.page_size > 0, where, "shape.page_size", shape.page_size, "> 0");
  require(shape.num_kv_heads > 0, where, "shape.num_kv_heads", shape.num_kv_heads, "> 0");
  require(shape.head_dim > 0, where, "shape.head_dim", shape.head_dim, "> 0");
}

struct recall_chunk {
  std::int32_t count;
  std::int32_t head[max_recall_chunk];
  std::int32_t slot[max_recall_chunk];
};

// staging [count][2][p][d] (HND blocks) -> k_dev/v_dev [slots][p][kv_heads][d] (NHD)
template <Element T>
KVSIFT_KERNEL void hnd_blocks_to_nhd(const T* __restrict__ staging, recall_chunk chunk,
                                     recall_shape shape, T* __restrict__ k_dev,
                                     T* __restrict__ v_dev) {
  const std::int64_t block_elems = std::int64_t{2} * shape.page_size * shape.head_dim;
  const std::int64_t half_elems = block_elems / 2;
  for (std::int32_t item = blockIdx.x; item < chunk.count; item += gridDim.x) {
    const T* src = staging + item * block_elems;
    const std::int64_t slot = chunk.slot[item];
    const std::int32_t head = chunk.head[item];
    // consecutive threads move consecutive channels: coalesced reads and writes
    for (std::int64_t i = threadIdx.x; i < block_elems; i += blockDim.x) {
      const bool is_v = i >= half_elems;
      const std::int64_t e = is_v ? i - half_elems : i;
      const std::int64_t t = e / shape.head_dim;
      const std::int64_t c = e % shape.head_dim;
      T* dst = is_v ? v_dev : k_dev;
      dst[((slot * shape.page_size + t) * shape.num_kv_heads + head) * shape.head_dim + c] =
          src[i];
    }
  }
}

}  // namespace detail

// Double-buffered streamed recall (FreeKV). Construct once (creates its events); each call to
// run() needs a device workspace of workspace_bytes(shape) and uses no other memory.
template <Element T>
class streamed_recall {
 public:
  // Validates the shape (kvsift::error) before creating any CUDA resource.
  explicit streamed_recall(recall_shape shape) : shape_(validated(shape)) {}

  // Elements of one (page, head) block: keys and values of page_size tokens.
  [[nodiscard]] static std::size_t block_elems(const recall_shape& s) noexcept {
    return std::size_t{2} * s.page_size * s.head_dim;
  }
  // Device workspace run() needs: two staging buffers of chunk_items blocks.
  [[nodiscard]] static std::size_t workspace_bytes(const recall_shape& s) noexcept {
    workspace_carver c;
    (void)c.take<T>(block_elems(s) * s.chunk_items);
    (void)c.take<T>(block_elems(s) * s.chunk_items);
    return c.used();
  }
  [[nodiscard]] const recall_shape& shape() const noexcept { return shape_; }

  // Recalls `items` (host list, may be empty) from `host_pool` into the device slots.
  //   compute      policy whose stream runs the conversions; later work on it sees the result
  //   copy_stream  stream for the host->device copies (may equal compute.stream: no overlap)
  //   host_pool    pinned [num_pages][num_kv_heads][2][page_size][head_dim]
  //   k_dev, v_dev device [num_slots][page_size][num_kv_heads][head_dim]
  //   workspace    >= workspace_bytes(shape()) device bytes
  // The host list is read during the call only; no host synchronisation. Validation of item
  // ranges is the caller's (page < num_pages, head < num_kv_heads, slot < num_slots).
  void run(par compute, cudaStream_t copy_stream, const T* host_pool,
           std::span<const recall_item> items, T* k_dev, T* v_dev, void* workspace,
           std::size_t workspace_size) {
    constexpr const char* where = "cuda::streamed_recall::run";
    require(workspace_size >= workspace_bytes(shape_), where, "workspace_size", workspace_size,
            ">= workspace_bytes(shape)");
    if (items.empty()) {
      return;
    }
    require(host_pool != nullptr && k_dev != nullptr && v_dev != nullptr && workspace != nullptr,
            where, "host_pool/k_dev/v_dev/workspace", "null", "memory");
    for (const recall_item& it : items) {
      require(it.host_page >= 0 && it.head >= 0 && it.head < shape_.num_kv_heads && it.slot >= 0,
              where, "items[].head", it.head, "page, slot >= 0 and head < num_kv_heads");
    }
    const std::size_t blk = block_elems(shape_);
    workspace_carver c(workspace);
    T* staging[2] = {c.take<T>(blk * shape_.chunk_items), c.take<T>(blk * shape_.chunk_items)};
    // new copies must not overwrite staging still read by earlier work on the compute stream
    start_.record(compute.stream);
    start_.wait_on(copy_stream);
    const std::size_t n = items.size();
    for (std::size_t first = 0, chunk = 0; first < n; first += shape_.chunk_items, ++chunk) {
      const int b = static_cast<int>(chunk % 2);
      if (chunk >= 2) {
        freed_[b].wait_on(copy_stream);  // buffer b's previous conversion finished
      }
      detail::recall_chunk meta{};
      meta.count = static_cast<std::int32_t>(
          n - first < static_cast<std::size_t>(shape_.chunk_items) ? n - first
                                                                     : shape_.chunk_items);
      for (std::int32_t i = 0; i < meta.count; ++i) {
        const recall_item& it = items[first + i];
        meta.head[i] = it.head;
        meta.slot[i] = it.slot;
        const T* src =
            host_pool + (std::size_t(it.host_page) * shape_.num_kv_heads + it.head) * blk;
        check(cudaMemcpyAsync(staging[b] + i * blk, src, blk * sizeof(T),
                              cudaMemcpyHostToDevice, copy_stream),
              where);
      }
      filled_[b].record(copy_stream);
      filled_[b].wait_on(compute.stream);
      detail::hnd_blocks_to_nhd<T><<<static_cast<unsigned>(meta.count), 256, 0, compute.stream>>>(
          staging[b], meta, shape_, k_dev, v_dev);
      check_launch(where);
      freed_[b].record(compute.stream);
    }
    bytes_ += n * blk * sizeof(T);
  }

  // Bytes moved over PCIe by this object since construction.
  [[nodiscard]] std::size_t bytes_recalled() const noexcept { return bytes_; }

 private:
  static recall_shape validated(const recall_shape& shape) {
    constexpr const char* where = "cuda::streamed_recall";
    detail::check_recall_shape(where, shape);
    require(shape.chunk_items >= 1 && shape.chunk_items <= max_recall_chunk, where,
            "shape.chunk_items", shape.chunk_items, "in [1, 64]");
    return shape;
  }

  recall_shape shape_;  // declared first: initialised (validated) before the events
  event start_{};
  event filled_[2]{event{}, event{}};
  event freed_[2]{event{}, event{}};
  std::size_t bytes_ = 0;
};

namespace detail {

// One block per item (grid-stride): the item's HND block [2][p][d] is read straight from
// mapped pinned host memory over PCIe in 16-byte units, four in flight per thread, and written
// to its NHD rows. An item with a head, page or slot out of range writes nothing.
template <Element T>
KVSIFT_KERNEL void __launch_bounds__(256)
    recall_gather_kernel(const T* __restrict__ host_pool, const recall_item* __restrict__ items,
                         std::int32_t count, std::int32_t num_pages, recall_shape shape,
                         T* __restrict__ k_dev, T* __restrict__ v_dev) {
  constexpr int vec = 16 / static_cast<int>(sizeof(T));
  constexpr int in_flight = 4;
  const std::int32_t row_units = shape.head_dim / vec;
  const std::int32_t half_units = shape.page_size * row_units;  // keys, then values
  for (std::int32_t i = blockIdx.x; i < count; i += gridDim.x) {
    const recall_item it = items[i];
    if (it.head < 0 || it.head >= shape.num_kv_heads || it.host_page < 0 ||
        it.host_page >= num_pages || it.slot < 0 ||
        (shape.num_slots >= 0 && it.slot >= shape.num_slots)) {
      continue;
    }
    const uint4* src = reinterpret_cast<const uint4*>(
        host_pool + (std::int64_t{it.host_page} * shape.num_kv_heads + it.head) * 2 *
                        shape.page_size * shape.head_dim);
    for (std::int32_t u0 = threadIdx.x; u0 < 2 * half_units; u0 += in_flight * blockDim.x) {
      uint4 part[in_flight];
#pragma unroll
      for (int j = 0; j < in_flight; ++j) {
        const std::int32_t u = u0 + j * blockDim.x;
        if (u < 2 * half_units) {
          part[j] = src[u];
        }
      }
#pragma unroll
      for (int j = 0; j < in_flight; ++j) {
        const std::int32_t u = u0 + j * blockDim.x;
        if (u < 2 * half_units) {
          const bool is_v = u >= half_units;
          const std::int32_t e = is_v ? u - half_units : u;
          const std::int64_t t = e / row_units;
          const std::int64_t c = std::int64_t{e % row_units} * vec;
          T* dst = is_v ? v_dev : k_dev;
          *reinterpret_cast<uint4*>(
              dst + ((std::int64_t{it.slot} * shape.page_size + t) * shape.num_kv_heads +
                     it.head) * shape.head_dim + c) = part[j];
        }
      }
    }
  }
}

}  // namespace detail

// The recall as one gather kernel (no staging, no per-block copies): the kernel reads each
// item's HND block [2][p][d] from the pinned host pool through its device mapping (unified
// addressing maps every cudaMallocHost allocation) and writes the NHD slot rows, all on
// policy.stream. `items` is a device array of `count` recall_items, so a captured step replays
// it with whatever list the engine wrote there; `count` is a shape. Item fields out of range
// (head, page >= num_pages, negative or >= shape.num_slots when known) are skipped on the
// device. Needs head_dim * sizeof(T) a multiple of 16 bytes and 16-byte aligned pool and slots.
template <Element T>
void recall_gather(par policy, recall_shape shape, const T* host_pool, std::int32_t num_pages,
                   const recall_item* items, std::int32_t count, T* k_dev, T* v_dev) {
  constexpr const char* where = "cuda::recall_gather";
  detail::check_recall_shape(where, shape);
  require(shape.head_dim * sizeof(T) % 16 == 0, where, "shape.head_dim", shape.head_dim,
          "a multiple of 16 bytes of channels");
  require(count >= 0, where, "count", count, ">= 0");
  require(num_pages >= 0, where, "num_pages", num_pages, ">= 0");
  if (count == 0) {
    return;
  }
  require(host_pool != nullptr && items != nullptr && k_dev != nullptr && v_dev != nullptr,
          where, "host_pool/items/k_dev/v_dev", "null", "memory");
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  require(aligned(host_pool) && aligned(k_dev) && aligned(v_dev), where, "host_pool/k_dev/v_dev",
          "not 16-byte aligned", "16-byte aligned arrays");
  const unsigned grid = static_cast<unsigned>(count < 65535 * 8 ? count : 65535 * 8);
  detail::recall_gather_kernel<T><<<grid, 256, 0, policy.stream>>>(host_pool, items, count,
                                                                    num_pages, shape, k_dev,
                                                                    v_dev);
  check_launch(where);
}

// Converts whole HND pages [pages][kv_heads][2][p][d] (device) into NHD slots, page i -> slot
// slots[i] for every head (the non-streamed form of the conversion, e.g. after a bulk copy).
template <Element T>
void hnd_pages_to_nhd(par policy, recall_shape shape, const T* hnd_pages,
                      std::span<const std::int32_t> slots, T* k_dev, T* v_dev) {
  constexpr const char* where = "cuda::hnd_pages_to_nhd";
  detail::check_recall_shape(where, shape);
  if (slots.empty()) return;
  require(hnd_pages != nullptr, where, "hnd_pages", "null", "a device [pages][kv_heads][2][p][d] array");
  require(k_dev != nullptr && v_dev != nullptr, where, "k_dev/v_dev", "null",
          "device [slots][p][kv_heads][d] arrays");
  for (std::size_t i = 0; i < slots.size(); ++i) {
    require(slots[i] >= 0 && (shape.num_slots < 0 || slots[i] < shape.num_slots), where,
            [&] { return "slots[" + std::to_string(i) + "]"; }, slots[i], [&] {
              return shape.num_slots < 0
                         ? std::string(">= 0")
                         : "a device slot in [0, num_slots = " + std::to_string(shape.num_slots) + ")";
            });
  }
  const std::size_t blk = std::size_t{2} * shape.page_size * shape.head_dim;
  detail::recall_chunk meta{};
  std::size_t done = 0;
  // every (page, head) block is contiguous in HND: feed the same kernel in chunks
  const std::size_t total = slots.size() * shape.num_kv_heads;
  while (done < total) {
    meta.count = 0;
    const std::size_t first = done;
    while (done < total && meta.count < max_recall_chunk) {
      meta.head[meta.count] = static_cast<std::int32_t>(done % shape.num_kv_heads);
      meta.slot[meta.count] = slots[done / shape.num_kv_heads];
      ++meta.count;
      ++done;
    }
    detail::hnd_blocks_to_nhd<T><<<static_cast<unsigned>(meta.count), 256, 0, policy.stream>>>(
        hnd_pages + first * blk, meta, shape, k_dev, v_dev);
    check_launch(where);
  }
}

}  // namespace kvsift::cuda
