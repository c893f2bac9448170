// SPDX-License-Identifier: Apache-2.0
#pragma once

// roles::stars — HeteroCache's head roles (METHODS.md "HeteroCache"): per layer every KV head is
// an anchor (stable), volatile (unstable, no similar head), pivot (the centre of a star of
// similar heads) or satellite (a member of a pivot's star), with its stability s_h.
//
//   place     budgets base and cap_h (budget::inverse_stability over the whole model, or given
//             ones); volatile and pivot heads keep their whole KV, anchors and satellites their
//             own top min(n, cap_h) by the last query's scores (the recipe's select::topk). A pivot starts its
//             reference set as its own top `base`.
//   refresh   (a drift check, when trigger::drift_median fires) each pivot with satellites scores
//             each of the last W queries over the PREFILL keys only (softmax over those n,
//             avg-pool, GQA max over its group), takes each one's top-base set; the drift probe
//             (trigger::drift_probe) compares them with the reference. A drift: the reference
//             becomes q_t's set (the decision) and each satellite's new prefill part is the
//             pivot's top min(n, cap_s) by q_t's scores.
// Difference from the public code: a satellite's prefill part is the pivot's top cap_s by score
// (the paper); the public code takes the earliest cap_s by position (METHODS.md).

#include <kvsift/budget/inverse_stability.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/shape.hpp>
#include <kvsift/calibrate/star_cluster.hpp>
#include <kvsift/cpu/attention_rows.hpp>
#include <kvsift/cpu/math.hpp>
#include <kvsift/cpu/segmented_topk.hpp>
#include <kvsift/roles/context.hpp>
#include <kvsift/select/topk.hpp>
#include <kvsift/trigger/drift_probe.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvsift::roles {

struct stars {
  using role = calibrate::head_role;
  struct layer_roles {  // one layer, as calibration writes it
    std::vector<role> roles;           // [H]
    std::vector<std::int32_t> leader;  // [H] a satellite's pivot; a pivot itself; else -1 (or itself)
    std::vector<float> stability;      // [H] s_h
  };
  // base and cap [layers * kv_heads] instead of inverse_stability's formula (the recipe's
  // budgeter takes it: budget::inverse_stability::params::fixed)
  using fixed_budget = budget::heterocache_caps;
  struct params {
    std::vector<layer_roles> layers;  // [layers]
    double rho = 0.5;
    int kernel = 5;
  };
  struct slot_state {  // per (request, layer)
    int prompt_first = 0;  // slot count of the prompt in a full head (= n)
    int base = 0;
    std::vector<int> cap;                              // [H]
    std::vector<std::vector<std::int32_t>> reference;  // [H] pivots: positions
    std::vector<double> median;                        // [H] last check, -1 where none ran
    std::vector<int> drift;                            // [H] last check drifted
  };
  // A drift's outcome: (pivot, new reference set).
  using decision = std::vector<std::pair<int, std::vector<std::int32_t>>>;
  static constexpr bool scores_step = false;  // refresh scores the window itself

  params p;
  std::vector<role> roles_flat;       // [layers * kv_heads]
  std::vector<float> stability_flat;  // [layers * kv_heads]

