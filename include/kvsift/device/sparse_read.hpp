// SPDX-License-Identifier: Apache-2.0
#pragma once

// schedule::sparse_read over a device store: the content half (detail::sparse_read_content) that
// the one sparse_read body (method/schedule/sparse_read.hpp) calls when Quest runs over a
// thrust::dense_store or a thrust::paged_store.
//
// Full KV stays resident; each decode step scores every page of each KV head with the step's
// query and reads the selected pages. On the device, per request of the step:
//   page_digest_tail   the page the token landed in (a prompt's chunk: the pages it touched);
//                      the digests (per-page key min/max, [sequences, pages, d]) live in E memory
//                      beside the store, allocated once
//   page_scores        Quest's bound of every page, GQA-reduced (score::page_minmax's p.gqa)
//   segmented_topk     min(pages_for(budget), P) pages, the current (last) page protected, ties to
//                      the lower page (select::page_topk); over a padding segment up to the
//                      capacity in pages, so every step sorts the same count (no new scratch)
//   expand_page_slots  their slots, and gather_positions their original positions
// Counts are host arithmetic: P = ceil(n / page_size), the pages kept, and the slots they cover
// (every selected page is full but the last). A dense layer (layer < dense_layers) reads every
// page. Like the evict state, a decode step allocates nothing and reads nothing back; the test
// is tests/thrust/test_device_methods.cpp.

#include <kvsift/concepts.hpp>
#include <kvsift/device/one_tier.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/method/schedule/sparse_read.hpp>
#include <kvsift/score/page_minmax.hpp>
#include <kvsift/select/page_topk.hpp>
#include <kvsift/thrust/gather.hpp>
#include <kvsift/thrust/page_minmax.hpp>
#include <kvsift/thrust/segmented_topk.hpp>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kvsift::thrust::detail {

// Every page of every segment: pages[e] = e - page_offsets[s].
struct every_page_fn {
  const std::int32_t* page_offsets;
  int segments;
  std::int32_t* pages;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    pages[e] = static_cast<std::int32_t>(e - page_offsets[segment_of(page_offsets, segments, e)]);
  }
};

}  // namespace kvsift::thrust::detail

namespace kvsift::detail {

template <class Store, class Recipe>
  requires thrust::DeviceOneTierStore<Store>
class sparse_read_content<Store, Recipe> : public device_one_tier<Store> {
  using T = typename Store::element_type;
  using E = typename Store::exec_type;
  using base = device_one_tier<Store>;
  using space = typename E::memory_space;
  using base::exec_;
  using base::H_;
  using base::G_;
  using base::cap_;
  static_assert(std::is_same_v<typename Recipe::scorer, score::page_minmax> &&
                    std::is_same_v<typename Recipe::selector, select::page_topk>,
                "kvsift::method on a device exec: sparse_read runs score::page_minmax and "
                "select::page_topk (Quest) on the device");

 public:
  using chunk_type = prefill_chunk<T, space>;

  template <class M>
  explicit sparse_read_content(const M& m)
      : base(m),
        ps_(m.parts().selector.p.page_size),
        page_cap_((cap_ + ps_ - 1) / ps_),
        kmin_(exec_, static_cast<std::size_t>(m.store().sequences()) * page_cap_ *
                         m.store().shape().head_dim),
        kmax_(exec_, kmin_.size()),
        page_scores_(exec_, static_cast<std::size_t>(H_) * page_cap_),
        page_offsets_(exec_, static_cast<std::size_t>(m.store().requests()) * (H_ + 2)),
        kept_pages_offsets_(exec_, page_offsets_.size()),
        pages_(exec_, static_cast<std::size_t>(m.store().requests()) * H_ * page_cap_),
        window_(exec_, static_cast<std::size_t>(H_) + 1),
        topk_ws_(exec_, thrust::segmented_topk_workspace_bytes(static_cast<std::int64_t>(H_) *
                                                               page_cap_)) {
    std::vector<std::int32_t> current_page(static_cast<std::size_t>(H_) + 1, 1);
    current_page.back() = 0;  // the padding segment protects nothing
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(current_page), window_);
    ::thrust::fill_n(exec_.policy(), page_scores_.data(), page_scores_.size(), 0.0f);
    reserve_selection(m);
  }

