// SPDX-License-Identifier: Apache-2.0
#pragma once

// thrust::tiered_store — store::tiered over an exec's memory: the device half of the two-tier
// store of the dynamic methods (SyncKV, HeteroCache, FreeKV), as thrust::dense_store is the
// device half of store::dense.
//
//   kvsift::thrust::sim_arena arena;
//   kvsift::exec::sim_cpp e{arena};
//   kvsift::thrust::tiered_store<half, kvsift::exec::sim_cpp> st(e, shape, requests,
//                                                                /*host_capacity=*/4096,
//                                                                /*tier_capacity=*/512);
//   st.append(request, layer, k, v, first_position);   // k, v: kv_view in E's memory
//   st.retain(request, layer, kept_counts, kept);       // host counts, device plan indices
//   st.install(seqs, counts, positions);                // host seqs + counts, device positions
//   auto n = st.plan_sorted(seqs, offsets, slots, positions);   // the read plan, by position
//
// Who owns what. Everything is E memory the store allocates once, at construction, from the
// declared capacities (requests, host_capacity tokens per head-sequence in the host pool,
// tier_capacity rows per head-sequence in the device tier): the pool's and the tier's rows,
// their positions, the sorted plan, the free-slot stacks, the lengths, and the scratch of a
// retain, an install and a plan. Nothing is allocated after construction: every kernel is a
// Thrust for_each, fill_n or copy_n on E's policy, so no call asks Thrust for temporary storage
// (no sort, no scan: the test checks that the arena sees not even a cache hit once warm).
//
// Contract: device-tier slots are unordered and the plan is sorted by position, so an install
// copies only arriving rows and no resident row moves. Counts are host shadows; the data decides
// which rows, never how many. Host-visible arguments throw before anything changes; bad values
// in E memory are raised by the next check(). Laws (tests/thrust/test_tiered_store.cpp): the
// same rows as store::tiered after the same calls; once warm nothing allocates or reads back.
// Layout, installs, errors: docs/architecture.md, "Design notes from the headers".

#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/shape.hpp>
#include <kvsift/core/view.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/thrust/common.hpp>
#include <kvsift/thrust/exec.hpp>

#include <thrust/copy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift::thrust {

// Strided rows of every segment, `capacity` slots each: the tiered store's device tier (slots
// unordered) and host pool (positions ascending), as the Thrust algorithms address them.
template <class T>
struct tier_rows {
  T* keys = nullptr;                  // [num_segments, capacity, dim]
  T* values = nullptr;                // [num_segments, capacity, dim]
  std::int32_t* positions = nullptr;  // [num_segments, capacity]
  int num_segments = 0;
  int capacity = 0;
  int dim = 0;

  // The tier as attention / scorers read it, with lengths from `offsets` (CSR, device).
  [[nodiscard]] segmented_rows<T> key_rows(const std::int32_t* offsets) const {
    return {keys, offsets, positions, static_cast<std::int64_t>(capacity) * dim, num_segments, dim};
  }
  [[nodiscard]] segmented_rows<T> value_rows(const std::int32_t* offsets) const {
    return {values, offsets, positions, static_cast<std::int64_t>(capacity) * dim, num_segments, dim};
  }
  void validate(std::string_view where) const {
    require(num_segments >= 0, where, "tier.num_segments", num_segments, ">= 0");
    require(capacity > 0, where, "tier.capacity", capacity, "> 0");
    require(dim > 0, where, "tier.dim", dim, "> 0");
    require(num_segments == 0 || (keys != nullptr && values != nullptr && positions != nullptr),
            where, "tier", "null", "[num_segments, capacity, dim] rows and their positions");
  }
};

// The working sets' rows as a reader sees them, slot by slot: a resident slot's row is in the
// device tier; a far slot (placed by an install under far_tier::attend, which moves no row) reads
// the host pool's row where it lies. Every reader of plan slots goes through it.
template <class T>
struct working_rows {
  const T* tier_keys;
  const T* tier_values;
  const T* pool_keys;
  const T* pool_values;
  const std::int32_t* slot_pool;  // [sequences, tier_capacity]: a far slot's pool row, else -1
  std::int64_t tier_capacity, host_capacity;
  int dim;

  [[nodiscard]] KVSIFT_HOST_DEVICE bool far(std::int64_t seq, std::int32_t slot) const {
    return slot_pool[seq * tier_capacity + slot] >= 0;
  }
  [[nodiscard]] KVSIFT_HOST_DEVICE const T* key(std::int64_t seq, std::int32_t slot) const {
    return row(tier_keys, pool_keys, seq, slot);
  }
  [[nodiscard]] KVSIFT_HOST_DEVICE const T* value(std::int64_t seq, std::int32_t slot) const {
    return row(tier_values, pool_values, seq, slot);
  }

 private:
  [[nodiscard]] KVSIFT_HOST_DEVICE const T* row(const T* tier, const T* pool, std::int64_t seq,
                                                std::int32_t slot) const {
    const std::int32_t j = slot_pool[seq * tier_capacity + slot];
    return j < 0 ? tier + (seq * tier_capacity + slot) * dim : pool + (seq * host_capacity + j) * dim;
  }
};

namespace detail {

inline constexpr int tier_rank_block = 32;  // flags per block of the per-target rank passes

// Slots of every head-sequence of [seq0, seq0 + count) freed: positions -1, free stack full
// (entry k = capacity - 1 - k, so appends to an empty working set fill slots 0, 1, 2, ...).
struct tier_clear_fn {
  std::int32_t* slot_positions;  // [sequences, capacity]
  std::int32_t* free_slots;      // [sequences, capacity]
  std::int64_t first;            // seq0 * capacity
  int capacity;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int k = static_cast<int>(e % capacity);
    slot_positions[first + e] = -1;
    free_slots[first + e] = capacity - 1 - k;
  }
};

// offsets[s] = s * capacity for s <= sequences: the slot view's constant CSR.
struct slot_offsets_fn {
  std::int32_t* offsets;
  int capacity;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t s) const {
    offsets[s] = static_cast<std::int32_t>(s * capacity);
  }
};

// Appends tokens [0, tokens) of every KV head of a (request, layer) to the pool (at index
// pool_length + t) and to the working set (a slot popped from the free stack; plan entry
// length + t), with position first + t.
template <class T, class L, class Space>
struct tiered_append_fn {
  kv_view<const T, L, Space> k, v;
  T* pool_keys;
  T* pool_values;
  std::int32_t* pool_positions;  // [sequences, host_capacity]
  T* tier_keys;
  T* tier_values;
  std::int32_t* slot_positions;  // [sequences, tier_capacity]
  std::int32_t* plan_slots;      // [sequences, tier_capacity]
  std::int32_t* plan_positions;  // [sequences, tier_capacity]
  std::int32_t* slot_pool;       // [sequences, tier_capacity]: -1 (a new row is resident)
  const std::int32_t* free_slots;
  const std::int32_t* lengths;   // before the append
  std::int64_t seq0;
  std::int64_t host_capacity;
  int tier_capacity;
  int pool_length;               // before the append (the same for every head)
  std::int32_t first;
  int* nonfinite;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int d = k.dim;
    const int c = static_cast<int>(e % d);
    const std::int64_t th = e / d;
    const int h = static_cast<int>(th % k.heads);
    const int t = static_cast<int>(th / k.heads);
    const std::int64_t seq = seq0 + h;
    const std::int64_t base = seq * tier_capacity;
    const int n = lengths[seq];
    const std::int32_t slot = free_slots[base + (tier_capacity - n) - 1 - t];
    const std::int64_t prow = seq * host_capacity + pool_length + t;
    const std::int64_t trow = base + slot;
    const T key = k.row(t, h)[c];
    const T value = v.row(t, h)[c];
    pool_keys[prow * d + c] = key;
    pool_values[prow * d + c] = value;
    tier_keys[trow * d + c] = key;
    tier_values[trow * d + c] = value;
    const float fk = to_float(key), fv = to_float(value);
    if (!(fk - fk == 0.0f && fv - fv == 0.0f)) *nonfinite = 1;  // x - x is NaN for NaN and Inf
    if (c == 0) {
      const std::int32_t pos = first + t;
      pool_positions[prow] = pos;
      slot_positions[trow] = pos;
      slot_pool[trow] = -1;
      plan_slots[base + n + t] = slot;
      plan_positions[base + n + t] = pos;
    }
  }
};

