// SPDX-License-Identifier: Apache-2.0
#pragma once

// A plan over a paged store, exported as FlashInfer's paged-KV page table (DESIGN §7.1), so an
// engine that runs FlashInfer attention consumes a decode plan as it is. Host reference; the
// Thrust version (kvsift/thrust/flashinfer.hpp) builds the same arrays on the device.
//
// Batch entries. store::paged gives every head-sequence (request, layer, KV head) its own list
// of pages, each page [page_size, d] of ONE head. FlashInfer therefore sees the store's key and
// value pools, key_pool() / value_pool() [total_pages, page_size, d], as a paged cache with
// num_kv_heads = 1 (NHD and HND coincide), and one batch entry per (request, KV head) of the
// plan, in the plan's segment order: entry s = i * kv_heads + h is KV head h of requests[i]
// (attention_plan's order), and its query heads are that request's group of q heads
// [h * group, (h + 1) * group) (num_qo_heads = group).
//
// Two forms (docs/device.md, "Plans on the device and the FlashInfer export", says them in full):
//   tokens (flashinfer_tokens)  any token plan: page_size = 1, indices = the pool rows of the
//          kept slots, last_page_len 1 (0 for an entry that keeps nothing).
//   pages  (flashinfer_pages)   a page plan over the store's own pages (Quest's): indices = the
//          physical page ids, last_page_len = the rows of the last kept page; rejects head_pages
//          with a row map (a logical page is a store page only while slot i is row i).
// In both forms indptr = the plan's offsets, and FlashInfer's sequence length of entry s,
// (pages - 1) * page_size + last_page_len (0 when it has no pages), is the number of tokens the
// plan keeps for it. Attention is order-free over keys, so the kept order (ascending) is kept.
// Positions (for RoPE or masks) are the plan's own (attention_plan::positions).
//
// Validation: the page lists' CSR offsets (head_pages.pages: first 0, non-decreasing, last the
// page ids' count), every request and the layer in range, one plan segment per (request, KV
// head), each segment strictly ascending inside its head-sequence (slots < length, pages <
// ceil(length / page_size)), the page size equal to the store's; kvsift::error names the
// argument, the value and what was expected. Nothing is written to the output before the plan
// is checked. Cost: O(kept + pages of the plan's head-sequences).

#include <kvsift/core/error.hpp>
#include <kvsift/core/segments.hpp>
#include <kvsift/store/paged.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift {

// FlashInfer's paged-KV page table (BatchDecodeWithPagedKVCache's paged_kv_indptr,
// paged_kv_indices, paged_kv_last_page_len) for a batch of entries.
struct flashinfer_table {
  std::vector<std::int32_t> indptr{0};      // [entries + 1] CSR offsets into indices
  std::vector<std::int32_t> indices;        // [indptr.back()] physical rows or pages of the pool
  std::vector<std::int32_t> last_page_len;  // [entries] rows of each entry's last page; 0 if empty
  int page_size = 0;                        // 1 (tokens form) or the store's page size (pages form)

  [[nodiscard]] int entries() const { return static_cast<int>(indptr.size()) - 1; }
  // FlashInfer's sequence length of entry s (flashinfer.page.get_seq_lens).
  [[nodiscard]] int seq_len(int s) const {
    const int pages = indptr[s + 1] - indptr[s];
    return pages == 0 ? 0 : (pages - 1) * page_size + last_page_len[s];
  }
};

// The page lists of a batch's head-sequences, one entry per (request, KV head) in plan order:
// what the export reads from the store, and what the Thrust export takes on the device.
struct head_pages {
  segmented<std::int32_t> pages;     // [entries] the entry's physical page ids, in row order
  std::vector<std::int32_t> lengths; // [entries] tokens of the head-sequence
  int page_size = 0;                 // rows per page
  // [entries] the row of each slot (store.row(seq, slot)), lengths[s] per entry; empty when
  // every entry's slot i is its row i (no retain reordered them).
  segmented<std::int32_t> rows;
  // [entries] rows the entry's pages hold (store.row_extent: its tokens, and a released row the
  // next append fills); empty when every entry's pages hold exactly its tokens.
  std::vector<std::int32_t> extents;

