// SPDX-License-Identifier: Apache-2.0
#pragma once

// roles::stars over device memory (HeteroCache): the content half that schedule::deferred_recall's
// one body calls (through device/deferred_recall.hpp) for method<thrust::tiered_store<T, E>,
// heterocache_recipe, E>, as the host body calls roles/stars.hpp.
//
// Contract: the host's semantics (METHODS.md "HeteroCache"): the same plans (as positions), drift
// checks and events, references and resident tokens. Shapes are computed on the host, contents
// stay on the device; both drift outcomes have the same shapes, so nothing is read back, and what
// is decided after step t is installed at the request's next decode on the layer. Every buffer is
// allocated at construction; a decode step uploads descriptors and reads nothing back. Accessors
// that read device data (refreshes(), rows_recalled(), recall_pending(), drift_median(),
// drifted(), reference(), stats()) make one counted read each: call them outside a step. The
// steps, capacities and cost: docs/architecture.md, "Design notes from the headers".

#include <kvsift/budget/inverse_stability.hpp>
#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/device/roles_clusters.hpp>
#include <kvsift/device/two_tier.hpp>
#include <kvsift/method/heterocache.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/roles/stars.hpp>
#include <kvsift/thrust/drift_median.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/last_query_attention.hpp>
#include <kvsift/thrust/tiered_store.hpp>

#include <thrust/copy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/sort.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kvsift::thrust::detail {

// One ranking key per (row t, index j) of a fixed [rows, cap] layout: (t << 33) | (j >= n) << 32
// | descending score bits, so a stable sort orders each row's n scored indices best first (ties
// to the lower index: select::topk's and cpu::topk_of's order) before its padding. items = j.
struct stars_rank_key_fn {
  const float* scores;  // row t at t * n
  int n, cap;
  std::uint64_t* keys;
  std::int32_t* items;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t t = e / cap;
    const int j = static_cast<int>(e % cap);
    const bool pad = j >= n;
    const float sc = pad ? 0.0f : scores[t * n + j];
    keys[e] = (static_cast<std::uint64_t>(t) << 33) |
              (static_cast<std::uint64_t>(pad ? 1u : 0u) << 32) |
              static_cast<std::uint64_t>(descending_key(sc));
    items[e] = j;
  }
};

// A take: the first k ranked indices of one sorted row, written ascending at an offset.
// desc [takes, 4]: source row, k, output offset, position row (-1: write the indices).
inline constexpr int stars_take_fields = 4;

// flags [takes, cap]: 1 at the indices take t keeps.
struct stars_flag_top_fn {
  const std::int32_t* sorted_items;  // [rows, cap]
  const std::int32_t* desc;
  int cap;
  std::int32_t* flags;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t t = e / cap;
    const int r = static_cast<int>(e % cap);
    const std::int32_t* d = desc + t * stars_take_fields;
    if (r < d[1]) flags[t * cap + sorted_items[static_cast<std::int64_t>(d[0]) * cap + r]] = 1;
  }
};

// One thread per take: its flagged indices in ascending order, as indices or as the positions of
// its position row ([rows, cap]).
struct stars_compact_fn {
  const std::int32_t* flags;
  const std::int32_t* desc;
  const std::int32_t* positions;
  int cap;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const std::int32_t* d = desc + t * stars_take_fields;
    const std::int32_t* f = flags + t * cap;
    const std::int32_t* pos =
        d[3] < 0 ? nullptr : positions + static_cast<std::int64_t>(d[3]) * cap;
    std::int32_t* o = out + d[2];
    for (int j = 0; j < cap; ++j) {
      if (f[j] != 0) *o++ = pos == nullptr ? j : pos[j];
    }
  }
};