// A retain's kept plan indices checked against the heads' lengths: bad[h] = 1 (and *error) when
// an index is outside [0, length) or not above its predecessor.
struct tiered_check_kept_fn {
  const std::int32_t* kept;          // caller's, [num_kept]
  const std::int32_t* kept_offsets;  // [heads + 1]
  const std::int32_t* lengths;
  std::int64_t seq0;
  int heads;
  int* bad;                          // [heads]
  int* error;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int h = segment_of(kept_offsets, heads, t);
    const std::int64_t i = t - kept_offsets[h];
    const std::int32_t s = kept[t];
    if (!(s >= 0 && s < lengths[seq0 + h] && (i == 0 || kept[t - 1] < s))) {
      bad[h] = 1;
      *error = 1;
    }
  }
};

// checked[t] = the kept index, or i (the head keeps its first rows) when the head's set is bad.
struct tiered_kept_fn {
  const std::int32_t* kept;
  const std::int32_t* kept_offsets;
  int heads;
  const int* bad;
  std::int32_t* checked;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int h = segment_of(kept_offsets, heads, t);
    checked[t] = bad[h] != 0 ? static_cast<std::int32_t>(t - kept_offsets[h]) : kept[t];
  }
};

// A retain frees the slot of every plan entry i < length not kept: its slot goes to free-stack
// entry (capacity - length) + (its rank among the leaving entries).
struct tiered_retain_free_fn {
  const std::int32_t* checked;       // ascending per head
  const std::int32_t* kept_offsets;
  const std::int32_t* lengths;       // before the retain
  const std::int32_t* plan_slots;
  std::int32_t* slot_positions;
  std::int32_t* free_slots;
  std::int64_t seq0;
  int capacity;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int h = static_cast<int>(e / capacity);
    const int i = static_cast<int>(e % capacity);
    const std::int64_t seq = seq0 + h;
    const int n = lengths[seq];
    if (i >= n) return;
    const std::int32_t* kept = checked + kept_offsets[h];
    const int m = kept_offsets[h + 1] - kept_offsets[h];
    const int below = count_below(kept, m, i);
    if (below < m && kept[below] == i) return;  // kept
    const std::int64_t base = seq * capacity;
    const std::int32_t slot = plan_slots[base + i];
    slot_positions[base + slot] = -1;
    free_slots[base + (capacity - n) + (i - below)] = slot;
  }
};

// The kept plan entries, through scratch (kept entry j may be read at index kept[j'] = j).
struct tiered_plan_gather_fn {
  const std::int32_t* checked;
  const std::int32_t* kept_offsets;
  int heads;
  const std::int32_t* plan_slots;
  const std::int32_t* plan_positions;
  std::int64_t seq0;
  int capacity;
  std::int32_t* scratch_slots;
  std::int32_t* scratch_positions;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int h = segment_of(kept_offsets, heads, t);
    const std::int64_t from = (seq0 + h) * capacity + checked[t];
    scratch_slots[t] = plan_slots[from];
    scratch_positions[t] = plan_positions[from];
  }
};
struct tiered_plan_scatter_fn {
  const std::int32_t* kept_offsets;
  int heads;
  const std::int32_t* scratch_slots;
  const std::int32_t* scratch_positions;
  std::int32_t* plan_slots;
  std::int32_t* plan_positions;
  std::int64_t seq0;
  int capacity;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int h = segment_of(kept_offsets, heads, t);
    const std::int64_t to = (seq0 + h) * capacity + (t - kept_offsets[h]);
    plan_slots[to] = scratch_slots[t];
    plan_positions[to] = scratch_positions[t];
  }
};

// lengths[seq0 + h] = kept_offsets[h + 1] - kept_offsets[h].
struct tiered_set_lengths_fn {
  std::int32_t* lengths;
  const std::int32_t* kept_offsets;
  std::int64_t seq0;
  KVSIFT_HOST_DEVICE void operator()(int h) const {
    lengths[seq0 + h] = kept_offsets[h + 1] - kept_offsets[h];
  }
};

// An install's descriptor: target r is head-sequence seqs[r] and gets offsets[r + 1] -
// offsets[r] positions. Scratch is padded per target: entry (r, i) at r * capacity + i.
struct install_desc {
  const std::int32_t* offsets;  // [targets + 1]
  const std::int32_t* seqs;     // [targets]
  int capacity;                 // tier slots per head-sequence
  KVSIFT_HOST_DEVICE int target(std::int64_t e) const { return static_cast<int>(e / capacity); }
  KVSIFT_HOST_DEVICE int index(std::int64_t e) const { return static_cast<int>(e % capacity); }
  KVSIFT_HOST_DEVICE int count(int r) const { return offsets[r + 1] - offsets[r]; }
  KVSIFT_HOST_DEVICE std::int64_t seq(int r) const { return seqs[r]; }
};

// Positions of target r: ascending and each in the target's pool, else bad[r] (and *error).
struct install_check_fn {
  install_desc desc;
  const std::int32_t* positions;       // caller's, CSR by desc.offsets
  const std::int32_t* pool_positions;  // [sequences, host_capacity]
  const std::int32_t* pool_lengths;    // [requests * layers]
  std::int64_t host_capacity;
  int heads;
  int* bad;
  int* error;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int r = desc.target(e);
    const int i = desc.index(e);
    if (i >= desc.count(r)) return;
    const std::int64_t seq = desc.seq(r);
    const std::int64_t t = desc.offsets[r] + i;
    const std::int32_t pos = positions[t];
    const int plen = pool_lengths[seq / heads];
    const bool ok = (i == 0 || positions[t - 1] < pos) &&
                    find_sorted(pool_positions + seq * host_capacity, plen, pos) >= 0;
    if (!ok) {
      bad[r] = 1;
      *error = 1;
    }
  }
};

// want[(r, i)] = the target's i-th position, or the pool's newest count(r) when r is bad.
struct install_want_fn {
  install_desc desc;
  const std::int32_t* positions;
  const std::int32_t* pool_positions;
  const std::int32_t* pool_lengths;
  std::int64_t host_capacity;
  int heads;
  const int* bad;
  std::int32_t* want;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int r = desc.target(e);
    const int i = desc.index(e);
    const int n = desc.count(r);
    if (i >= n) return;
    const std::int64_t seq = desc.seq(r);
    want[e] = bad[r] == 0 ? positions[desc.offsets[r] + i]
                          : pool_positions[seq * host_capacity + pool_lengths[seq / heads] - n + i];
  }
};

// For each (r, i): leave[e] = 1 when old plan entry i leaves (not among the new positions);
// arrive[e] = 1 when new position i is not resident, else slot[e] = its resident slot.
struct install_classify_fn {
  install_desc desc;
  const std::int32_t* want;
  const std::int32_t* lengths;  // before the install
  const std::int32_t* plan_slots;
  const std::int32_t* plan_positions;
  std::int32_t* leave;
  std::int32_t* arrive;
  std::int32_t* slot;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int r = desc.target(e);
    const int i = desc.index(e);
    const int n = desc.count(r);
    const std::int64_t base = desc.seq(r) * desc.capacity;
    const int old = lengths[desc.seq(r)];
    const std::int32_t* w = want + static_cast<std::int64_t>(r) * desc.capacity;
    leave[e] = i < old && find_sorted(w, n, plan_positions[base + i]) < 0 ? 1 : 0;
    if (i < n) {
      const int j = find_sorted(plan_positions + base, old, w[i]);
      arrive[e] = j < 0 ? 1 : 0;
      slot[e] = j < 0 ? -1 : plan_slots[base + j];
    } else {
      arrive[e] = 0;
    }
  }
};