  [[nodiscard]] int extent(int s) const { return extents.empty() ? lengths[s] : extents[s]; }

  [[nodiscard]] int entries() const { return pages.segments(); }
};

namespace detail {

inline void check_head_pages(const head_pages& hp, std::string_view where) {
  require(hp.page_size > 0, where, "head_pages.page_size", hp.page_size, "> 0");
  // the page lists' CSR offsets first: every read of a list stays inside pages.values
  const auto& off = hp.pages.offsets;
  require(!off.empty(), where, "head_pages.pages.offsets.size", 0, ">= 1 (entries + 1)");
  require(off[0] == 0, where, "head_pages.pages.offsets[0]", off[0], "0 (CSR offsets)");
  for (std::size_t s = 1; s < off.size(); ++s) {
    require(off[s] >= off[s - 1], where,
            [s] { return "head_pages.pages.offsets[" + std::to_string(s) + "]"; }, off[s], [&] {
              return ">= head_pages.pages.offsets[" + std::to_string(s - 1) + "] (" +
                     std::to_string(off[s - 1]) + "): non-decreasing CSR offsets";
            });
  }
  require(static_cast<std::size_t>(off.back()) == hp.pages.values.size(), where,
          [&] { return "head_pages.pages.offsets[" + std::to_string(off.size() - 1) + "]"; },
          off.back(), [&] {
            return "head_pages.pages.values.size() (" + std::to_string(hp.pages.values.size()) +
                   ")";
          });
  require(static_cast<int>(hp.lengths.size()) == hp.entries(), where, "head_pages.lengths.size",
          hp.lengths.size(),
          [&] { return "one length per entry (" + std::to_string(hp.entries()) + ")"; });
  require(hp.extents.empty() || static_cast<int>(hp.extents.size()) == hp.entries(), where,
          "head_pages.extents.size", hp.extents.size(), [&] {
            return "0 (pages hold the tokens) or one per entry (" + std::to_string(hp.entries()) +
                   ")";
          });
  for (int s = 0; s < hp.entries(); ++s) {
    require(hp.extent(s) >= hp.lengths[s] && hp.extent(s) <= hp.lengths[s] + 1, where,
            [s] { return "head_pages.extents[" + std::to_string(s) + "]"; }, hp.extent(s), [&] {
              return "the entry's length (" + std::to_string(hp.lengths[s]) +
                     ") or one more (a released row the next append fills)";
            });
    const std::int64_t need =
        (static_cast<std::int64_t>(hp.extent(s)) + hp.page_size - 1) / hp.page_size;
    require(hp.lengths[s] >= 0 && hp.pages.size(s) == need, where,
            [s] { return "head_pages.lengths[" + std::to_string(s) + "]"; }, hp.lengths[s],
            [&] {
              return ">= 0 and filling the entry's " + std::to_string(hp.pages.size(s)) +
                     " pages of " + std::to_string(hp.page_size) + " (the last one partly)";
            });
  }
  if (hp.rows.segments() <= 0) return;  // slots are rows
  require(hp.rows.segments() == hp.entries(), where, "head_pages.rows.segments",
          hp.rows.segments(),
          [&] { return "0 (slots are rows) or one per entry (" + std::to_string(hp.entries()) + ")"; });
  for (int s = 0; s < hp.entries(); ++s) {
    require(hp.rows.size(s) == hp.lengths[s], where,
            [s] { return "head_pages.rows[" + std::to_string(s) + "].size"; }, hp.rows.size(s),
            [&] { return "the entry's length (" + std::to_string(hp.lengths[s]) + ")"; });
    for (const auto r : hp.rows[s]) {
      require(r >= 0 && r < hp.extent(s), where,
              [s] { return "head_pages.rows[" + std::to_string(s) + "]"; }, r,
              [&] { return "a row in [0, " + std::to_string(hp.extent(s)) + ")"; });
    }
  }
}

inline void check_plan_shape(const head_pages& hp, const index_sets& plan, std::string_view where,
                             std::string_view arg) {
  require(plan.segments() == hp.entries(), where, std::string(arg) + ".segments", plan.segments(),
          [&] { return "one segment per (request, KV head) entry (" + std::to_string(hp.entries()) + ")"; });
  for (int s = 0; s < plan.segments(); ++s) {
    require(plan.offsets[s + 1] >= plan.offsets[s], where,
            [&] { return std::string(arg) + ".offsets[" + std::to_string(s + 1) + "]"; },
            plan.offsets[s + 1],
            [&] { return ">= offsets[" + std::to_string(s) + "] (" + std::to_string(plan.offsets[s]) + ")"; });
  }
  require(!plan.offsets.empty() && plan.offsets.front() == 0 &&
              static_cast<std::size_t>(plan.offsets.back()) == plan.values.size(),
          where, std::string(arg) + ".offsets.back", plan.offsets.empty() ? -1 : plan.offsets.back(),
          [&] { return "offsets[0] = 0 and offsets.back() = values.size() (" + std::to_string(plan.values.size()) + ")"; });
}

// A page-list batch's arguments: every request below num_requests, the layer below layers.
inline void check_batch_layer(std::string_view where, std::span<const int> requests, int num_requests,
                              int layer, int layers) {
  for (std::size_t i = 0; i < requests.size(); ++i) {
    require(requests[i] >= 0 && requests[i] < num_requests, where,
            [i] { return "requests[" + std::to_string(i) + "]"; }, requests[i],
            [&] { return "in [0, " + std::to_string(num_requests) + ")"; });
  }
  require(layer >= 0 && layer < layers, where, "layer", layer,
          [&] { return "in [0, " + std::to_string(layers) + ")"; });
}

}  // namespace detail