  explicit stars(params x) : p(std::move(x)) { flatten(p.layers, roles_flat, stability_flat); }
  static void flatten(const std::vector<layer_roles>& layers, std::vector<role>& r, std::vector<float>& s) {
    r.clear();
    s.clear();
    for (const auto& l : layers) {
      r.insert(r.end(), l.roles.begin(), l.roles.end());
      s.insert(s.end(), l.stability.begin(), l.stability.end());
    }
  }
  // Any roles file with `.layers[l].roles / .leader / .stability` (calibrate::heterocache_roles).
  template <class Roles>
  [[nodiscard]] static std::vector<layer_roles> from_file(const Roles& file) {
    std::vector<layer_roles> out;
    for (const auto& l : file.layers) {
      layer_roles x;
      x.roles.assign(l.roles.begin(), l.roles.end());
      x.leader.assign(l.leader.begin(), l.leader.end());
      x.stability.assign(l.stability.begin(), l.stability.end());
      out.push_back(std::move(x));
    }
    return out;
  }
  // Validates the roles (and the fixed caps, or inverse_stability's feasibility) against a shape.
  static void check(const model_shape& shape, const std::vector<layer_roles>& layers,
                    const std::optional<fixed_budget>& fixed, double rho, std::string_view where) {
    require(static_cast<int>(layers.size()) == shape.layers, where, "roles.size", layers.size(),
            "one layer_roles per layer (" + std::to_string(shape.layers) + ")");
    const auto H = static_cast<std::size_t>(shape.kv_heads);
    for (int l = 0; l < shape.layers; ++l) {
      const auto& x = layers[l];
      const std::string f = "roles[" + std::to_string(l) + "].";
      require(x.roles.size() == H, where, f + "roles.size", x.roles.size(),
              "kv_heads = " + std::to_string(H));
      require(x.leader.size() == H, where, f + "leader.size", x.leader.size(),
              "kv_heads = " + std::to_string(H));
      require(x.stability.size() == H, where, f + "stability.size", x.stability.size(),
              "kv_heads = " + std::to_string(H));
      for (int h = 0; h < shape.kv_heads; ++h) {
        const int code = static_cast<int>(x.roles[h]);
        require(code >= 0 && code <= 3, where, f + "roles[" + std::to_string(h) + "]", code,
                "0 anchor, 1 volatile, 2 pivot or 3 satellite");
        const int lead = x.leader[h];
        const std::string name = f + "leader[" + std::to_string(h) + "]";
        if (x.roles[h] == role::pivot) {
          require(lead == h, where, name, lead, "the pivot itself (" + std::to_string(h) + ")");
        } else if (x.roles[h] == role::satellite) {
          require(lead >= 0 && lead < shape.kv_heads && lead != h &&
                      x.roles[static_cast<std::size_t>(lead)] == role::pivot,
                  where, name, lead, "a pivot of the same layer");
        } else {
          require(lead == -1 || lead == h, where, name, lead, "-1 for an anchor or volatile head");
        }
      }
    }
    if (fixed) {
      const auto total = static_cast<std::size_t>(shape.layers) * H;
      require(fixed->cap.size() == total, where, "fixed.cap.size", fixed->cap.size(),
              "layers x kv_heads = " + std::to_string(total));
      require(fixed->base >= 0, where, "fixed.base", fixed->base, ">= 0");
      for (std::size_t i = 0; i < total; ++i) {
        require(fixed->cap[i] >= 0, where, "fixed.cap[" + std::to_string(i) + "]", fixed->cap[i], ">= 0");
      }
    } else {
      std::vector<role> r;
      std::vector<float> s;
      flatten(layers, r, s);
      budget::check_inverse_stability(r, s, shape.kv_heads, rho, where);
    }
  }
  [[nodiscard]] int kv_heads() const {
    return p.layers.empty() ? 0 : static_cast<int>(p.layers.front().roles.size());
  }
  // The recipe's budgeter (fixed caps, or inverse_stability's over roles_flat and
  // stability_flat), as the schedule passes it to check_prompt and place.
  [[nodiscard]] budget::inverse_stability budgeter(std::optional<fixed_budget> fixed) const {
    return budget::inverse_stability{{roles_flat, stability_flat, kv_heads(), p.rho, std::move(fixed)}};
  }
  // The drift window W: the schedule keeps each request's newest W decode queries.
  template <class Trigger>
  [[nodiscard]] int query_window(const Trigger& t) const { return t.p.window; }
  [[nodiscard]] bool places() const { return true; }
  void check_prompt(std::string_view, int n, const budget::inverse_stability& b) const {
    (void)b.caps(kv_heads(), n);
  }
  void start(slot_state&, int) const {}