// A drift check's record, one thread per satellite (desc [F, 4]: head, monitored pivot, k =
// min(n, cap_s), offset of its new part in `picked`): its next prompt part into parts[i * cap] =
// the new part where its pivot drifted, else its current one (the first k entries of its plan);
// missing[i] = the new part's rows not resident (0 without a drift).
struct stars_record_fn {
  const std::int32_t* desc;
  const std::int32_t* drift;  // [P] the check's decisions
  const std::int32_t* picked;
  const std::int32_t* plan_positions;  // the store's [sequences, cap]
  std::int64_t seq0;                   // sequence of head 0 of (request, layer)
  int cap;
  std::int32_t* parts;    // [F, cap]
  std::int32_t* missing;  // [F]
  KVSIFT_HOST_DEVICE void operator()(std::int64_t i) const {
    const std::int32_t* d = desc + i * stars_take_fields;
    const int k = d[2];
    const std::int32_t* cur = plan_positions + (seq0 + d[0]) * cap;
    const std::int32_t* next = picked + d[3];
    std::int32_t* out = parts + i * cap;
    if (drift[d[1]] == 0) {
      for (int j = 0; j < k; ++j) out[j] = cur[j];
      missing[i] = 0;
      return;
    }
    int a = 0;
    int b = 0;
    int common = 0;
    while (a < k && b < k) {  // both ascend
      if (next[a] < cur[b]) {
        ++a;
      } else if (cur[b] < next[a]) {
        ++b;
      } else {
        ++common;
        ++a;
        ++b;
      }
    }
    for (int j = 0; j < k; ++j) out[j] = next[j];
    missing[i] = k - common;
  }
};

// Each monitored pivot's next reference: q_t's top set (the newest window row's) where it
// drifted, else its current one. One thread per entry of [P, base].
struct stars_next_reference_fn {
  const std::int32_t* drift;
  const std::int32_t* sets;  // [P * W, base]
  const std::int32_t* reference;
  int window, base;
  std::int32_t* next;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t p = e / base;
    next[e] = drift[p] != 0 ? sets[(p * window + window - 1) * base + e % base] : reference[e];
  }
};

// The drift events and recalled rows of a check, added to counters [2] (one thread); under
// far_tier::attend (recalls false) nothing is recalled, as on the host.
struct stars_count_fn {
  const std::int32_t* drift;
  int pivots;
  const std::int32_t* missing;
  int satellites;
  bool recalls;
  std::int64_t* counters;
  KVSIFT_HOST_DEVICE void operator()(int) const {
    for (int p = 0; p < pivots; ++p) counters[0] += drift[p];
    for (int i = 0; recalls && i < satellites; ++i) counters[1] += missing[i];
  }
};

// The install's targets, back to back by `offsets` ([F + 1]): satellite i's recorded part
// (parts[i * cap], offsets[i + 1] - offsets[i] - steps entries), then its decode positions
// [prompt_end, prompt_end + steps).
struct stars_targets_fn {
  const std::int32_t* offsets;
  int satellites;
  const std::int32_t* parts;
  int cap, steps;
  std::int32_t prompt_end;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int i = segment_of(offsets, satellites, e);
    const int j = static_cast<int>(e - offsets[i]);
    const int k = offsets[i + 1] - offsets[i] - steps;
    out[e] = j < k ? parts[static_cast<std::int64_t>(i) * cap + j] : prompt_end + (j - k);
  }
};

}  // namespace kvsift::thrust::detail

namespace kvsift::detail {

template <Element T, thrust::DeviceExec E, class Recipe>
class device_roles<roles::stars, T, E, Recipe> : public device_roles_base<T, E> {
  using chunk_type = prefill_chunk<T, typename E::memory_space>;
  using space = typename E::memory_space;
  using role = calibrate::head_role;
  static_assert(std::is_same_v<typename Recipe::scorer, score::last_query_attention> &&
                    std::is_same_v<typename Recipe::selector, select::topk> &&
                    std::is_same_v<typename Recipe::trigger, trigger::drift_median>,
                "kvsift::method on a device exec: the device deferred_recall state of roles::stars "
                "is HeteroCache's recipe (last_query_attention, topk, drift_median)");

 protected:  // what the body reads of device_roles_base
  using base = device_roles_base<T, E>;
  using base::exec_;
  using base::H_;
  using base::G_;
  using base::d_;
  using base::cap_;
  using base::layers_;
  using base::layer_budgets_;
  using base::skip_installs_;
  using base::step_;