  template <class M>
  void decode(M& m, int layer, std::span<const decode_token<T>> tokens, thrust::device_plan& plan) {
    auto& st = m.store();
    const auto& sh = st.shape();
    this->append_step(m, layer, tokens, plan.requests);
    const int R = static_cast<int>(tokens.size());
    for (const auto& t : tokens) digest(m, t.request, layer, st.length(sh.sequence(t.request, layer, 0)) - 1);
    // shapes: pages per head, the pages kept (all in a dense layer) and the slots they cover
    const bool dense = layer < m.parameters().dense_layers;
    lengths_.clear();
    for (int i = 0; i < R; ++i) {
      for (int h = 0; h < H_; ++h) lengths_.push_back(this->host_local_[i * (H_ + 1) + h + 1] -
                                                      this->host_local_[i * (H_ + 1) + h]);
    }
    if (!dense) {
      m.parts().budgeter.budgets(budget_context{layer, sh.layers, H_, lengths_}, budgets_);
    }
    page_local_.clear();
    kept_local_.clear();
    slot_local_.clear();
    plan.page_offsets.assign(1, 0);
    selects_.clear();
    for (int i = 0; i < R; ++i) {
      page_local_.push_back(0);
      kept_local_.push_back(0);
      slot_local_.push_back(0);
      bool selects = false;
      for (int h = 0; h < H_; ++h) {
        const int s = i * H_ + h;
        const int n = lengths_[s];
        const int P = (n + ps_ - 1) / ps_;
        const int kp = dense ? P : std::min(m.parts().selector.pages_for(budgets_[s]), P);
        page_local_.push_back(page_local_.back() + P);
        kept_local_.push_back(kept_local_.back() + kp);
        slot_local_.push_back(slot_local_.back() + (kp >= P ? n : n - (P - kp) * ps_));
        plan.page_offsets.push_back(plan.page_offsets.back() + kp);
        selects = selects || kp < P;
      }
      // a padding segment up to H * page_cap pages, keeping none: the top-k sorts the same
      // number of scores every step, so its scratch is the same size (the capture law)
      page_local_.push_back(H_ * page_cap_);
      kept_local_.push_back(kept_local_.back());
      selects_.push_back(selects ? 1 : 0);
    }
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(page_local_), page_offsets_);
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(kept_local_), kept_pages_offsets_);
    this->plan_selected(plan, slot_local_);
    // the device: per request, the pages (scored and selected, or all), their slots, positions
    const auto policy = exec_.policy();
    for (int i = 0; i < R; ++i) {
      const std::int32_t* pages_off = page_offsets_.data() + i * (H_ + 2);
      const std::int32_t* kept_off = kept_pages_offsets_.data() + i * (H_ + 2);
      std::int32_t* pages = pages_.data() + plan.page_offsets[static_cast<std::size_t>(i) * H_];
      const std::int64_t P_all = page_local_[i * (H_ + 2) + H_];
      const std::int64_t kept = kept_local_[i * (H_ + 2) + H_];
      if (!selects_[i]) {  // every page fits (or a dense layer): no selection
        ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), kept,
                             thrust::detail::every_page_fn{kept_off, H_, pages});
      } else {
        const std::int64_t seq0 = sh.sequence(tokens[i].request, layer, 0);
        const std::int64_t at = seq0 * page_cap_ * sh.head_dim;
        thrust::page_scores(policy, tokens[i].query, H_, G_, sh.head_dim, kmin_.data() + at,
                            kmax_.data() + at, pages_off, H_, P_all,
                            m.parts().scorer.p.gqa, page_scores_.data(), page_cap_);
        thrust::segmented_topk(policy, page_scores_.data(), pages_off, H_ + 1,
                               static_cast<std::int64_t>(H_) * page_cap_, kept_off, kept, pages,
                               topk_ws_.data(), topk_ws_.size(),
                               thrust::topk_protection{0, window_.data()}, /*check=*/false);
      }
      const std::int32_t* slot_off = this->plan_local_d_.data() + i * (H_ + 1);
      std::int32_t* slots = this->plan_slots_.data() + this->plan_base_[i];
      const std::int64_t M_i = slot_local_[i * (H_ + 1) + H_];
      thrust::expand_page_slots(policy, kept_off, pages, H_, ps_, slot_off, M_i, slots);
      const auto [k, v] = base::rows_of(m, tokens[i].request, layer, this->local_offsets(i));
      thrust::gather_positions(policy, k, slot_off, slots, M_i,
                               this->plan_positions_.data() + this->plan_base_[i]);
    }
    plan.pages = pages_.data();
    if (!dense) ++this->refreshes_;
  }

 protected:
  // A chunk appended at `before`: the digests of the pages it touched.
  template <class M>
  void appended(M& m, int request, int layer, int before) { digest(m, request, layer, before); }
  template <class M>
  void forget_request(M&, int) {}  // the digests are rewritten as the new prompt is appended

 private:
  // The selection's sorts have the same size every step (the padding segment; the kept count is
  // H * pages_for(budget) once pages are dropped): run one now, at the budget of a head at full
  // capacity, so the exec's arena holds their scratch and no decode step allocates it.
  template <class M>
  void reserve_selection(const M& m) {
    const auto& sh = m.store().shape();
    const int layer = std::min(m.parameters().dense_layers, sh.layers - 1);
    std::vector<int> lengths(static_cast<std::size_t>(H_), cap_), budgets;
    m.parts().budgeter.budgets(budget_context{layer, sh.layers, H_, lengths}, budgets);
    std::vector<std::int32_t> offsets{0}, kept{0};
    for (int h = 0; h < H_; ++h) {
      offsets.push_back(offsets.back() + page_cap_);
      kept.push_back(kept.back() + std::min(m.parts().selector.pages_for(budgets[h]), page_cap_));
    }
    offsets.push_back(offsets.back());  // the padding segment, empty at full capacity
    kept.push_back(kept.back());
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(offsets), page_offsets_);
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(kept), kept_pages_offsets_);
    thrust::segmented_topk(exec_.policy(), page_scores_.data(), page_offsets_.data(), H_ + 1,
                           static_cast<std::int64_t>(H_) * page_cap_, kept_pages_offsets_.data(),
                           kept.back(), pages_.data(), topk_ws_.data(), topk_ws_.size(),
                           thrust::topk_protection{0, window_.data()}, /*check=*/false);
  }

  // Recomputes the digests of (request, layer)'s pages from the one holding slot `from` on.
  template <class M>
  void digest(M& m, int request, int layer, int from) {
    const auto& st = m.store();
    const std::int64_t seq0 = st.shape().sequence(request, layer, 0);
    const int n = st.length(seq0);
    const int tail = (n + ps_ - 1) / ps_ - from / ps_;
    host_digest_offsets_.assign(1, 0);
    for (int h = 0; h < H_; ++h) host_digest_offsets_.push_back(host_digest_offsets_.back() + st.length(seq0 + h));
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(host_digest_offsets_),
                           digest_offsets_);
    const auto [k, v] = base::rows_of(m, request, layer, digest_offsets_.data());
    const std::int64_t at = seq0 * page_cap_ * st.shape().head_dim;
    thrust::page_digest_tail(exec_.policy(), k, ps_, tail, kmin_.data() + at, kmax_.data() + at,
                             page_cap_);
  }

  int ps_, page_cap_;
  // E memory, allocated once: the digests [sequences, pages, d], a request's page scores, the
  // step's page CSRs (per request, local, with a padding segment), the selected pages, the
  // protection (the current page), top-k scratch
  thrust::buffer<float, E> kmin_, kmax_, page_scores_;
  thrust::buffer<std::int32_t, E> page_offsets_, kept_pages_offsets_, pages_, window_;
  thrust::buffer<std::byte, E> topk_ws_;
  thrust::buffer<std::int32_t, E> digest_offsets_{exec_, static_cast<std::size_t>(H_) + 1};
  // host: the step's shapes
  std::vector<int> lengths_, budgets_;
  std::vector<std::int32_t> page_local_, kept_local_, slot_local_, host_digest_offsets_;
  std::vector<char> selects_;  // per request of the step: some head keeps fewer than its pages
};

}  // namespace kvsift::detail