// Per-target exclusive ranks of flags in [targets, capacity], in blocks of tier_rank_block:
//   count: block[r, b] = flags set in block b of target r
//   scan:  block[r, b] = flags set in blocks before b (and totals[seqs[r]] += the target's total)
//   rank:  flags[e] = its rank among the target's set flags, or -1 when not set
struct rank_count_fn {
  const std::int32_t* flags;
  std::int32_t* block;
  int capacity;
  int blocks;  // per target
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t r = e / blocks;
    const int b = static_cast<int>(e % blocks);
    const int lo = b * tier_rank_block;
    const int hi = lo + tier_rank_block < capacity ? lo + tier_rank_block : capacity;
    int sum = 0;
    for (int i = lo; i < hi; ++i) sum += flags[r * capacity + i] != 0 ? 1 : 0;
    block[e] = sum;
  }
};
struct rank_scan_fn {
  std::int32_t* block;
  int blocks;
  const std::int32_t* seqs;  // with totals: [targets]
  std::int64_t* totals;      // [sequences] or null
  KVSIFT_HOST_DEVICE void operator()(int r) const {
    std::int32_t run = 0;
    for (int b = 0; b < blocks; ++b) {
      const std::int64_t at = static_cast<std::int64_t>(r) * blocks + b;
      const std::int32_t v = block[at];
      block[at] = run;
      run += v;
    }
    if (totals != nullptr) totals[seqs[r]] += run;
  }
};
struct rank_assign_fn {
  std::int32_t* flags;
  const std::int32_t* block;
  int capacity;
  int blocks;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t r = e / blocks;
    const int b = static_cast<int>(e % blocks);
    const int lo = b * tier_rank_block;
    const int hi = lo + tier_rank_block < capacity ? lo + tier_rank_block : capacity;
    std::int32_t run = block[e];
    for (int i = lo; i < hi; ++i) {
      std::int32_t& f = flags[r * capacity + i];
      f = f != 0 ? run++ : -1;
    }
  }
};

// Leaving row (r, i) (leave rank k >= 0): its slot is freed and pushed at free-stack entry
// (capacity - old length) + k.
struct install_free_fn {
  install_desc desc;
  const std::int32_t* leave_rank;
  const std::int32_t* lengths;  // before the install
  const std::int32_t* plan_slots;
  std::int32_t* slot_positions;
  std::int32_t* free_slots;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int32_t k = leave_rank[e];
    if (k < 0) return;
    const int r = desc.target(e);
    const int i = desc.index(e);
    const std::int64_t seq = desc.seq(r);
    const std::int64_t base = seq * desc.capacity;
    const std::int32_t slot = plan_slots[base + i];
    slot_positions[base + slot] = -1;
    free_slots[base + (desc.capacity - lengths[seq]) + k] = slot;
  }
};

// New plan entry (r, i): a resident position keeps its slot; an arriving one (arrive rank
// k >= 0) pops free-stack entry (capacity - count) + k, and its pool index goes to pool_index.
struct install_place_fn {
  install_desc desc;
  const std::int32_t* want;
  const std::int32_t* arrive_rank;
  const std::int32_t* slot;
  const std::int32_t* free_slots;
  const std::int32_t* pool_positions;
  const std::int32_t* pool_lengths;
  std::int64_t host_capacity;
  int heads;
  std::int32_t* slot_positions;
  std::int32_t* plan_slots;
  std::int32_t* plan_positions;
  std::int32_t* pool_index;  // [(r, i)]: the pool row of an arrival, -1 for a resident row
  std::int32_t* slot_pool;   // [sequences, tier_capacity]: an arrival's pool row if far, else -1
  bool far;                  // far_tier::attend: arrivals are placed, not copied
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int r = desc.target(e);
    const int i = desc.index(e);
    const int n = desc.count(r);
    pool_index[e] = -1;  // every entry: the scratch held leave ranks
    if (i >= n) return;
    const std::int64_t seq = desc.seq(r);
    const std::int64_t base = seq * desc.capacity;
    const std::int32_t pos = want[e];
    const std::int32_t k = arrive_rank[e];
    std::int32_t s = slot[e];
    if (k >= 0) {
      s = free_slots[base + (desc.capacity - n) + k];
      slot_positions[base + s] = pos;
      pool_index[e] = find_sorted(pool_positions + seq * host_capacity, pool_lengths[seq / heads], pos);
      slot_pool[base + s] = far ? pool_index[e] : -1;
    }
    plan_slots[base + i] = s;
    plan_positions[base + i] = pos;
  }
};

// The recall: each arrival's row copied from the pool into its slot.
template <class T>
struct install_copy_fn {
  install_desc desc;
  const std::int32_t* pool_index;
  const std::int32_t* plan_slots;  // the new plan
  const T* pool_keys;
  const T* pool_values;
  T* tier_keys;
  T* tier_values;
  std::int64_t host_capacity;
  int dim;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t ri = e / dim;
    const int c = static_cast<int>(e % dim);
    const std::int32_t j = pool_index[ri];
    if (j < 0) return;
    const int r = desc.target(ri);
    const int i = desc.index(ri);
    const std::int64_t seq = desc.seq(r);
    const std::int64_t to = seq * desc.capacity + plan_slots[seq * desc.capacity + i];
    const std::int64_t from = seq * host_capacity + j;
    tier_keys[to * dim + c] = pool_keys[from * dim + c];
    tier_values[to * dim + c] = pool_values[from * dim + c];
  }
};

struct install_lengths_fn {
  install_desc desc;
  std::int32_t* lengths;
  KVSIFT_HOST_DEVICE void operator()(int r) const { lengths[desc.seq(r)] = desc.count(r); }
};

// far[seq] = the far slots (slot_pool >= 0) of head-sequence seq's working set.
struct far_slots_fn {
  const std::int32_t* lengths;
  const std::int32_t* plan_slots;
  const std::int32_t* slot_pool;
  int capacity;
  std::int32_t* far;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t seq) const {
    const std::int64_t base = seq * capacity;
    std::int32_t n = 0;
    for (int i = 0; i < lengths[seq]; ++i) n += slot_pool[base + plan_slots[base + i]] >= 0 ? 1 : 0;
    far[seq] = n;
  }
};

// The plan of listed head-sequences packed: entry t of target r = plan entry t - offsets[r].
struct plan_pack_fn {
  const std::int32_t* offsets;  // [targets + 1]
  const std::int32_t* seqs;     // [targets]
  int targets;
  int capacity;
  const std::int32_t* plan_slots;
  const std::int32_t* plan_positions;
  std::int32_t* slots_out;
  std::int32_t* positions_out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int r = segment_of(offsets, targets, t);
    const std::int64_t from = static_cast<std::int64_t>(seqs[r]) * capacity + (t - offsets[r]);
    if (slots_out != nullptr) slots_out[t] = plan_slots[from];
    if (positions_out != nullptr) positions_out[t] = plan_positions[from];
  }
};

}  // namespace detail

template <Element T, DeviceExec E>
class tiered_store {
 public:
  using element_type = T;
  using exec_type = E;
  using memory_space = typename E::memory_space;