 public:
  // What the heterocache interface reads of a placed (request, layer) (host arithmetic).
  struct roles_view {
    int base = 0;          // the reference sets' size
    std::vector<int> cap;  // [H] cap_h (n for full-KV heads)
  };
  // The host shadow of (request, layer).
  struct slot_state {
    std::int32_t prompt_end = -1;  // positions below it are the prompt; -1 before its end
    int steps = 0;                 // decode steps since the prompt ended
    int n = 0;                     // prompt tokens
    int layer = 0;                 // the slot's layer (its roles)
    bool checked = false;   // the last after_attention ran a drift check
    bool recorded = false;  // a check's record, installed by the next decode
    roles_view roles{};
  };

  // A check's record not installed yet (host shadow: after every check, drift or not).
  [[nodiscard]] bool recorded(std::size_t slot) const { return slots_[slot].recorded; }
  // As the host's: a recorded retrieval of which some pivot drifted. Reads the check's drift
  // flags back when one is recorded (one counted D2H read; none otherwise).
  [[nodiscard]] bool recall_pending(std::size_t slot) const {
    const auto& s = slots_[slot];
    if (!s.recorded) return false;
    const auto flags = read(drift_.data() + slot * pmax_, info_[s.layer].monitored);
    return std::any_of(flags.begin(), flags.end(), [](std::int32_t x) { return x != 0; });
  }
  // Drift checks since construction: per firing request, one per monitored pivot (host).
  [[nodiscard]] std::int64_t checks() const { return checks_; }
  // Drift events (pivot windows that drifted) since construction: one counted D2H read.
  [[nodiscard]] std::int64_t refreshes() const { return counters()[0]; }
  // Satellite rows the retrievals asked the pool for (not resident when decided): one D2H read.
  [[nodiscard]] std::int64_t rows_recalled() const { return counters()[1]; }
  // The last after_attention's check of KV head `head` (-1 where none ran; a monitored pivot's
  // median otherwise): one counted D2H read when a check ran on a monitored pivot.
  [[nodiscard]] double drift_median(std::size_t slot, int head) const {
    const int p = checked_pivot(slot, head);
    return p < 0 ? -1.0 : read(median_.data() + slot * pmax_ + p, 1)[0];
  }
  [[nodiscard]] bool drifted(std::size_t slot, int head) const {
    const int p = checked_pivot(slot, head);
    return p >= 0 && read(drift_.data() + slot * pmax_ + p, 1)[0] != 0;
  }
  // A pivot's reference set (positions, ascending; empty for other heads or before the prompt's
  // end): one counted D2H read.
  [[nodiscard]] std::vector<std::int32_t> reference(std::size_t slot, int head) const {
    const auto& s = slots_[slot];
    if (s.prompt_end < 0) return {};
    const auto& pv = info_[s.layer].pivots;
    const auto it = std::find(pv.begin(), pv.end(), head);
    if (it == pv.end()) return {};
    const auto p = static_cast<std::size_t>(it - pv.begin());
    return read(reference_.data() + slot * pivot_per() + p * s.roles.base, s.roles.base);
  }
  // The recorded next prompt parts of a slot's satellites (E memory, [satellites, tier_capacity]
  // rows; satellite i = satellites(layer)[i], min(n, cap) entries each). Valid while recorded().
  [[nodiscard]] const std::int32_t* recorded_parts(std::size_t slot) const {
    return parts_.data() + slot * satellite_per();
  }
  // The satellites of monitored pivots of a layer, in record order.
  [[nodiscard]] const std::vector<int>& satellites(int layer) const {
    return info_[layer].satellites;
  }

