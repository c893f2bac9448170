// SPDX-License-Identifier: Apache-2.0
#pragma once

// roles::clusters over device memory (SyncKV): the content half that schedule::deferred_recall's
// one body calls (through device/deferred_recall.hpp) for method<thrust::tiered_store<T, E>,
// synckv_recipe, E>, as the host body calls roles/clusters.hpp.
//
// Contract: the host's semantics (METHODS.md "SyncKV"): the same plans (as positions), the same
// anticipation steps, the same resident tokens. Shapes are computed on the host, contents stay on
// the device; the recall is a lazy copy queue (what is decided after step t is installed at the
// request's next decode on the layer). Every buffer is allocated at construction; a decode step
// (decode + attend + after_attention) uploads descriptors and reads nothing back.
// The steps, capacities and what is not mirrored: docs/architecture.md, "Design notes from the
// headers".

#include <kvsift/budget/synckv.hpp>
#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/device/evict.hpp>
#include <kvsift/device/two_tier.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/method/synckv.hpp>
#include <kvsift/roles/clusters.hpp>
#include <kvsift/thrust/attention.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/last_query_attention.hpp>
#include <kvsift/thrust/static_dynamic.hpp>
#include <kvsift/thrust/tiered_store.hpp>

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

// Rows of the R-heads of (request, layer) in plan order into a [S, cap, d] layout (segment s at
// s * cap), their positions into [S, cap]: segment s = KV head heads[s], L rows each; a far
// slot's row read where it lies (thrust::working_rows).
template <class T>
struct gather_plan_rows_fn {
  thrust::working_rows<T> rows;
  const std::int32_t* plan_slots;
  const std::int32_t* plan_positions;
  const std::int32_t* heads;  // [S] KV heads
  std::int64_t seq0;          // sequence of head 0 of (request, layer)
  int L, cap, d;
  T* keys_out;
  std::int32_t* positions_out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int c = static_cast<int>(e % d);
    const std::int64_t t = e / d;
    const int s = static_cast<int>(t / L);
    const int j = static_cast<int>(t % L);
    const std::int64_t seq = seq0 + heads[s];
    const std::int32_t slot = plan_slots[seq * cap + j];
    keys_out[(static_cast<std::int64_t>(s) * cap + j) * d + c] = rows.key(seq, slot)[c];
    if (c == 0) positions_out[static_cast<std::int64_t>(s) * cap + j] = plan_positions[seq * cap + j];
  }
};

// The query rows of the R-heads' groups: out [S, G, d] = q.row(row, heads[s] * G + g).
template <class Space>
struct gather_query_groups_fn {
  kv_view<const float, nhd, Space> q;
  int row;
  const std::int32_t* heads;
  int G;
  float* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int d = q.dim;
    const int c = static_cast<int>(e % d);
    const std::int64_t sg = e / d;
    const int s = static_cast<int>(sg / G), g = static_cast<int>(sg % G);
    out[e] = q.row(row, heads[s] * G + g)[c];
  }
};

// The anticipation's keys in a fixed [S, cap] layout: (segment << 33) | (out << 32) | descending
// score bits (thrust::static_dynamic's order), out = beyond the prompt or in the static set.
struct anticipation_key_fn {
  const float* scores;  // packed: segment s at s * L
  const unsigned char* static_mask;  // [S, cap] by plan index
  int L, limit, cap;
  std::uint64_t* keys;
  std::int32_t* items;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = static_cast<int>(e / cap);
    const int j = static_cast<int>(e % cap);
    const bool out = j >= limit || static_mask[e] != 0;
    const float sc = j < L ? scores[static_cast<std::int64_t>(s) * L + j] : 0.0f;
    keys[e] = (static_cast<std::uint64_t>(s) << 33) | (static_cast<std::uint64_t>(out ? 1u : 0u) << 32) |
              static_cast<std::uint64_t>(descending_key(sc));
    items[e] = static_cast<std::int32_t>(e);
  }
};

// flags[item] = 1 for the first k items of each sorted segment (segment s at s * cap).
struct take_top_fn {
  const std::int32_t* sorted_items;
  int k, cap;
  std::int32_t* flags;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const std::int64_t s = t / k;
    flags[sorted_items[s * cap + t % k]] = 1;
  }
};

// Per segment: the positions of the flagged plan indices, ascending, at out[s * k].
struct compact_flags_fn {
  const std::int32_t* flags;
  const std::int32_t* positions;  // [S, cap] gathered positions
  int cap, limit, k;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(int s) const {
    int o = 0;
    const std::int64_t base = static_cast<std::int64_t>(s) * cap;
    for (int j = 0; j < limit && o < k; ++j) {
      if (flags[base + j] != 0) out[static_cast<std::int64_t>(s) * k + o++] = positions[base + j];
    }
  }
};