  // The shape of a layer's drift checks, derived here once for every exec: the pivots with
  // satellites (the monitored ones, ascending) and then the other pivots; the monitored pivots'
  // satellites, by pivot then head, with the index in `pivots` of each one's pivot.
  struct layer_layout {
    std::vector<int> pivots;
    int monitored = 0;
    std::vector<int> satellites;
    std::vector<int> satellite_pivot;
  };
  [[nodiscard]] layer_layout layout(int layer) const {
    const auto& r = p.layers[layer];
    const int H = static_cast<int>(r.roles.size());
    layer_layout out;
    std::vector<int> others;
    for (int h = 0; h < H; ++h) {
      if (r.roles[h] != role::pivot) continue;
      bool sats = false;
      for (int x = 0; x < H; ++x) sats = sats || (r.roles[x] == role::satellite && r.leader[x] == h);
      (sats ? out.pivots : others).push_back(h);
    }
    out.monitored = static_cast<int>(out.pivots.size());
    for (int i = 0; i < out.monitored; ++i) {
      for (int x = 0; x < H; ++x) {
        if (r.roles[x] != role::satellite || r.leader[x] != out.pivots[i]) continue;
        out.satellites.push_back(x);
        out.satellite_pivot.push_back(i);
      }
    }
    out.pivots.insert(out.pivots.end(), others.begin(), others.end());
    return out;
  }

  // Full-KV heads (pivots, anchors) keep the whole prompt; the others keep the top cap_h of their
  // own scores through the recipe's selector (select::topk: no protected tokens, ties to the
  // lower index). A pivot records its reference set: its top `base` positions.
  template <class Store>
  void place(const Store& st, const select::topk& sel, const budget::inverse_stability& budgeter,
             int layer, std::span<const int> ended, const score_sets& scores,
             std::span<slot_state* const> states, std::vector<int>& layer_budgets,
             std::vector<index_sets>& kept) const {
    const auto& sh = st.shape();
    const auto& roles = p.layers[layer];
    const auto H = static_cast<std::size_t>(sh.kv_heads);
    // One selection over every capped head of the batch: its scores and its budget per segment.
    score_sets capped;
    std::vector<int> caps;
    for (std::size_t i = 0; i < ended.size(); ++i) {
      const int r = ended[i];
      const int n = st.host_length(r, layer);
      const auto b = budgeter.caps(sh.kv_heads, n);
      auto& s = *states[i];
      s.prompt_first = n;
      s.base = b.base;
      s.cap.assign(b.cap.begin() + static_cast<std::ptrdiff_t>(layer * H),
                   b.cap.begin() + static_cast<std::ptrdiff_t>((layer + 1) * H));
      s.reference.assign(H, {});
      s.median.assign(H, -1.0);
      s.drift.assign(H, 0);
      layer_budgets[layer] = s.base;
      for (int h = 0; h < sh.kv_heads; ++h) {
        if (budget::full_kv(roles.roles[h])) continue;
        capped.push_back(scores[static_cast<int>(i) * sh.kv_heads + h]);
        caps.push_back(std::min(n, s.cap[h]));
      }
    }
    index_sets picked;
    sel.select(capped, caps, picked);
    kept.assign(ended.size(), {});
    int next = 0;
    std::vector<std::int32_t> all;
    for (std::size_t i = 0; i < ended.size(); ++i) {
      const int n = states[i]->prompt_first;
      all.resize(static_cast<std::size_t>(n));
      std::iota(all.begin(), all.end(), 0);
      for (int h = 0; h < sh.kv_heads; ++h) {
        if (!budget::full_kv(roles.roles[h])) {
          kept[i].push_back(picked[next++]);
          continue;
        }
        kept[i].push_back(all);
        if (roles.roles[h] == role::pivot) {
          const auto seq = sh.sequence(ended[i], layer, h);
          states[i]->reference[h] =
              top_positions(st, seq, scores[static_cast<int>(i) * sh.kv_heads + h], states[i]->base);
        }
      }
    }
  }