  // `host_capacity` tokens per head-sequence in the pool (fixed: the pool never reallocates);
  // `tier_capacity` rows per head-sequence in the device tier (the most a working set holds:
  // appends and installs beyond it are refused).
  tiered_store(const E& exec, model_shape shape, int requests, int host_capacity,
               int tier_capacity)
      : exec_(exec), shape_(checked_shape(shape)), requests_(requests),
        host_capacity_(host_capacity), tier_capacity_(tier_capacity),
        sequences_(checked_sequences(shape, requests, host_capacity, tier_capacity)),
        blocks_((tier_capacity_ + detail::tier_rank_block - 1) / detail::tier_rank_block),
        pool_keys_(exec, slots(host_capacity_) * shape_.head_dim),
        pool_values_(exec, slots(host_capacity_) * shape_.head_dim),
        pool_positions_(exec, slots(host_capacity_)),
        pool_lengths_(exec, static_cast<std::size_t>(requests_) * shape_.layers),
        tier_keys_(exec, slots(tier_capacity_) * shape_.head_dim),
        tier_values_(exec, slots(tier_capacity_) * shape_.head_dim),
        slot_positions_(exec, slots(tier_capacity_)),
        slot_pool_(exec, slots(tier_capacity_)),
        plan_slots_(exec, slots(tier_capacity_)),
        plan_positions_(exec, slots(tier_capacity_)),
        free_slots_(exec, slots(tier_capacity_)),
        lengths_(exec, static_cast<std::size_t>(sequences_)),
        slot_offsets_(exec, static_cast<std::size_t>(sequences_) + 1),
        recalled_(exec, static_cast<std::size_t>(sequences_)),
        far_slots_(exec, static_cast<std::size_t>(sequences_)),
        error_(exec, 3),
        desc_(exec, 2 * static_cast<std::size_t>(sequences_) + 2),
        bad_(exec, static_cast<std::size_t>(sequences_)),
        scratch_a_(exec, slots(tier_capacity_)),
        scratch_b_(exec, slots(tier_capacity_)),
        scratch_c_(exec, slots(tier_capacity_)),
        scratch_d_(exec, slots(tier_capacity_)),
        blocks_scratch_(exec, static_cast<std::size_t>(sequences_) * blocks_),
        length_(static_cast<std::size_t>(sequences_), 0),
        host_length_(static_cast<std::size_t>(requests_) * shape_.layers, 0),
        next_(static_cast<std::size_t>(requests_) * shape_.layers, 0),
        host_desc_(2 * static_cast<std::size_t>(sequences_) + 2, 0),
        seen_(static_cast<std::size_t>(sequences_), 0) {
    const auto policy = exec_.policy();
    const ::thrust::counting_iterator<std::int64_t> zero(0);
    ::thrust::fill_n(policy, lengths_.data(), sequences_, 0);
    ::thrust::fill_n(policy, pool_lengths_.data(), pool_lengths_.size(), 0);
    ::thrust::fill_n(policy, recalled_.data(), sequences_, std::int64_t{0});
    ::thrust::fill_n(policy, error_.data(), 3, 0);
    ::thrust::fill_n(policy, slot_pool_.data(), slot_pool_.size(), -1);
    ::thrust::for_each_n(policy, zero, sequences_ * tier_capacity_,
                         detail::tier_clear_fn{slot_positions_.data(), free_slots_.data(), 0,
                                               tier_capacity_});
    ::thrust::for_each_n(policy, zero, sequences_ + 1,
                         detail::slot_offsets_fn{slot_offsets_.data(), tier_capacity_});
  }

  tiered_store(const tiered_store&) = delete;
  tiered_store& operator=(const tiered_store&) = delete;

  // ---- the host shadow: shapes, never E memory ----
  [[nodiscard]] const model_shape& shape() const { return shape_; }
  [[nodiscard]] int requests() const { return requests_; }
  [[nodiscard]] std::int64_t sequences() const { return sequences_; }
  [[nodiscard]] int host_capacity() const { return host_capacity_; }
  [[nodiscard]] int tier_capacity() const { return tier_capacity_; }
  [[nodiscard]] int capacity(std::int64_t = 0) const { return tier_capacity_; }
  // Working-set length of a head-sequence.
  [[nodiscard]] int length(std::int64_t seq) const { return length_[seq]; }
  [[nodiscard]] int length(int request, int layer, int head) const {
    return length_[shape_.sequence(request, layer, head)];
  }
  [[nodiscard]] std::int32_t next_position(int request, int layer) const { return next_[rl(request, layer)]; }
  [[nodiscard]] int host_length(int request, int layer) const { return host_length_[rl(request, layer)]; }
  // Rows in the device tier, summed over head-sequences: the working sets' lengths (a host
  // shadow) less their far slots. Without far installs this reads nothing; after them it is
  // far_tokens()' counted read, so call it outside captured steps (as stats()).
  [[nodiscard]] std::int64_t resident_tokens() const { return held_slots() - far_tokens(); }
  // Tier slots held by the working sets (resident and far rows), from the host shadow.
  [[nodiscard]] std::int64_t held_slots() const {
    std::int64_t t = 0;
    for (const int n : length_) t += n;
    return t;
  }
  // Far slots (far_tier::attend): the working sets' rows that stay in the pool, summed over
  // head-sequences. 0 without reading anything while no install has placed far slots; else one
  // kernel and one counted device-to-host read.
  [[nodiscard]] std::int64_t far_tokens() const {
    if (!far_installed_) return 0;
    ::thrust::for_each_n(exec_.policy(), ::thrust::counting_iterator<std::int64_t>(0), sequences_,
                         detail::far_slots_fn{lengths_.data(), plan_slots_.data(),
                                              slot_pool_.data(), tier_capacity_,
                                              far_slots_.data()});
    std::vector<std::int32_t> far(static_cast<std::size_t>(sequences_));
    copy_to_host(exec_, far_slots_, std::span<std::int32_t>(far));
    std::int64_t t = 0;
    for (const auto n : far) t += n;
    return t;
  }
  [[nodiscard]] std::int64_t resident_bytes() const { return resident_tokens() * row_pair_bytes(); }
  [[nodiscard]] std::int64_t host_tokens() const {
    std::int64_t t = 0;
    for (const int n : host_length_) t += n;
    return t * shape_.kv_heads;
  }
  [[nodiscard]] std::int64_t host_bytes() const { return host_tokens() * row_pair_bytes(); }

  // store::tiered's counters: host_bytes from the shadow, device_bytes as resident_bytes(),
  // installs (calls) counted on the host; bytes_to_device from the device's per-head-sequence
  // counts of rows an install copied from the pool. So stats() is one counted device-to-host
  // read, two after far installs (call it outside captured steps, as check()). bytes_to_host
  // stays 0 (write-through pool), promotes 0 (every recall is an install).
  [[nodiscard]] store::tier_stats stats() const {
    store::tier_stats s;
    s.host_bytes = host_bytes();
    s.device_bytes = resident_bytes();
    s.installs = installs_;
    s.bytes_to_device = bytes_to_device();
    return s;
  }
  // Bytes installs copied from the pool into the tier (the recalls): one counted read.
  [[nodiscard]] std::int64_t bytes_to_device() const {
    std::vector<std::int64_t> rows(static_cast<std::size_t>(sequences_));
    copy_to_host(exec_, recalled_, std::span<std::int64_t>(rows));
    std::int64_t b = 0;
    for (const auto n : rows) b += n * row_pair_bytes();
    return b;
  }