 protected:
  template <class M>
  explicit device_roles(const M& m)
      : base(m),
        W_(m.parts().trigger.p.window),
        info_(layout(m.parts().roles, m.store().shape().layers)),
        pmax_(max_of(info_, [](const layer_info& l) { return static_cast<int>(l.pivots.size()); })),
        fmax_(max_of(info_,
                     [](const layer_info& l) { return static_cast<int>(l.satellites.size()); })),
        rows_(std::max(H_, pmax_ * W_)),
        takes_(std::max(H_ + pmax_, pmax_ * W_ + fmax_)),
        slots_(static_cast<std::size_t>(m.store().requests()) * layers_),
        keys_pk_(exec_, per() * d_),
        pos_pk_(exec_, per()),
        qg_(exec_, static_cast<std::size_t>(H_) * G_ * d_),
        qpos_(exec_, 1),
        ring_(exec_, slots_.size() * ring_per()),
        scores_(exec_, rows_ * static_cast<std::size_t>(cap_)),
        score_ws_(exec_, std::max(thrust::query_attention_workspace_bytes(
                                      static_cast<std::int64_t>(per()), G_, 1),
                                  thrust::query_attention_workspace_bytes(
                                      static_cast<std::int64_t>(pmax_) * cap_, G_, W_))),
        drift_ws_(exec_, thrust::drift_medians_workspace_bytes(pmax_, W_)),
        off_a_(exec_, rows_ + 1),
        off_b_(exec_, rows_ + 1),
        sort_keys_(exec_, rows_ * static_cast<std::size_t>(cap_)),
        sort_items_(exec_, rows_ * static_cast<std::size_t>(cap_)),
        flags_(exec_, takes_ * static_cast<std::size_t>(cap_)),
        picked_(exec_, takes_ * static_cast<std::size_t>(cap_)),
        desc_(exec_,
              (takes_ + static_cast<std::size_t>(fmax_)) * thrust::detail::stars_take_fields),
        reference_(exec_, slots_.size() * pivot_per()),
        next_reference_(exec_, slots_.size() * pivot_per()),
        median_(exec_, slots_.size() * static_cast<std::size_t>(pmax_)),
        drift_(exec_, slots_.size() * static_cast<std::size_t>(pmax_)),
        parts_(exec_, slots_.size() * satellite_per()),
        missing_(exec_, static_cast<std::size_t>(fmax_)),
        counters_(exec_, 2),
        target_offsets_(exec_, static_cast<std::size_t>(fmax_) + 1),
        targets_(exec_, satellite_per()),
        heads_d_(exec_, static_cast<std::size_t>(layers_ + 1) * H_) {
    // per layer its pivots (monitored first) at l * H; every head 0..H-1 at layers * H
    std::vector<std::int32_t> heads(static_cast<std::size_t>(layers_ + 1) * H_, 0);
    for (int l = 0; l < layers_; ++l) {
      std::copy(info_[l].pivots.begin(), info_[l].pivots.end(),
                heads.begin() + static_cast<std::ptrdiff_t>(l) * H_);
    }
    for (int h = 0; h < H_; ++h) heads[static_cast<std::size_t>(layers_) * H_ + h] = h;
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(heads), heads_d_);
    const auto policy = exec_.policy();
    ::thrust::fill_n(policy, counters_.data(), 2, std::int64_t{0});
    // warm the rankings' fixed-size sorts once per size (their scratch then comes from the
    // arena's cache in every step)
    std::vector<std::int64_t> done;
    for (int l = 0; l <= layers_; ++l) {
      const std::int64_t N =
          static_cast<std::int64_t>(l < layers_ ? info_[l].monitored * W_ : H_) * cap_;
      if (N == 0 || std::find(done.begin(), done.end(), N) != done.end()) continue;
      done.push_back(N);
      ::thrust::fill_n(policy, sort_keys_.data(), N, std::uint64_t{0});
      ::thrust::fill_n(policy, sort_items_.data(), N, 0);
      ::thrust::stable_sort_by_key(policy, sort_keys_.data(), sort_keys_.data() + N,
                                   sort_items_.data());
    }
  }
  device_roles(device_roles&&) noexcept = default;

  static constexpr bool reads_step_query = false;  // decode() keeps q_t in the window ring