// Local indices -> positions and the static mask: idx [S, k] uniform; positions [S, cap].
struct static_record_fn {
  const std::int32_t* idx;
  const std::int32_t* positions;
  int k, cap;
  std::int32_t* static_pos;     // [S * k]
  unsigned char* static_mask;   // [S, cap]
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const std::int64_t s = t / k;
    const std::int32_t j = idx[t];
    static_pos[t] = positions[s * cap + j];
    static_mask[s * cap + j] = 1;
  }
};
struct index_to_position_fn {
  const std::int32_t* idx;
  const std::int32_t* positions;
  int k, cap;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    out[t] = positions[(t / k) * cap + idx[t]];
  }
};

// Each follower f's working set: part[cseg[f]] (P entries) then the decode positions
// [prompt_end, prompt_end + steps): out [F, P + steps].
struct follower_targets_fn {
  const std::int32_t* part;  // [S, P]
  const std::int32_t* cseg;  // [F] cluster segment of each follower
  int P, steps;
  std::int32_t prompt_end;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int n = P + steps;
    const std::int64_t f = e / n;
    const int j = static_cast<int>(e % n);
    out[e] = j < P ? part[static_cast<std::int64_t>(cseg[f]) * P + j] : prompt_end + (j - P);
  }
};

}  // namespace kvsift::thrust::detail

namespace kvsift::detail {

template <Element T, thrust::DeviceExec E, class Recipe>
class device_roles<roles::clusters, T, E, Recipe> : public device_roles_base<T, E> {
  using chunk_type = prefill_chunk<T, typename E::memory_space>;
  using space = typename E::memory_space;
  static_assert(std::is_same_v<typename Recipe::scorer, score::last_query_attention> &&
                    std::is_same_v<typename Recipe::selector, select::static_dynamic> &&
                    std::is_same_v<typename Recipe::trigger, trigger::stride>,
                "kvsift::method on a device exec: the device deferred_recall state is SyncKV's "
                "recipe (last_query_attention, static_dynamic, stride)");

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
  struct roles_view {
    bool anticipated = false;
  };
  // The host shadow of (request, layer).
  struct slot_state {
    std::int32_t prompt_end = -1;  // positions below it are the prompt; -1 before its end
    int steps = 0;                 // decode steps since the prompt ended
    int n = 0;                     // prompt tokens
    budget::synckv_split split{};
    int k_static = 0, k_dynamic = 0;  // the prefill split of min(k, n): floor(rho k), the rest
    bool pending = false;          // a recorded recall, installed by the next decode
    int pending_count = 0;         // entries of each follower's recorded working set
    roles_view roles{};
  };

  [[nodiscard]] bool recall_pending(std::size_t slot) const { return slots_[slot].pending; }
  [[nodiscard]] std::int64_t refreshes() const { return refreshes_; }
  // The recorded recall of a slot (E memory): [followers, pending_count] positions, follower
  // order = the layer's non-representative heads ascending. Valid while recall_pending(slot).
  [[nodiscard]] const std::int32_t* recall_positions(std::size_t slot) const {
    return recall_pos_.data() + slot * per();
  }
  // The static set of cluster segment s (clusters with followers, in cluster order) of a slot,
  // positions ascending, k_static of them (E memory).
  [[nodiscard]] const std::int32_t* static_positions(std::size_t slot, int s) const {
    return static_pos_.data() + slot * per() + static_cast<std::size_t>(s) * slots_[slot].k_static;
  }