  void begin_step(slot_state& s) const {
    std::fill(s.median.begin(), s.median.end(), -1.0);
    std::fill(s.drift.begin(), s.drift.end(), 0);
  }
  // layout(layer) has a monitored pivot: a satellite's leader is a pivot (check()), so any
  // satellite (checked every decode step: allocates nothing)
  [[nodiscard]] bool refreshes(int layer) const {
    const auto& r = p.layers[layer].roles;
    return std::find(r.begin(), r.end(), role::satellite) != r.end();
  }
  // One drift check per firing request (each pivot with satellites): emit(i, proposal).
  template <class Store, class Trigger, class Emit>
  void refresh(const Store& st, const Trigger& trig, const refresh_input& in,
               std::span<slot_state* const> states, Emit&& emit) const {
    const auto& sh = st.shape();
    const auto lay = layout(in.layer);
    const trigger::drift_probe probe{trig};
    for (std::size_t i = 0; i < in.requests.size(); ++i) {
      const int r = in.requests[i];
      auto& s = *states[i];
      const auto& window = in.windows[i];
      const int n = s.prompt_first;
      proposal<decision> out;
      std::vector<float> scores;
      std::vector<std::vector<std::int32_t>> sets;
      for (int pv = 0; pv < lay.monitored; ++pv) {
        const int h = lay.pivots[pv];
        const auto seq = sh.sequence(r, in.layer, h);
        sets.clear();
        for (int w = 0; w < window.tokens; ++w) {
          prefill_scores(st, seq, window.row(w, 0), in.prompt_end[i] - 1, n, scores);
          sets.push_back(top_positions(st, seq, scores, s.base));
        }
        const auto d = probe.check(sets, s.reference[h]);
        ++out.checks;
        s.median[h] = d.median;
        if (!d.drift) continue;
        s.drift[h] = 1;
        ++out.refreshes;
        out.decision.emplace_back(h, std::move(sets.back()));
        for (std::size_t j = 0; j < lay.satellites.size(); ++j) {
          // `scores` holds q_t's (the newest query's) pivot scores
          if (lay.satellite_pivot[j] != pv) continue;
          const int x = lay.satellites[j];
          out.parts.emplace_back(sh.sequence(r, in.layer, x),
                                 top_positions(st, seq, scores, std::min(n, s.cap[x])));
        }
      }
      emit(i, std::move(out));
    }
  }
  static int submitted(slot_state&) { return 0; }  // drifts count when decided
  static void commit(slot_state& s, decision&& d) {
    for (auto& [h, ref] : d) s.reference[static_cast<std::size_t>(h)] = std::move(ref);
  }

 private:
  // One query of the pivot's group over the prefill keys of a full (pivot) head: per query head
  // the softmax over the n prompt tokens, avg-pooled, then the max over the group.
  template <class Store>
  void prefill_scores(const Store& st, std::int64_t seq, const float* q, std::int32_t last_prompt,
                      int n, std::vector<float>& out) const {
    const auto& sh = st.shape();
    const int G = sh.group_size();
    const int h = static_cast<int>(seq % sh.kv_heads);
    std::vector<float> rows(static_cast<std::size_t>(G) * n, 0.0f);
    std::vector<float> probs(static_cast<std::size_t>(st.length(seq)));
    for (int g = 0; g < G; ++g) {
      const int v = cpu::attention_row(st, seq, q + static_cast<std::size_t>(h * G + g) * sh.head_dim,
                                       last_prompt, probs);
      std::span<float> row(rows.data() + static_cast<std::size_t>(g) * n, static_cast<std::size_t>(n));
      cpu::pool1d(std::span<const float>(probs.data(), static_cast<std::size_t>(std::min(v, n))), row,
                  p.kernel, pooling::avg);
    }
    out.assign(static_cast<std::size_t>(n), 0.0f);
    cpu::reduce_group(rows, G, out, gqa_reduce::max);
  }
  // Top k of a full head's first slots by `scores`, as original positions (ascending).
  template <class Store>
  static std::vector<std::int32_t> top_positions(const Store& st, std::int64_t seq,
                                                 std::span<const float> scores, int k) {
    std::vector<std::int32_t> cand(scores.size()), picked;
    std::iota(cand.begin(), cand.end(), 0);
    cpu::topk_of(scores, cand, k, picked);
    for (auto& x : picked) x = st.position(seq, x);
    return picked;
  }
};

}  // namespace kvsift::roles