  // ---- E memory, for the Thrust algorithms run on exec().policy() ----
  [[nodiscard]] const E& exec() const { return exec_; }
  // The device tier: rows [sequences, tier_capacity, d], slot positions [sequences,
  // tier_capacity] (-1 = free slot). NOT ascending within a segment: read it through a plan.
  [[nodiscard]] tier_rows<T> tier() {
    return {tier_keys_.data(), tier_values_.data(), slot_positions_.data(),
            static_cast<int>(sequences_), tier_capacity_, shape_.head_dim};
  }
  // [sequences + 1] CSR of tier_capacity per head-sequence: tier().key_rows(slot_offsets()) is
  // the slot-addressed view attention_over reads with a plan from plan_sorted().
  [[nodiscard]] const std::int32_t* slot_offsets() const { return slot_offsets_.data(); }
  [[nodiscard]] segmented_rows<T> slot_key_rows() { return tier().key_rows(slot_offsets_.data()); }
  [[nodiscard]] segmented_rows<T> slot_value_rows() { return tier().value_rows(slot_offsets_.data()); }
  // The host pool: rows [sequences, host_capacity, d], positions [sequences, host_capacity]
  // ascending, the first pool_lengths()[request * layers + layer] of each head-sequence valid.
  [[nodiscard]] tier_rows<T> pool() {
    return {pool_keys_.data(), pool_values_.data(), pool_positions_.data(),
            static_cast<int>(sequences_), host_capacity_, shape_.head_dim};
  }
  [[nodiscard]] const std::int32_t* pool_lengths() const { return pool_lengths_.data(); }
  // The sorted plan, [sequences, tier_capacity] each: entry i < length(seq) of seq at
  // seq * tier_capacity + i, slots and positions ascending by position.
  [[nodiscard]] const std::int32_t* plan_slots() const { return plan_slots_.data(); }
  [[nodiscard]] const std::int32_t* plan_positions() const { return plan_positions_.data(); }
  [[nodiscard]] const std::int32_t* lengths() const { return lengths_.data(); }
  [[nodiscard]] const T* tier_keys() const { return tier_keys_.data(); }
  [[nodiscard]] const T* tier_values() const { return tier_values_.data(); }
  [[nodiscard]] const std::int32_t* slot_positions() const { return slot_positions_.data(); }
  [[nodiscard]] const T* pool_keys() const { return pool_keys_.data(); }
  [[nodiscard]] const T* pool_values() const { return pool_values_.data(); }
  [[nodiscard]] const std::int32_t* pool_positions() const { return pool_positions_.data(); }
  [[nodiscard]] const std::int32_t* free_slots() const { return free_slots_.data(); }
  // [sequences, tier_capacity]: the pool row of a far slot (install(..., far = true)), -1 for a
  // slot whose row is in the tier; and the reader that follows it.
  [[nodiscard]] const std::int32_t* slot_pool() const { return slot_pool_.data(); }
  [[nodiscard]] bool far_installed() const { return far_installed_; }
  [[nodiscard]] working_rows<T> rows() const {
    return {tier_keys_.data(), tier_values_.data(), pool_keys_.data(), pool_values_.data(), slot_pool_.data(), tier_capacity_,
            host_capacity_, shape_.head_dim};
  }