// Page lists of (requests[i], layer, h) for every i and KV head h, in that order.
template <Element T, HostAccessible Space>
[[nodiscard]] head_pages page_lists(const store::paged<T, Space>& store, int layer,
                                    std::span<const int> requests) {
  constexpr std::string_view where = "flashinfer.page_lists";
  const auto& sh = store.shape();
  detail::check_batch_layer(where, requests, store.requests(), layer, sh.layers);
  head_pages hp;
  hp.page_size = store.page_size();
  hp.pages.offsets.reserve(requests.size() * sh.kv_heads + 1);
  hp.lengths.reserve(requests.size() * sh.kv_heads);
  bool in_order = true;
  bool holes = false;
  for (const int r : requests) {
    const auto t = store.page_table(r, layer);
    for (int h = 0; h < sh.kv_heads; ++h) {
      hp.pages.push_back(std::span<const std::int32_t>(t.indices.data() + t.indptr[h],
                                                       static_cast<std::size_t>(t.indptr[h + 1] - t.indptr[h])));
      const auto seq = sh.sequence(r, layer, h);
      hp.lengths.push_back(store.length(seq));
      hp.extents.push_back(store.row_extent(seq));
      holes = holes || store.row_extent(seq) != store.length(seq);
      in_order = in_order && store.rows_in_slot_order(seq);
    }
  }
  if (!holes) hp.extents.clear();  // pages hold exactly the tokens (what the Thrust export reads)
  if (in_order) return hp;
  std::vector<std::int32_t> rows;
  for (const int r : requests) {
    for (int h = 0; h < sh.kv_heads; ++h) {
      const auto seq = sh.sequence(r, layer, h);
      rows.resize(static_cast<std::size_t>(store.length(seq)));
      for (int i = 0; i < store.length(seq); ++i) rows[i] = store.row(seq, i);
      hp.rows.push_back(rows);
    }
  }
  return hp;
}