  // A prompt's end: the inverse-stability caps, then the placement.
  template <class M>
  void begin(M& m, int layer, const chunk_type& c, slot_state& s, std::size_t slot) {
    s.layer = layer;
    const auto b = m.parts().budgeter.caps(H_, s.n);  // the recipe's budgeter
    s.roles.base = b.base;
    s.roles.cap.assign(b.cap.begin() + static_cast<std::ptrdiff_t>(layer) * H_,
                       b.cap.begin() + static_cast<std::ptrdiff_t>(layer + 1) * H_);
    layer_budgets_[layer] = b.base;
    place(m, layer, c, s, slot);
  }
  template <class M>  // an install keeps each satellite's length
  [[nodiscard]] int installed_length(const M& m, const slot_state&, int request, int layer,
                                     int h) const {
    return m.store().length(m.store().shape().sequence(request, layer, h));
  }
  // The recorded install, then q_t's groups of the monitored pivots into the window ring.
  template <class M>
  void begin_step(M& m, int layer, const decode_token<T>& t) {
    if (!skip_installs_) install(m, layer, t.request);
    const std::int64_t groups = static_cast<std::int64_t>(info_[layer].monitored) * G_ * d_;
    if (groups == 0) return;
    const auto k = m.slot(t.request, layer);
    ::thrust::for_each_n(
        exec_.policy(), ::thrust::counting_iterator<std::int64_t>(0), groups,
        thrust::detail::gather_query_groups_fn<space>{
            kv_view<const float, nhd, space>::contiguous(t.query, 1, H_ * G_, d_), 0,
            heads_d_.data() + static_cast<std::size_t>(layer) * H_, G_,
            ring_.data() + k * ring_per() +
                static_cast<std::size_t>(slots_[k].steps % W_) * groups});
  }
  [[nodiscard]] bool refreshing(int layer) const { return info_[layer].monitored > 0; }
  static void end_round(slot_state& s) { s.checked = false; }
  template <class M>
  void fire(M& m, int layer, const decode_token<T>& t) { check(m, layer, t.request); }

  // Each layer's monitored pivots and satellites: the roles' shape half (roles::stars::layout).
  using layer_info = roles::stars::layer_layout;
  int W_;
  std::vector<layer_info> info_;  // [layers]
  int pmax_, fmax_;               // the most pivots, monitored pivots' satellites of a layer
  std::size_t rows_, takes_;      // the most ranked rows and takes of a prefill or a check
  std::vector<slot_state> slots_;  // [requests * layers]

 private:
  static std::vector<layer_info> layout(const roles::stars& r, int layers) {
    std::vector<layer_info> out;
    for (int l = 0; l < layers; ++l) out.push_back(r.layout(l));
    return out;
  }
  template <class F>
  static int max_of(const std::vector<layer_info>& info, F f) {
    int m = 0;
    for (const auto& l : info) m = std::max(m, f(l));
    return m;
  }
  [[nodiscard]] std::size_t per() const { return static_cast<std::size_t>(H_) * cap_; }
  [[nodiscard]] std::size_t ring_per() const {
    return static_cast<std::size_t>(W_) * pmax_ * G_ * d_;
  }
  [[nodiscard]] std::size_t pivot_per() const { return static_cast<std::size_t>(pmax_) * cap_; }
  [[nodiscard]] std::size_t satellite_per() const { return static_cast<std::size_t>(fmax_) * cap_; }
  // The index of `head` among the monitored pivots of the slot's layer when its last
  // after_attention checked; -1 otherwise.
  [[nodiscard]] int checked_pivot(std::size_t slot, int head) const {
    const auto& s = slots_[slot];
    if (!s.checked) return -1;
    const auto& li = info_[s.layer];
    for (int p = 0; p < li.monitored; ++p) {
      if (li.pivots[p] == head) return p;
    }
    return -1;
  }
  template <class U>
  std::vector<U> read(const U* p, int n) const {
    std::vector<U> out(static_cast<std::size_t>(std::max(n, 0)));
    thrust::copy_to_host(exec_, p, std::span<U>(out));
    return out;
  }
  [[nodiscard]] std::vector<std::int64_t> counters() const { return read(counters_.data(), 2); }