 protected:
  template <class M>
  explicit device_roles(const M& m)
      : base(m),
        slots_(static_cast<std::size_t>(m.store().requests()) * layers_),
        keys_pk_(exec_, per() * d_),
        pos_pk_(exec_, per()),
        qg_(exec_, static_cast<std::size_t>(H_) * G_ * d_),
        qpos_(exec_, 1),
        scores_(exec_, per()),
        score_ws_(exec_, thrust::query_attention_workspace_bytes(static_cast<std::int64_t>(per()), G_, 1)),
        sd_ws_(exec_, thrust::static_dynamic_split_workspace_bytes(static_cast<std::int64_t>(per()), H_)),
        off_a_(exec_, static_cast<std::size_t>(H_) + 1),
        off_b_(exec_, static_cast<std::size_t>(H_) + 1),
        off_c_(exec_, static_cast<std::size_t>(H_) + 1),
        off_d_(exec_, static_cast<std::size_t>(H_) + 1),
        idx_a_(exec_, per()),
        idx_b_(exec_, per()),
        sort_keys_(exec_, per()),
        sort_items_(exec_, per()),
        flags_(exec_, per()),
        dyn_pos_(exec_, per()),
        part_(exec_, per()),
        static_pos_(exec_, slots_.size() * per()),
        static_mask_(exec_, slots_.size() * per()),
        recall_pos_(exec_, slots_.size() * per()),
        heads_d_(exec_, static_cast<std::size_t>(layers_) * H_),
        cseg_d_(exec_, static_cast<std::size_t>(layers_) * H_) {
    // per layer: the representatives with followers (one segment each, cluster order) and each
    // follower's segment (roles::clusters::segments); uploaded once
    std::vector<std::int32_t> heads(static_cast<std::size_t>(layers_) * H_, 0), cseg(heads.size(), 0);
    reps_.assign(static_cast<std::size_t>(layers_), {});
    followers_.assign(static_cast<std::size_t>(layers_), {});
    for (int l = 0; l < layers_; ++l) {
      auto lay = m.parts().roles.segments(l);
      const auto at = static_cast<std::ptrdiff_t>(l) * H_;
      std::copy(lay.representatives.begin(), lay.representatives.end(), heads.begin() + at);
      std::copy(lay.segment.begin(), lay.segment.end(), cseg.begin() + at);
      reps_[l] = std::move(lay.representatives);
      followers_[l] = std::move(lay.followers);
    }
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(heads), heads_d_);
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(cseg), cseg_d_);
    // warm the anticipation's fixed-size sort once per segment count (its scratch then comes
    // from the arena's cache in every decode step)
    std::vector<int> done;
    for (int l = 0; l < layers_; ++l) {
      const int S = static_cast<int>(reps_[l].size());
      if (S == 0 || std::find(done.begin(), done.end(), S) != done.end()) continue;
      done.push_back(S);
      const std::int64_t N = static_cast<std::int64_t>(S) * cap_;
      const auto policy = exec_.policy();
      ::thrust::fill_n(policy, sort_keys_.data(), N, std::uint64_t{0});
      ::thrust::fill_n(policy, sort_items_.data(), N, 0);
      ::thrust::stable_sort_by_key(policy, sort_keys_.data(), sort_keys_.data() + N, sort_items_.data());
    }
  }
  device_roles(device_roles&&) noexcept = default;

  static constexpr bool reads_step_query = true;  // an anticipation scores q_t

  // A prompt's end: the follower budget split, then the placement (every head a representative:
  // nothing to place and no budget; budget::synckv has no split without a follower).
  template <class M>
  void begin(M& m, int layer, const chunk_type& c, slot_state& s, std::size_t slot) {
    if (!m.parts().roles.places()) return;
    s.split = m.parts().budgeter.split(s.n);  // the recipe's budgeter
    layer_budgets_[layer] = s.split.k;
    const int kk = std::min(s.split.k, s.n);
    s.k_static = m.parts().selector.static_count(kk);
    s.k_dynamic = kk - s.k_static;
    place(m, layer, c, s, slot);
  }
  template <class M>
  [[nodiscard]] int installed_length(const M& m, const slot_state& s, int request, int layer,
                                     int h) const {
    return s.pending && !skip_installs_ && !is_rep(layer, h)
               ? s.pending_count
               : m.store().length(m.store().shape().sequence(request, layer, h));
  }
  template <class M>
  void begin_step(M& m, int layer, const decode_token<T>& t) { install(m, layer, t.request); }
  [[nodiscard]] bool refreshing(int layer) const { return !reps_[layer].empty(); }
  static void end_round(slot_state& s) { s.roles.anticipated = false; }
  template <class M>
  void fire(M& m, int layer, const decode_token<T>& t) { anticipate(m, layer, t); }

  std::vector<slot_state> slots_;  // [requests * layers]

 private:
  [[nodiscard]] std::size_t per() const { return static_cast<std::size_t>(H_) * cap_; }
  [[nodiscard]] bool is_rep(int layer, int h) const {
    return std::find(followers_[layer].begin(), followers_[layer].end(), h) == followers_[layer].end();
  }

  // The R-heads with followers of (request, layer), L rows each in plan order, into keys_pk_ /
  // pos_pk_; `q` row `row` their query groups into qg_; the scores into scores_ (S * L packed).
  template <class M, class QSpace>
  void score_reps(M& m, int layer, int request, int L, kv_view<const float, nhd, QSpace> q, int row,
                  std::int32_t qpos) {
    auto& st = m.store();
    const int S = static_cast<int>(reps_[layer].size());
    const auto policy = exec_.policy();
    const std::int32_t* heads = heads_d_.data() + static_cast<std::size_t>(layer) * H_;
    const std::int64_t seq0 = st.shape().sequence(request, layer, 0);
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0),
                         static_cast<std::int64_t>(S) * L * d_,
                         thrust::detail::gather_plan_rows_fn<T>{st.rows(), st.plan_slots(),
                                                                st.plan_positions(), heads, seq0, L,
                                                                cap_, d_, keys_pk_.data(), pos_pk_.data()});
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0),
                         static_cast<std::int64_t>(S) * G_ * d_,
                         thrust::detail::gather_query_groups_fn<QSpace>{q, row, heads, G_, qg_.data()});
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(&qpos, 1), qpos_);
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), S + 1,
                         thrust::detail::uniform_offsets_fn{L, cap_, off_a_.data(), off_d_.data()});
    const thrust::segmented_rows<T> keys{keys_pk_.data(), off_a_.data(), pos_pk_.data(),
                                         static_cast<std::int64_t>(cap_) * d_, S, d_};
    const thrust::window_queries wq{qg_.data(), qpos_.data(), 1, S, G_};
    const auto& sp = m.parts().scorer.p;
    thrust::query_attention_scores(policy, keys, wq, static_cast<std::int64_t>(S) * L, sp.kernel, sp.pool,
                                   sp.gqa, scores_.data(), score_ws_.data(), score_ws_.size());
  }

  // The prompt's round of one request: static / dynamic split of the R-heads' scores, the
  // followers' working sets installed (all resident: nothing copied).
  template <class M>
  void place(M& m, int layer, const chunk_type& c, slot_state& s, std::size_t slot) {
    const int S = static_cast<int>(reps_[layer].size());
    if (S == 0) return;
    const int L = s.n;
    score_reps(m, layer, c.request, L, c.queries, c.queries.tokens - 1, s.prompt_end - 1);
    const auto policy = exec_.policy();
    const int ks = s.k_static, kd = s.k_dynamic;
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), S + 1,
                         thrust::detail::uniform_offsets_fn{ks, kd, off_b_.data(), off_c_.data()});
    thrust::static_dynamic_split(policy, scores_.data(), off_a_.data(), S, static_cast<std::int64_t>(S) * L,
                                 off_b_.data(), static_cast<std::int64_t>(S) * ks, idx_a_.data(),
                                 off_c_.data(), static_cast<std::int64_t>(S) * kd, idx_b_.data(),
                                 sd_ws_.data(), sd_ws_.size());
    // the static sets stay: positions and the mask by plan index
    unsigned char* mask = static_mask_.data() + slot * per();
    ::thrust::fill_n(policy, mask, static_cast<std::int64_t>(per()), static_cast<unsigned char>(0));
    if (ks > 0) {
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), static_cast<std::int64_t>(S) * ks,
                           thrust::detail::static_record_fn{idx_a_.data(), pos_pk_.data(), ks, cap_,
                                                            static_pos_.data() + slot * per(), mask});
    }
    if (kd > 0) {
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), static_cast<std::int64_t>(S) * kd,
                           thrust::detail::index_to_position_fn{idx_b_.data(), pos_pk_.data(), kd, cap_,
                                                                dyn_pos_.data()});
    }
    record_targets(m, layer, c.request, s, slot, kd, /*steps=*/0);
    install_recorded(m, layer, c.request, s, slot);
  }

  // static ∪ dynamic (dyn_pos_: [S, kd]) per cluster segment, then each follower's working set
  // (with its `steps` decode tokens) into the slot's recall buffer.
  template <class M>
  void record_targets(M& m, int layer, int request, slot_state& s, std::size_t slot, int kd, int steps) {
    (void)m;
    (void)request;
    const int S = static_cast<int>(reps_[layer].size());
    const int ks = s.k_static, P = ks + kd;
    const auto policy = exec_.policy();
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), S + 1,
                         thrust::detail::uniform_offsets_fn{ks, kd, off_b_.data(), off_c_.data()});
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), S + 1,
                         thrust::detail::uniform_offsets_fn{P, P, off_d_.data(), off_d_.data()});
    thrust::merge_sets(policy, off_b_.data(), static_pos_.data() + slot * per(),
                       static_cast<std::int64_t>(S) * ks, off_c_.data(), dyn_pos_.data(),
                       static_cast<std::int64_t>(S) * kd, S, off_d_.data(), part_.data());
    const int F = static_cast<int>(followers_[layer].size());
    const int n = P + steps;
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), static_cast<std::int64_t>(F) * n,
                         thrust::detail::follower_targets_fn{part_.data(),
                                                             cseg_d_.data() + static_cast<std::size_t>(layer) * H_,
                                                             P, steps, s.prompt_end,
                                                             recall_pos_.data() + slot * per()});
    s.pending = true;
    s.pending_count = n;
  }

  template <class M>
  void install_recorded(M& m, int layer, int request, slot_state& s, std::size_t slot) {
    if (!s.pending) return;
    const auto& sh = m.store().shape();
    seqs_.clear();
    counts_.clear();
    for (const int h : followers_[layer]) {
      seqs_.push_back(sh.sequence(request, layer, h));
      counts_.push_back(s.pending_count);
    }
    step_.install(m.store(), seqs_, counts_, recall_pos_.data() + slot * per());
    s.pending = false;
  }
  // The lazy copy queue: the recall recorded after the previous step, installed now.
  template <class M>
  void install(M& m, int layer, int request) {
    const auto slot = m.slot(request, layer);
    if (skip_installs_) return;
    install_recorded(m, layer, request, slots_[slot], slot);
  }

  // An anticipation of request t.request after its step (trigger::stride fired): the R-heads'
  // scores of q_t re-rank the prompt tokens outside the static sets; the followers' next working
  // sets are recorded.
  template <class M>
  void anticipate(M& m, int layer, const decode_token<T>& t) {
    auto& st = m.store();
    const auto slot = m.slot(t.request, layer);
    auto& s = slots_[slot];
    if (s.pending) install_recorded(m, layer, t.request, s, slot);  // decisions apply in order
    const int S = static_cast<int>(reps_[layer].size());
    const int L = st.length(st.shape().sequence(t.request, layer, reps_[layer].front()));
    score_reps(m, layer, t.request, L, kv_view<const float, nhd, space>::contiguous(t.query, 1, H_ * G_, d_), 0,
               st.next_position(t.request, layer) - 1);
    const int kd = std::min(s.split.k_dynamic, s.n - s.k_static);  // topk_of: at most the candidates
    const auto policy = exec_.policy();
    const std::int64_t N = static_cast<std::int64_t>(S) * cap_;  // fixed: the sort's scratch repeats
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), N,
                         thrust::detail::anticipation_key_fn{scores_.data(), static_mask_.data() + slot * per(),
                                                             L, s.n, cap_, sort_keys_.data(),
                                                             sort_items_.data()});
    ::thrust::stable_sort_by_key(policy, sort_keys_.data(), sort_keys_.data() + N, sort_items_.data());
    ::thrust::fill_n(policy, flags_.data(), N, 0);
    if (kd > 0) {
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), static_cast<std::int64_t>(S) * kd,
                           thrust::detail::take_top_fn{sort_items_.data(), kd, cap_, flags_.data()});
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<int>(0), S,
                           thrust::detail::compact_flags_fn{flags_.data(), pos_pk_.data(), cap_, s.n, kd,
                                                            dyn_pos_.data()});
    }
    record_targets(m, layer, t.request, s, slot, kd, s.steps);
    ++refreshes_;
    s.roles.anticipated = true;
  }

  std::int64_t refreshes_ = 0;
  std::vector<std::vector<int>> reps_, followers_;  // [layers] R-heads with followers; followers
  // E memory, allocated once
  thrust::buffer<T, E> keys_pk_;
  thrust::buffer<std::int32_t, E> pos_pk_;
  thrust::buffer<float, E> qg_;
  thrust::buffer<std::int32_t, E> qpos_;
  thrust::buffer<float, E> scores_;
  thrust::buffer<std::byte, E> score_ws_, sd_ws_;
  thrust::buffer<std::int32_t, E> off_a_, off_b_, off_c_, off_d_, idx_a_, idx_b_;
  thrust::buffer<std::uint64_t, E> sort_keys_;
  thrust::buffer<std::int32_t, E> sort_items_, flags_, dyn_pos_, part_;
  thrust::buffer<std::int32_t, E> static_pos_;
  thrust::buffer<unsigned char, E> static_mask_;
  thrust::buffer<std::int32_t, E> recall_pos_;
  thrust::buffer<std::int32_t, E> heads_d_, cseg_d_;
  // host scratch
  std::vector<std::int64_t> seqs_;
  std::vector<int> counts_;
};

}  // namespace kvsift::detail