  // ---- mutation ----
  // Appends k, v ([tokens, kv_heads, d] views in E memory) to the pool of (request, layer) and
  // to the working set of each of its KV heads (new tokens are always resident), at positions
  // first_position, first_position + 1, ...: each row goes to a free slot and to the end of the
  // plan. Checked like store::tiered::append (shape, ascending positions, room in the pool) plus
  // room in each head's tier, from the host shadow, before anything changes.
  template <class L>
  void append(int request, int layer, kv_view<const T, L, memory_space> k,
              kv_view<const T, L, memory_space> v, std::int32_t first_position) {
    constexpr std::string_view where = "thrust::tiered_store.append";
    check_request_layer(where, request, layer);
    validate_kv_pair(where, k, v, shape_.kv_heads, shape_.head_dim);
    const std::int32_t next = next_position(request, layer);
    require(first_position >= next, where, "first_position", first_position, [&] {
      return ">= " + std::to_string(next) + " (positions ascend within a head-sequence)";
    });
    require_positions_fit(where, "first_position", first_position, k.tokens);
    const int have = host_length(request, layer);
    require(k.tokens <= host_capacity_ - have, where, "k.tokens", k.tokens, [&] {
      return "<= the room left in the host pool (" + std::to_string(host_capacity_ - have) +
             " of " + std::to_string(host_capacity_) + " tokens)";
    });
    const std::int64_t seq0 = shape_.sequence(request, layer, 0);
    for (int h = 0; h < shape_.kv_heads; ++h) {
      require(length_[seq0 + h] + k.tokens <= tier_capacity_, where, "k.tokens", k.tokens, [&] {
        return "room in the device tier of head-sequence (request " + std::to_string(request) +
               ", layer " + std::to_string(layer) + ", head " + std::to_string(h) + "): " +
               std::to_string(length_[seq0 + h]) + " resident of tier_capacity " +
               std::to_string(tier_capacity_);
      });
    }
    if (k.tokens == 0) return;
    const auto policy = exec_.policy();
    ::thrust::for_each_n(
        policy, ::thrust::counting_iterator<std::int64_t>(0),
        static_cast<std::int64_t>(k.tokens) * shape_.kv_heads * shape_.head_dim,
        detail::tiered_append_fn<T, L, memory_space>{
            k, v, pool_keys_.data(), pool_values_.data(), pool_positions_.data(),
            tier_keys_.data(), tier_values_.data(), slot_positions_.data(), plan_slots_.data(),
            plan_positions_.data(), slot_pool_.data(), free_slots_.data(), lengths_.data(), seq0,
            host_capacity_,
            tier_capacity_, have, first_position, error_.data() + 2});
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<int>(0), shape_.kv_heads,
                         detail::grow_lengths_fn{lengths_.data(), seq0, k.tokens});
    ::thrust::fill_n(policy, pool_lengths_.data() + rl(request, layer), 1, have + k.tokens);
    for (int h = 0; h < shape_.kv_heads; ++h) length_[seq0 + h] += k.tokens;
    host_length_[rl(request, layer)] = have + k.tokens;
    next_[rl(request, layer)] = first_position + k.tokens;
  }

  // Keeps, for each KV head h of (request, layer), kept_counts[h] rows of its working set: the
  // h-th run of `kept` (E memory; plan indices, i.e. store::tiered's slots: ascending, below the
  // head's length; runs back to back). The others leave the working set (their slots are freed;
  // they stay in the pool); no row moves, the plan is compacted. The counts are host data,
  // checked here (0 <= count <= length); the indices are device data, checked on the device.
  void retain(int request, int layer, std::span<const int> kept_counts, const std::int32_t* kept) {
    constexpr std::string_view where = "thrust::tiered_store.retain";
    check_request_layer(where, request, layer);
    const int H = shape_.kv_heads;
    const std::int64_t seq0 = shape_.sequence(request, layer, 0);
    const std::int64_t num_kept =
        detail::retain_offsets(where, kept_counts, length_.data() + seq0, H, host_desc_.data());
    require(num_kept == 0 || kept != nullptr, where, "kept", "null", "the kept plan indices in E memory");
    upload_desc(static_cast<std::size_t>(H) + 1);
    const auto policy = exec_.policy();
    const ::thrust::counting_iterator<std::int64_t> zero(0);
    const std::int32_t* offsets = desc_.data();
    std::int32_t* checked = scratch_a_.data();
    if (num_kept > 0) {
      ::thrust::fill_n(policy, bad_.data(), H, 0);
      ::thrust::for_each_n(policy, zero, num_kept,
                           detail::tiered_check_kept_fn{kept, offsets, lengths_.data(), seq0, H,
                                                        bad_.data(), error_.data()});
      ::thrust::for_each_n(policy, zero, num_kept,
                           detail::tiered_kept_fn{kept, offsets, H, bad_.data(), checked});
    }
    ::thrust::for_each_n(policy, zero, static_cast<std::int64_t>(H) * tier_capacity_,
                         detail::tiered_retain_free_fn{checked, offsets, lengths_.data(),
                                                       plan_slots_.data(), slot_positions_.data(),
                                                       free_slots_.data(), seq0, tier_capacity_});
    if (num_kept > 0) {
      ::thrust::for_each_n(policy, zero, num_kept,
                           detail::tiered_plan_gather_fn{checked, offsets, H, plan_slots_.data(),
                                                         plan_positions_.data(), seq0,
                                                         tier_capacity_, scratch_b_.data(),
                                                         scratch_c_.data()});
      ::thrust::for_each_n(policy, zero, num_kept,
                           detail::tiered_plan_scatter_fn{offsets, H, scratch_b_.data(),
                                                          scratch_c_.data(), plan_slots_.data(),
                                                          plan_positions_.data(), seq0,
                                                          tier_capacity_});
    }
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<int>(0), H,
                         detail::tiered_set_lengths_fn{lengths_.data(), offsets, seq0});
    for (int h = 0; h < H; ++h) length_[seq0 + h] = kept_counts[h];
  }

  // Sets the working set of each target head-sequence seqs[r] to exactly counts[r] positions:
  // the r-th run of `positions` (E memory; ascending, each in the pool of seqs[r]'s (request,
  // layer); runs back to back). A resident position keeps its slot and bytes; a missing one is
  // copied from the host pool into a free slot (the recall; counted in stats().bytes_to_device);
  // the slots of the rows that leave are freed. Head-sequences not named are untouched.
  // store::tiered's promote (and install of a completed recall: the pool is device-reachable).
  // With far = true (far_tier::attend) a missing position is placed in a free slot marked far
  // (slot_pool()) and nothing is copied or counted: its readers read the pool's row where it
  // lies (working_rows). The working set's length stays a host shadow, so a step's counts need no
  // read-back; resident_tokens() (the far slots left out) reads the device, outside steps.
  // A store serves one policy: once an install placed far slots, a copying install is refused
  // (a kept far slot would stay far, and tier readers would see a row that is not there).
  // Host-checked: seqs distinct and in range, one count each, 0 <= counts[r] <= min(tier
  // capacity, the pool's length); the positions are checked on the device.
  void install(std::span<const std::int64_t> seqs, std::span<const int> counts,
               const std::int32_t* positions, bool far = false) {
    constexpr std::string_view where = "thrust::tiered_store.install";
    require(far || !far_installed_, where, "far", "false",
            "true on a store whose installs placed far slots (far_tier::attend): one policy per "
            "store");
    require(counts.size() == seqs.size(), where, "counts.size()", counts.size(),
            [&] { return "one count per head-sequence (" + std::to_string(seqs.size()) + ")"; });
    const auto R = static_cast<std::int64_t>(seqs.size());
    require(R <= sequences_, where, "seqs.size()", seqs.size(),
            [&] { return "<= sequences (" + std::to_string(sequences_) + "), each named once"; });
    if (++epoch_ == 0) {  // wrapped: clear the marks once
      std::fill(seen_.begin(), seen_.end(), 0U);
      epoch_ = 1;
    }
    host_desc_[0] = 0;
    for (std::int64_t r = 0; r < R; ++r) {
      const std::int64_t seq = seqs[r];
      require(seq >= 0 && seq < sequences_, where, [&] { return "seqs[" + std::to_string(r) + "]"; },
              seq, [&] { return "in [0, " + std::to_string(sequences_) + ")"; });
      require(seen_[seq] != epoch_, where, [&] { return "seqs[" + std::to_string(r) + "]"; }, seq,
              [] { return std::string("a head-sequence not named before in this install"); });
      seen_[seq] = epoch_;
      const int pool = host_length_[seq / shape_.kv_heads];
      const int most = std::min(tier_capacity_, pool);
      require(counts[r] >= 0 && counts[r] <= most, where,
              [&] { return "counts[" + std::to_string(r) + "]"; }, counts[r], [&] {
                return "in [0, " + std::to_string(most) + "] (tier_capacity " +
                       std::to_string(tier_capacity_) + ", pool length " + std::to_string(pool) +
                       " of head-sequence " + std::to_string(seq) + ")";
              });
      host_desc_[r + 1] = host_desc_[r] + counts[r];
    }
    const std::int64_t total = R == 0 ? 0 : host_desc_[R];
    require(total == 0 || positions != nullptr, where, "positions", "null",
            "the new working sets' positions in E memory");
    ++installs_;
    far_installed_ = far_installed_ || far;
    if (R == 0) return;
    for (std::int64_t r = 0; r < R; ++r) host_desc_[R + 1 + r] = static_cast<std::int32_t>(seqs[r]);
    upload_desc(static_cast<std::size_t>(2 * R + 1));
    const detail::install_desc desc{desc_.data(), desc_.data() + R + 1, tier_capacity_};
    const auto policy = exec_.policy();
    const ::thrust::counting_iterator<std::int64_t> zero(0);
    const std::int64_t n = R * tier_capacity_;
    const int H = shape_.kv_heads;
    std::int32_t* want = scratch_a_.data();
    std::int32_t* leave = scratch_b_.data();   // leave flags -> ranks -> arrivals' pool rows
    std::int32_t* arrive = scratch_c_.data();  // arrive flags -> ranks
    std::int32_t* slot = scratch_d_.data();    // resident slot of each new position
    ::thrust::fill_n(policy, bad_.data(), R, 0);
    ::thrust::for_each_n(policy, zero, n,
                         detail::install_check_fn{desc, positions, pool_positions_.data(),
                                                  pool_lengths_.data(), host_capacity_, H,
                                                  bad_.data(), error_.data() + 1});
    ::thrust::for_each_n(policy, zero, n,
                         detail::install_want_fn{desc, positions, pool_positions_.data(),
                                                 pool_lengths_.data(), host_capacity_, H,
                                                 bad_.data(), want});
    ::thrust::for_each_n(policy, zero, n,
                         detail::install_classify_fn{desc, want, lengths_.data(), plan_slots_.data(),
                                                     plan_positions_.data(), leave, arrive, slot});
    ranks(R, leave, nullptr);
    ranks(R, arrive, far ? nullptr : recalled_.data());
    ::thrust::for_each_n(policy, zero, n,
                         detail::install_free_fn{desc, leave, lengths_.data(), plan_slots_.data(),
                                                 slot_positions_.data(), free_slots_.data()});
    ::thrust::for_each_n(policy, zero, n,
                         detail::install_place_fn{desc, want, arrive, slot, free_slots_.data(),
                                                  pool_positions_.data(), pool_lengths_.data(),
                                                  host_capacity_, H, slot_positions_.data(),
                                                  plan_slots_.data(), plan_positions_.data(),
                                                  leave, slot_pool_.data(), far});
    if (!far) {
      ::thrust::for_each_n(policy, zero, n * shape_.head_dim,
                           detail::install_copy_fn<T>{desc, leave, plan_slots_.data(),
                                                      pool_keys_.data(), pool_values_.data(),
                                                      tier_keys_.data(), tier_values_.data(),
                                                      host_capacity_, shape_.head_dim});
    }
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<int>(0), static_cast<int>(R),
                         detail::install_lengths_fn{desc, lengths_.data()});
    for (std::int64_t r = 0; r < R; ++r) length_[seqs[r]] = counts[r];
  }

  // The read plan of the listed head-sequences, packed in list order: offsets_out [seqs.size()
  // + 1] (CSR of their lengths), slots_out and positions_out [the returned total] (each may be
  // null = not written), every run ascending by position. With seqs = every head-sequence in
  // order, (offsets_out, slots_out) is an attention_plan for slot_key_rows() / slot_value_rows().
  // Returns the total (host: from the shadow). One counted descriptor upload; nothing read back.
  std::int64_t plan_sorted(std::span<const std::int64_t> seqs, std::int32_t* offsets_out,
                           std::int32_t* slots_out, std::int32_t* positions_out) {
    constexpr std::string_view where = "thrust::tiered_store.plan_sorted";
    const auto R = static_cast<std::int64_t>(seqs.size());
    require(R <= sequences_, where, "seqs.size()", seqs.size(),
            [&] { return "<= sequences (" + std::to_string(sequences_) + ")"; });
    host_desc_[0] = 0;
    for (std::int64_t r = 0; r < R; ++r) {
      const std::int64_t seq = seqs[r];
      require(seq >= 0 && seq < sequences_, where, [&] { return "seqs[" + std::to_string(r) + "]"; },
              seq, [&] { return "in [0, " + std::to_string(sequences_) + ")"; });
      host_desc_[r + 1] = host_desc_[r] + length_[seq];
      host_desc_[R + 1 + r] = static_cast<std::int32_t>(seq);
    }
    const std::int64_t total = host_desc_[R];
    if (R == 0) {
      if (offsets_out != nullptr) ::thrust::fill_n(exec_.policy(), offsets_out, 1, 0);
      return 0;
    }
    upload_desc(static_cast<std::size_t>(2 * R + 1));
    const auto policy = exec_.policy();
    if (offsets_out != nullptr) ::thrust::copy_n(policy, desc_.data(), R + 1, offsets_out);
    if (total > 0 && (slots_out != nullptr || positions_out != nullptr)) {
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), total,
                           detail::plan_pack_fn{desc_.data(), desc_.data() + R + 1,
                                                static_cast<int>(R), tier_capacity_,
                                                plan_slots_.data(), plan_positions_.data(),
                                                slots_out, positions_out});
    }
    return total;
  }

  // Drops every token of a request from both tiers (its slot in a continuous batch becomes free).
  void reset(int request) {
    require(request >= 0 && request < requests_, "thrust::tiered_store.reset", "request", request,
            [&] { return "in [0, " + std::to_string(requests_) + ")"; });
    const std::int64_t per = shape_.sequences_per_request();
    const auto policy = exec_.policy();
    ::thrust::fill_n(policy, lengths_.data() + request * per, per, 0);
    ::thrust::fill_n(policy, pool_lengths_.data() + rl(request, 0), shape_.layers, 0);
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), per * tier_capacity_,
                         detail::tier_clear_fn{slot_positions_.data(), free_slots_.data(),
                                               request * per * tier_capacity_, tier_capacity_});
    for (std::int64_t s = 0; s < per; ++s) length_[request * per + s] = 0;
    for (int l = 0; l < shape_.layers; ++l) {
      host_length_[rl(request, l)] = 0;
      next_[rl(request, l)] = 0;
    }
  }

  // Raises what the device found since the last check (a retain's kept indices or an install's
  // positions invalid; a NaN or Inf key or value appended) as kvsift::error, and clears it. One
  // counted device-to-host read: call it outside captured steps.
  void check() {
    int error[3] = {0, 0, 0};
    copy_to_host(exec_, error_, std::span<int>(error, 3));
    if (error[0] == 0 && error[1] == 0 && error[2] == 0) return;
    ::thrust::fill_n(exec_.policy(), error_.data(), 3, 0);
    // the first one found is raised; the message names the others
    const char* what[3] = {"kept plan indices found invalid", "install positions found invalid",
                           "a NaN or Inf key or value was appended"};
    const int first = error[0] != 0 ? 0 : error[1] != 0 ? 1 : 2;
    std::string also;
    for (int j = first + 1; j < 3; ++j) {
      if (error[j] != 0) also += std::string(also.empty() ? "; also: " : ", ") + what[j];
    }
    if (error[0] != 0) {
      throw make_error("thrust::tiered_store.retain", "kept", "plan indices found invalid on the device",
                       "ascending indices below each head's length (a head with a bad set kept "
                       "its first kept_counts[h] rows)" + also);
    }
    if (error[1] != 0) {
      throw make_error("thrust::tiered_store.install", "positions",
                       "positions found invalid on the device",
                       "ascending positions, each in the target's host pool (a bad target got "
                       "its pool's newest counts[r] positions)" + also);
    }
    throw make_error("thrust::tiered_store.append", "k/v", "NaN or Inf found on the device",
                     "finite numbers (NaN/Inf activations poison every score that reads them)");
  }

  // Checks the store's invariants against its host shadow and throws kvsift::error naming the
  // first violation: every length and pool length equals the shadow; each plan ascends by
  // position, its slots are distinct and hold its positions; the free stack holds exactly the
  // other slots (position -1); every pool ascends and ends below next_position; every resident
  // row equals its pool row (a far slot names it instead). Reads the whole store back (counted
  // D2H): for tests and debugging.
  void verify() const {
    constexpr std::string_view where = "thrust::tiered_store.verify";
    const std::size_t tier_slots = slots(tier_capacity_), pool_slots = slots(host_capacity_);
    const std::size_t d = static_cast<std::size_t>(shape_.head_dim);
    std::vector<std::int32_t> lengths(static_cast<std::size_t>(sequences_)),
        pool_lengths(host_length_.size()), slot_pos(tier_slots), plan_s(tier_slots),
        plan_p(tier_slots), free_s(tier_slots), pool_pos(pool_slots);
    std::vector<T> tk(tier_slots * d), tv(tier_slots * d), pk(pool_slots * d), pv(pool_slots * d);
    copy_to_host(exec_, lengths_, std::span<std::int32_t>(lengths));
    copy_to_host(exec_, pool_lengths_, std::span<std::int32_t>(pool_lengths));
    copy_to_host(exec_, slot_positions_, std::span<std::int32_t>(slot_pos));
    std::vector<std::int32_t> slot_pool(tier_slots);
    copy_to_host(exec_, slot_pool_, std::span<std::int32_t>(slot_pool));
    copy_to_host(exec_, plan_slots_, std::span<std::int32_t>(plan_s));
    copy_to_host(exec_, plan_positions_, std::span<std::int32_t>(plan_p));
    copy_to_host(exec_, free_slots_, std::span<std::int32_t>(free_s));
    copy_to_host(exec_, pool_positions_, std::span<std::int32_t>(pool_pos));
    copy_to_host(exec_, tier_keys_, std::span<T>(tk));
    copy_to_host(exec_, tier_values_, std::span<T>(tv));
    copy_to_host(exec_, pool_keys_, std::span<T>(pk));
    copy_to_host(exec_, pool_values_, std::span<T>(pv));
    const std::size_t rb = d * sizeof(T);
    for (std::size_t i = 0; i < host_length_.size(); ++i) {
      require(pool_lengths[i] == host_length_[i], where, "pool length", pool_lengths[i],
              [&] {
                return "the host shadow's " + std::to_string(host_length_[i]) +
                       " ((request, layer) " + std::to_string(i) + ")";
              });
    }
    std::vector<int> owner(static_cast<std::size_t>(tier_capacity_));
    for (std::int64_t seq = 0; seq < sequences_; ++seq) {
      const std::string in = " (head-sequence " + std::to_string(seq) + ")";
      const int n = length_[seq];
      require(lengths[seq] == n, where, "length", lengths[seq],
              "the host shadow's " + std::to_string(n) + in);
      const std::size_t rlx = static_cast<std::size_t>(seq / shape_.kv_heads);
      const int plen = host_length_[rlx];
      const std::int32_t* pp = pool_pos.data() + seq * host_capacity_;
      for (int i = 1; i < plen; ++i) {
        require(pp[i] > pp[i - 1], where, "pool position", pp[i], "ascending pool positions" + in);
      }
      require(plen == 0 || pp[plen - 1] < next_[rlx], where, "next_position", next_[rlx],
              "past the pool's newest token" + in);
      std::fill(owner.begin(), owner.end(), 0);
      const std::size_t base = static_cast<std::size_t>(seq) * tier_capacity_;
      for (int i = 0; i < n; ++i) {
        const std::int32_t s = plan_s[base + i], pos = plan_p[base + i];
        require(i == 0 || pos > plan_p[base + i - 1], where, "plan position", pos,
                "ascending plan positions" + in);
        require(s >= 0 && s < tier_capacity_ && owner[s] == 0, where, "plan slot", s,
                "a distinct slot in [0, tier_capacity)" + in);
        owner[s] = 1;
        require(slot_pos[base + s] == pos, where, "slot position", slot_pos[base + s],
                "the plan's position " + std::to_string(pos) + in);
        const auto* it = std::lower_bound(pp, pp + plen, pos);
        require(it != pp + plen && *it == pos, where, "position", pos,
                "a resident token held by the pool" + in);
        const std::size_t prow =
            static_cast<std::size_t>(seq) * host_capacity_ + static_cast<std::size_t>(it - pp);
        if (const std::int32_t j = slot_pool[base + s]; j >= 0) {  // far: read where it lies
          require(j == it - pp, where, "far slot's pool row", j,
                  "the pool row of position " + std::to_string(pos) + in);
          continue;
        }
        require(std::memcmp(tk.data() + (base + s) * d, pk.data() + prow * d, rb) == 0 &&
                    std::memcmp(tv.data() + (base + s) * d, pv.data() + prow * d, rb) == 0,
                where, "position", pos, "resident rows equal to the pool's" + in);
      }
      for (int k = 0; k < tier_capacity_ - n; ++k) {
        const std::int32_t s = free_s[base + k];
        require(s >= 0 && s < tier_capacity_ && owner[s] == 0, where, "free slot", s,
                "a slot no plan entry or other free entry holds" + in);
        owner[s] = 1;
        require(slot_pos[base + s] == -1, where, "free slot position", slot_pos[base + s], "-1" + in);
      }
    }
  }

  // Bytes of E memory the store allocated: all of it at construction.
  [[nodiscard]] std::size_t allocated_bytes() const {
    return pool_keys_.bytes() + pool_values_.bytes() + pool_positions_.bytes() +
           pool_lengths_.bytes() + tier_keys_.bytes() + tier_values_.bytes() +
           slot_positions_.bytes() + slot_pool_.bytes() + plan_slots_.bytes() + plan_positions_.bytes() +
           free_slots_.bytes() + lengths_.bytes() + slot_offsets_.bytes() + recalled_.bytes() +
           far_slots_.bytes() + error_.bytes() + desc_.bytes() + bad_.bytes() + scratch_a_.bytes() +
           scratch_b_.bytes() + scratch_c_.bytes() + scratch_d_.bytes() + blocks_scratch_.bytes();
  }

  void check_request_layer(std::string_view where, int request, int layer) const {
    require(request >= 0 && request < requests_, where, "request", request,
            [&] { return "in [0, " + std::to_string(requests_) + ")"; });
    require(layer >= 0 && layer < shape_.layers, where, "layer", layer,
            [&] { return "in [0, " + std::to_string(shape_.layers) + ")"; });
  }

 private:
  static model_shape checked_shape(model_shape shape) {
    shape.validate("thrust::tiered_store");
    return shape;
  }
  static std::int64_t checked_sequences(const model_shape& shape, int requests, int host_capacity,
                                        int tier_capacity) {
    constexpr std::string_view where = "thrust::tiered_store";
    require(requests > 0, where, "requests", requests, "> 0");
    require(host_capacity > 0, where, "host_capacity", host_capacity, "> 0 tokens");
    require(tier_capacity > 0, where, "tier_capacity", tier_capacity, "> 0 rows");
    const std::int64_t seqs = static_cast<std::int64_t>(requests) * shape.sequences_per_request();
    require(checked_product(max_allocation_bytes, seqs, host_capacity, shape.head_dim, sizeof(T)).has_value(),
            where, "host_capacity", host_capacity,
            "a [sequences, host_capacity, d] pool that fits in max_allocation_bytes");
    // plan offsets and slot offsets are int32 CSR over every slot
    require(checked_product(static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max()), seqs,
                            tier_capacity).has_value() &&
                checked_product(max_allocation_bytes, seqs, tier_capacity, shape.head_dim,
                                sizeof(T)).has_value(),
            where, "tier_capacity", tier_capacity,
            "sequences * tier_capacity <= INT32_MAX (int32 plan offsets)");
    return seqs;
  }
  [[nodiscard]] std::size_t slots(int capacity) const {
    return static_cast<std::size_t>(sequences_) * static_cast<std::size_t>(capacity);
  }
  [[nodiscard]] std::size_t rl(int request, int layer) const {
    return static_cast<std::size_t>(request) * shape_.layers + layer;
  }
  [[nodiscard]] std::int64_t row_pair_bytes() const {
    return 2 * static_cast<std::int64_t>(shape_.head_dim) * static_cast<std::int64_t>(sizeof(T));
  }
  // One counted H2D write of host_desc_[0, n) into desc_ (a call's descriptor).
  void upload_desc(std::size_t n) {
    copy_to_device(exec_, std::span<const std::int32_t>(host_desc_.data(), n), desc_);
  }
  // flags [R, tier_capacity] (0/1) -> per-target exclusive ranks (-1 where 0); totals[seq] += count.
  void ranks(std::int64_t R, std::int32_t* flags, std::int64_t* totals) {
    const auto policy = exec_.policy();
    const ::thrust::counting_iterator<std::int64_t> zero(0);
    std::int32_t* block = blocks_scratch_.data();
    ::thrust::for_each_n(policy, zero, R * blocks_,
                         detail::rank_count_fn{flags, block, tier_capacity_, blocks_});
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<int>(0), static_cast<int>(R),
                         detail::rank_scan_fn{block, blocks_, desc_.data() + R + 1, totals});
    ::thrust::for_each_n(policy, zero, R * blocks_,
                         detail::rank_assign_fn{flags, block, tier_capacity_, blocks_});
  }

  E exec_;
  model_shape shape_;
  int requests_;
  int host_capacity_;
  int tier_capacity_;
  std::int64_t sequences_;
  int blocks_;                              // rank blocks per head-sequence's tier
  buffer<T, E> pool_keys_, pool_values_;    // [sequences, host_capacity, d]
  buffer<std::int32_t, E> pool_positions_;  // [sequences, host_capacity] ascending
  buffer<std::int32_t, E> pool_lengths_;    // [requests * layers]
  buffer<T, E> tier_keys_, tier_values_;    // [sequences, tier_capacity, d] unordered slots
  buffer<std::int32_t, E> slot_positions_;  // [sequences, tier_capacity], -1 = free
  buffer<std::int32_t, E> slot_pool_;       // [sequences, tier_capacity] far slot's pool row, -1
  buffer<std::int32_t, E> plan_slots_;      // [sequences, tier_capacity] by position
  buffer<std::int32_t, E> plan_positions_;  // [sequences, tier_capacity] ascending
  buffer<std::int32_t, E> free_slots_;      // [sequences, tier_capacity] stacks of free slots
  buffer<std::int32_t, E> lengths_;         // [sequences] working-set lengths
  buffer<std::int32_t, E> slot_offsets_;    // [sequences + 1] = s * tier_capacity
  buffer<std::int64_t, E> recalled_;        // [sequences] rows an install copied from the pool
  mutable buffer<std::int32_t, E> far_slots_;  // [sequences] far_tokens()' per-sequence counts
  buffer<int, E> error_;                    // [3] kept bad, install positions bad, NaN/Inf
  buffer<std::int32_t, E> desc_;            // [2 * sequences + 2] a call's descriptor
  buffer<int, E> bad_;                      // [sequences] per head / target: its set is bad
  buffer<std::int32_t, E> scratch_a_, scratch_b_, scratch_c_, scratch_d_;  // [sequences, tier_capacity]
  buffer<std::int32_t, E> blocks_scratch_;  // [sequences, blocks]
  std::vector<int> length_;                 // host shadow: [sequences]
  std::vector<int> host_length_;            // host shadow: [requests * layers]
  std::vector<std::int32_t> next_;          // host shadow: [requests * layers]
  std::vector<std::int32_t> host_desc_;     // a call's descriptor, built on the host
  std::vector<std::uint32_t> seen_;         // install's distinct-target marks (epoch stamps)
  std::uint32_t epoch_ = 0;
  std::int64_t installs_ = 0;
  bool far_installed_ = false;              // an install placed far slots: attend's store
};

}  // namespace kvsift::thrust

namespace kvsift {
template <class T, thrust::DeviceExec E>
struct default_tiered_store<T, E> {
  using type = thrust::tiered_store<T, E>;
};
}  // namespace kvsift