  // Plan rows [0, L) of the heads `heads` (E memory, S of them) of (request, layer) into keys_pk_
  // / pos_pk_ ([S, cap] layout), and their scores under `queries` (window nq, positions qpos_)
  // into scores_: row (s, i) at (s * nq + i) * L.
  template <class M>
  void score_rows(M& m, int layer, int request, const std::int32_t* heads, int S, int L,
                  const float* queries, int nq, int kernel) {
    auto& st = m.store();
    const auto policy = exec_.policy();
    const std::int64_t seq0 = st.shape().sequence(request, layer, 0);
    ::thrust::for_each_n(
        policy, ::thrust::counting_iterator<std::int64_t>(0), static_cast<std::int64_t>(S) * L * d_,
        thrust::detail::gather_plan_rows_fn<T>{st.rows(), st.plan_slots(), st.plan_positions(),
                                               heads, seq0, L, cap_, d_, keys_pk_.data(),
                                               pos_pk_.data()});
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), S + 1,
                         thrust::detail::uniform_offsets_fn{L, L, off_a_.data(), off_a_.data()});
    const std::int64_t stride = static_cast<std::int64_t>(cap_) * d_;
    const thrust::segmented_rows<T> keys{keys_pk_.data(), off_a_.data(), pos_pk_.data(), stride, S,
                                         d_};
    const thrust::window_queries wq{queries, qpos_.data(), nq, S, G_};
    thrust::query_attention_scores(policy, keys, wq, static_cast<std::int64_t>(S) * L, kernel,
                                   pooling::avg, gqa_reduce::max, scores_.data(), score_ws_.data(),
                                   score_ws_.size());
  }

  // Ranks `rows` score rows of n (scores_) in the fixed [rows, cap] layout, then runs the takes
  // of desc_ (uploaded by the caller, `takes` of them) into picked_.
  void take_top(int rows, int n, int takes) {
    const auto policy = exec_.policy();
    // fixed per layer (rows x tier capacity, not x n): the sort's scratch repeats
    const std::int64_t N = static_cast<std::int64_t>(rows) * cap_;
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), N,
                         thrust::detail::stars_rank_key_fn{scores_.data(), n, cap_,
                                                           sort_keys_.data(), sort_items_.data()});
    ::thrust::stable_sort_by_key(policy, sort_keys_.data(), sort_keys_.data() + N,
                                 sort_items_.data());
    const std::int64_t F = static_cast<std::int64_t>(takes) * cap_;
    ::thrust::fill_n(policy, flags_.data(), F, 0);
    ::thrust::for_each_n(
        policy, ::thrust::counting_iterator<std::int64_t>(0), F,
        thrust::detail::stars_flag_top_fn{sort_items_.data(), desc_.data(), cap_, flags_.data()});
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), takes,
                         thrust::detail::stars_compact_fn{flags_.data(), desc_.data(),
                                                          pos_pk_.data(), cap_, picked_.data()});
  }

  // The prompt's round of one request: every head scored with the last query; the kept plan
  // indices of each head retained; the pivots' references recorded.
  template <class M>
  void place(M& m, int layer, const chunk_type& c, slot_state& s, std::size_t slot) {
    const auto& li = info_[layer];
    const int n = s.n;
    const auto policy = exec_.policy();
    const std::int32_t* all = heads_d_.data() + static_cast<std::size_t>(layers_) * H_;
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0),
                         static_cast<std::int64_t>(H_) * G_ * d_,
                         thrust::detail::gather_query_groups_fn<space>{
                             c.queries, c.queries.tokens - 1, all, G_, qg_.data()});
    const std::int32_t qpos = s.prompt_end - 1;
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(&qpos, 1), qpos_);
    score_rows(m, layer, c.request, all, H_, n, qg_.data(), 1, m.parts().scorer.p.kernel);
    // takes: each head's kept indices (all n, or its top min(n, cap_h)), then each pivot's top base
    desc_host_.clear();
    counts_.clear();
    int at = 0;
    for (int h = 0; h < H_; ++h) {
      const bool full = budget::full_kv(m.parts().roles.p.layers[layer].roles[h]);
      const int k = full ? n : std::min(n, s.roles.cap[h]);
      desc_host_.insert(desc_host_.end(), {h, k, at, -1});
      counts_.push_back(k);
      at += k;
    }
    const int P = static_cast<int>(li.pivots.size());
    for (int p = 0; p < P; ++p) {
      desc_host_.insert(desc_host_.end(),
                        {li.pivots[p], s.roles.base, at + p * s.roles.base, li.pivots[p]});
    }
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(desc_host_), desc_);
    take_top(H_, n, H_ + P);
    m.store().retain(c.request, layer, counts_, picked_.data());
    if (P > 0) {
      ::thrust::copy_n(policy, picked_.data() + at, static_cast<std::int64_t>(P) * s.roles.base,
                       reference_.data() + slot * pivot_per());
    }
  }

  // A drift check of request `request` after its step: the window's scores over each monitored
  // pivot's prompt rows, the probe on the device, the record (see the file comment).
  template <class M>
  void check(M& m, int layer, int request) {
    const auto slot = m.slot(request, layer);
    auto& s = slots_[slot];
    if (s.recorded) install(m, layer, request);  // decisions apply in order
    const auto& li = info_[layer];
    const int P = li.monitored, F = static_cast<int>(li.satellites.size());
    const int n = s.n, base = s.roles.base;
    const auto policy = exec_.policy();
    const std::int32_t qpos = s.prompt_end - 1;  // every window query sees exactly the prompt
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(&qpos, 1), qpos_);
    score_rows(m, layer, request, heads_d_.data() + static_cast<std::size_t>(layer) * H_, P, n,
               ring_.data() + slot * ring_per(), W_, m.parts().roles.p.kernel);
    // takes: each (pivot, window query)'s top base, then each satellite's top min(n, cap_s) of
    // its pivot's newest row; then the satellites' record descriptors
    desc_host_.clear();
    for (int t = 0; t < P * W_; ++t) {
      desc_host_.insert(desc_host_.end(), {t, base, t * base, t / W_});
    }
    int at = P * W_ * base;
    for (int i = 0; i < F; ++i) {
      const int p = li.satellite_pivot[i];
      const int k = std::min(n, s.roles.cap[li.satellites[i]]);
      desc_host_.insert(desc_host_.end(), {p * W_ + W_ - 1, k, at, p});
      at += k;
    }
    at = P * W_ * base;
    for (int i = 0; i < F; ++i) {
      const int k = std::min(n, s.roles.cap[li.satellites[i]]);
      desc_host_.insert(desc_host_.end(), {li.satellites[i], li.satellite_pivot[i], k, at});
      at += k;
    }
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(desc_host_), desc_);
    take_top(P * W_, n, P * W_ + F);
    // the probe: drift[p] = median over the window of overlap(set, reference) < tau_drift
    ::thrust::for_each_n(
        policy, ::thrust::counting_iterator<std::int64_t>(0), P * W_ + 1,
        thrust::detail::uniform_offsets_fn{base, base, off_b_.data(), off_b_.data()});
    std::int32_t* drift = drift_.data() + slot * pmax_;
    std::int32_t* reference = reference_.data() + slot * pivot_per();
    thrust::drift_medians(policy, off_b_.data(), picked_.data(), off_b_.data(), reference, P, W_,
                          m.parts().trigger.p.tau_drift, median_.data() + slot * pmax_, drift,
                          drift_ws_.data(), drift_ws_.size());
    // the record: both outcomes' shapes, chosen per pivot on the device
    if (base > 0) {
      ::thrust::for_each_n(
          policy, ::thrust::counting_iterator<std::int64_t>(0), static_cast<std::int64_t>(P) * base,
          thrust::detail::stars_next_reference_fn{drift, picked_.data(), reference, W_, base,
                                                  next_reference_.data() + slot * pivot_per()});
    }
    const std::int32_t* sat_desc =
        desc_.data() + static_cast<std::size_t>(P * W_ + F) * thrust::detail::stars_take_fields;
    ::thrust::for_each_n(
        policy, ::thrust::counting_iterator<std::int64_t>(0), F,
        thrust::detail::stars_record_fn{sat_desc, drift, picked_.data(), m.store().plan_positions(),
                                        m.store().shape().sequence(request, layer, 0), cap_,
                                        parts_.data() + slot * satellite_per(), missing_.data()});
    ::thrust::for_each_n(
        policy, ::thrust::counting_iterator<int>(0), 1,
        thrust::detail::stars_count_fn{drift, P, missing_.data(), F,
                                       step_.far() == far_tier::recall, counters_.data()});
    checks_ += P;
    s.checked = true;
    s.recorded = true;
  }

  // The lazy copy queue: the record of the last check installed now (each satellite: its
  // recorded prompt part and its decode tokens), then the references committed.
  template <class M>
  void install(M& m, int layer, int request) {
    const auto slot = m.slot(request, layer);
    auto& s = slots_[slot];
    if (!s.recorded) return;
    const auto& li = info_[layer];
    const auto& sh = m.store().shape();
    const int F = static_cast<int>(li.satellites.size());
    seqs_.clear();
    counts_.clear();
    offsets_host_.assign(1, 0);
    for (const int x : li.satellites) {
      seqs_.push_back(sh.sequence(request, layer, x));
      counts_.push_back(std::min(s.n, s.roles.cap[x]) + s.steps);
      offsets_host_.push_back(offsets_host_.back() + counts_.back());
    }
    const auto policy = exec_.policy();
    if (F > 0) {
      thrust::copy_to_device(exec_, std::span<const std::int32_t>(offsets_host_), target_offsets_);
      ::thrust::for_each_n(
          policy, ::thrust::counting_iterator<std::int64_t>(0), offsets_host_.back(),
          thrust::detail::stars_targets_fn{target_offsets_.data(), F,
                                           parts_.data() + slot * satellite_per(), cap_, s.steps,
                                           s.prompt_end, targets_.data()});
      step_.install(m.store(), seqs_, counts_, targets_.data());
    }
    const std::int64_t refs = static_cast<std::int64_t>(li.monitored) * s.roles.base;
    if (refs > 0) {
      ::thrust::copy_n(policy, next_reference_.data() + slot * pivot_per(), refs,
                       reference_.data() + slot * pivot_per());
    }
    s.recorded = false;
  }

  std::int64_t checks_ = 0;
  // E memory, allocated once
  thrust::buffer<T, E> keys_pk_;
  thrust::buffer<std::int32_t, E> pos_pk_;
  thrust::buffer<float, E> qg_;
  thrust::buffer<std::int32_t, E> qpos_;
  thrust::buffer<float, E> ring_;  // [slots, W, monitored pivots x G x d] the newest W queries
  thrust::buffer<float, E> scores_;
  thrust::buffer<std::byte, E> score_ws_, drift_ws_;
  thrust::buffer<std::int32_t, E> off_a_, off_b_;
  thrust::buffer<std::uint64_t, E> sort_keys_;
  thrust::buffer<std::int32_t, E> sort_items_, flags_, picked_, desc_;
  thrust::buffer<std::int32_t, E> reference_, next_reference_;  // [slots, pivots, base]
  thrust::buffer<double, E> median_;                            // [slots, monitored pivots]
  thrust::buffer<std::int32_t, E> drift_;
  thrust::buffer<std::int32_t, E> parts_;  // [slots, satellites, cap]
  thrust::buffer<std::int32_t, E> missing_;
  thrust::buffer<std::int64_t, E> counters_;  // drift events, rows recalled
  thrust::buffer<std::int32_t, E> target_offsets_, targets_;
  thrust::buffer<std::int32_t, E> heads_d_;
  // host scratch
  std::vector<std::int64_t> seqs_;
  std::vector<int> counts_;
  std::vector<std::int32_t> desc_host_, offsets_host_;
};

}  // namespace kvsift::detail