// Tokens form (page_size 1) of a token plan: slots[s] are the kept slots of entry s.
[[nodiscard]] inline flashinfer_table flashinfer_tokens(const head_pages& hp, const index_sets& slots) {
  constexpr std::string_view where = "flashinfer.tokens";
  detail::check_head_pages(hp, where);
  detail::check_plan_shape(hp, slots, where, "slots");
  validate_index_sets(slots, [&](int s) { return hp.lengths[s]; }, where, "slots");
  flashinfer_table t;
  t.page_size = 1;
  t.indptr = slots.offsets;
  t.indices.resize(slots.values.size());
  t.last_page_len.resize(static_cast<std::size_t>(slots.segments()));
  for (int s = 0; s < slots.segments(); ++s) {
    const auto seg = slots[s];
    const auto pl = hp.pages[s];
    const bool mapped = hp.rows.segments() > 0;
    for (std::size_t i = 0; i < seg.size(); ++i) {
      const std::int32_t row = mapped ? hp.rows[s][seg[i]] : seg[i];
      t.indices[slots.offsets[s] + i] = pl[row / hp.page_size] * hp.page_size + row % hp.page_size;
    }
    t.last_page_len[s] = seg.empty() ? 0 : 1;
  }
  return t;
}

// Pages form of a page plan over the store's pages: pages[s] are the kept logical pages of
// entry s (page p holds slots [p * page_size, (p + 1) * page_size)); `page_size` is the plan's
// page size and must equal hp.page_size.
[[nodiscard]] inline flashinfer_table flashinfer_pages(const head_pages& hp, const index_sets& pages,
                                                       int page_size) {
  constexpr std::string_view where = "flashinfer.pages";
  detail::check_head_pages(hp, where);
  require(page_size == hp.page_size, where, "page_size", page_size, [&] {
    return "the store's page size (" + std::to_string(hp.page_size) +
           "); export a plan of another page size in the tokens form, from its slots";
  });
  require(hp.rows.segments() <= 0, where, "head_pages.rows", "a row map (a retain reordered rows)",
          "slots in row order: a logical page is a store page only until a retain reorders rows; "
          "export a plan over reordered rows in the tokens form");
  detail::check_plan_shape(hp, pages, where, "pages");
  validate_index_sets(pages, [&](int s) { return hp.pages.size(s); }, where, "pages");
  flashinfer_table t;
  t.page_size = hp.page_size;
  t.indptr = pages.offsets;
  t.indices.resize(pages.values.size());
  t.last_page_len.resize(static_cast<std::size_t>(pages.segments()));
  for (int s = 0; s < pages.segments(); ++s) {
    const auto seg = pages[s];
    const auto pl = hp.pages[s];
    for (std::size_t i = 0; i < seg.size(); ++i) t.indices[pages.offsets[s] + i] = pl[seg[i]];
    if (seg.empty()) {
      t.last_page_len[s] = 0;
    } else if (seg.back() == static_cast<int>(pl.size()) - 1) {
      t.last_page_len[s] = hp.lengths[s] - seg.back() * hp.page_size;
    } else {
      t.last_page_len[s] = hp.page_size;
    }
  }
  return t;
}

// The same, read straight from the store: entries (requests[i], h) of `layer`.
template <Element T, HostAccessible Space>
[[nodiscard]] flashinfer_table flashinfer_tokens(const store::paged<T, Space>& store, int layer,
                                                 std::span<const int> requests,
                                                 const index_sets& slots) {
  return flashinfer_tokens(page_lists(store, layer, requests), slots);
}
template <Element T, HostAccessible Space>
[[nodiscard]] flashinfer_table flashinfer_pages(const store::paged<T, Space>& store, int layer,
                                                std::span<const int> requests,
                                                const index_sets& pages, int page_size) {
  return flashinfer_pages(page_lists(store, layer, requests), pages, page_size);
}

}  // namespace kvsift
