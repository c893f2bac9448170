// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the two-tier schedules' device content shares (device/deferred_recall.hpp: SyncKV and
// HeteroCache, device/speculative.hpp: FreeKV), as
// detail::two_tier is for their host content:
// a prefill chunk's checks and a decode step over a thrust::tiered_store on a device exec.
//
//   detail::device_two_tier<T, E> step(store, far);   // buffers for the store's requests
//   step.check_chunk(store, where, paper, layer, chunk, totals, prompt_open);
//   step.install(store, seqs, counts, positions);      // a state's install, under its policy
//   step.append_and_plan(store, layer, tokens, plan);  // after the state's installs
//   step.attend(store, layer, tokens, plan, out);
//
// detail::device_roles_base holds what the roles' device halves (device/roles_clusters.hpp,
// device/roles_stars.hpp) share under schedule::deferred_recall's one body.
//
// The host appends each request's token through the store (a device copy), packs the step's plan
// (every token of each KV head's working set, ascending by position: tiered_store::plan_sorted
// per request) and uploads the plan's CSR and the tokens' positions (counted host-to-device
// writes). Nothing is read back. Every buffer is allocated once, at construction, for the
// store's requests and tier capacity.
//
// The far-tier policy (far_tier, method/lifecycle.hpp) is applied here, in the one place the three
// methods install and attend through on a device:
//   recall  an install copies the missing rows from the pool into the tier; the library's
//           attention (thrust::attention_over) runs over the plan. One attention per request.
//   attend  an install places the missing positions in far slots and copies nothing
//           (tiered_store::install(..., far = true)); a step attends the plan in two partials,
//           the resident slots' rows in the tier and the far slots' rows in the pool where they
//           lie, each with its log-sum-exp, merged exactly (max-shifted, as
//           attention::merge_partials). The far rows of each step's plan are counted as it is
//           made (far_rows(), as the host counts its plan's far rows).
//           A far slot keeps the counts host shadows: a far row takes a tier slot that holds
//           no bytes (tiered_store::held_slots() counts it, resident_tokens() does not).
//           On exec::sim the far partials run on the host, as a task on the library's worker
//           thread (cpu::host_task), while the device part runs the resident partials: the
//           device part starts once the task has begun, the merges once it has ended.
//           far_overlaps() counts the steps whose host part began before their device part
//           ended, on another thread (the ordering of an overlap). The task reads the pool, the
//           plan and the queries in sim memory directly (sim memory is host memory), which
//           models a pool in host memory but not how a GPU host would reach the plan and the
//           queries. On exec::cuda the pool is device memory here, so the far partials are a
//           device pass too (a pool in mapped pinned memory, the host part launched on the
//           stream, is not built).
//           One thread per query head in every pass.

#include <kvsift/attention/merge.hpp>
#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cpu/host_task.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/device/one_tier.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/thrust/attention.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/math.hpp>
#include <kvsift/thrust/tiered_store.hpp>

#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift::detail {

// What a split partial reads: one request's step plan (its local CSR over the KV heads and its
// slots), the store's rows slot by slot, and the token's queries [H * G, d].
template <class T>
struct split_part {
  thrust::working_rows<T> rows;
  const std::int32_t* offsets;  // [H + 1], from 0
  const std::int32_t* slots;
  const float* query;
  std::int64_t seq0;  // head-sequence of KV head 0 of (request, layer)
  int G, d;
  float scale;
};

// The far slots of KV head h's plan segment, added to far_rows[seq] (one thread per KV head).
template <class T>
struct count_far_fn {
  split_part<T> p;
  std::int64_t* far_rows;  // [sequences]
  KVSIFT_HOST_DEVICE void operator()(int h) const {
    const std::int64_t seq = p.seq0 + h;
    std::int64_t n = 0;
    for (int t = p.offsets[h]; t < p.offsets[h + 1]; ++t) n += p.rows.far(seq, p.slots[t]) ? 1 : 0;
    far_rows[seq] += n;
  }
};

// One query head's partial attention over the plan rows of its KV head that lie in one tier (the
// resident slots, or with far the far slots), in plan order, and its log-sum-exp (-inf when the
// part is empty, out 0). Logits in core/dot.hpp's order, kept for the weights' pass (each key is
// read once), the softmax's exponent of thrust/math.hpp.
template <class T>
struct split_partial_fn {
  split_part<T> p;
  bool far;
  float* out;     // [H * G, d]
  float* lse;     // [H * G]
  float* logits;  // [plan rows, G]: the near and far partials write disjoint rows
  KVSIFT_HOST_DEVICE void operator()(int row) const {
    const int h = row / p.G;
    const int g = row % p.G;
    const std::int64_t seq = p.seq0 + h;
    const float* q = p.query + static_cast<std::int64_t>(row) * p.d;
    float* o = out + static_cast<std::int64_t>(row) * p.d;
    float top = thrust::detail::neg_inf();
    int n = 0;
    for (int t = p.offsets[h]; t < p.offsets[h + 1]; ++t) {
      if (p.rows.far(seq, p.slots[t]) != far) continue;
      const float logit = kvsift::dot(q, p.rows.key(seq, p.slots[t]), p.d) * p.scale;
      logits[static_cast<std::int64_t>(t) * p.G + g] = logit;
      top = logit > top ? logit : top;
      ++n;
    }
    for (int c = 0; c < p.d; ++c) o[c] = 0.0f;
    if (n == 0) {
      lse[row] = top;
      return;
    }
    double sum = 0.0;
    for (int t = p.offsets[h]; t < p.offsets[h + 1]; ++t) {
      if (p.rows.far(seq, p.slots[t]) != far) continue;
      const float w = kvsift::exact_expf(logits[static_cast<std::int64_t>(t) * p.G + g] - top);
      sum += w;
      const T* v = p.rows.value(seq, p.slots[t]);
      for (int c = 0; c < p.d; ++c) o[c] += w * to_float(v[c]);
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int c = 0; c < p.d; ++c) o[c] *= inv;
    lse[row] = top + static_cast<float>(::log(sum));
  }
};

// attention::merge_partials on the device, one thread per query head (attention::merge_row).
struct merge_partials_fn {
  const float* out_a;
  const float* lse_a;
  const float* out_b;
  const float* lse_b;
  float* out;
  int d;
  KVSIFT_HOST_DEVICE void operator()(int row) const {
    const auto at = static_cast<std::int64_t>(row) * d;
    attention::merge_row(d, out_a + at, lse_a[row], out_b + at, lse_b[row], out + at);
  }
};

template <Element T, thrust::DeviceExec E>
class device_two_tier {
 public:
  using Store = thrust::tiered_store<T, E>;
  using chunk_type = prefill_chunk<T, typename E::memory_space>;

  device_two_tier(const Store& st, far_tier far)
      : exec_(st.exec()),
        far_(far),
        H_(st.shape().kv_heads),
        G_(st.shape().q_heads / st.shape().kv_heads),
        cap_(st.tier_capacity()),
        plan_offsets_(exec_, static_cast<std::size_t>(st.requests()) * H_ + 1),
        local_offsets_(exec_, static_cast<std::size_t>(st.requests()) * (H_ + 1)),
        plan_slots_(exec_, static_cast<std::size_t>(st.requests()) * per_request()),
        plan_positions_(exec_, plan_slots_.size()),
        step_positions_(exec_, static_cast<std::size_t>(st.requests())),
        attention_ws_(exec_, thrust::attention_workspace_bytes(
                                 static_cast<std::int64_t>(per_request()), G_, 1)),
        part_out_(exec_, far == far_tier::attend ? 2 * partial_rows(st) * st.shape().head_dim : 0),
        part_lse_(exec_, far == far_tier::attend ? 2 * partial_rows(st) : 0),
        part_logits_(exec_, far == far_tier::attend ? plan_slots_.size() * G_ : 0),
        far_rows_(exec_, far == far_tier::attend ? static_cast<std::size_t>(st.sequences()) : 0) {
    require(far == far_tier::attend || !st.far_installed(), "device_two_tier", "params.far",
            to_string(far), "attend on a store whose installs placed far slots (one policy per store)");
    if (far_ == far_tier::attend) {
      ::thrust::fill_n(exec_.policy(), far_rows_.data(), far_rows_.size(), std::int64_t{0});
    }
  }

  [[nodiscard]] far_tier far() const { return far_; }

  // A state's install (tiered_store::install) under the policy: recall copies, attend places.
  void install(Store& st, std::span<const std::int64_t> seqs, std::span<const int> counts,
               const std::int32_t* positions) const {
    st.install(seqs, counts, positions, far_ == far_tier::attend);
  }

  // Steps (attend() calls) whose far partials ran as a host task that began before their device
  // part ended, on a thread other than the caller's (exec::sim; 0 on exec::cuda and under recall).
  [[nodiscard]] std::int64_t far_overlaps() const { return far_overlaps_; }

  // Rows of the pool the steps attended where they lie (far_tier::attend; 0 under recall), as
  // method_stats::far_rows counts them: summed over steps, layers and KV heads. One counted
  // device-to-host read: call it outside captured steps.
  [[nodiscard]] std::int64_t far_rows() const {
    if (far_rows_.size() == 0) return 0;
    std::vector<std::int64_t> rows(far_rows_.size());
    thrust::copy_to_host(exec_, far_rows_, std::span<std::int64_t>(rows));
    std::int64_t n = 0;
    for (const auto r : rows) n += r;
    return n;
  }

  // The host state's chunk checks (detail::two_tier::check_chunk: the prompt still open, the
  // chunk's newest queries, the last chunk's query, room in the host pool) plus room in the
  // device tier: every head holds the whole prompt until its end.
  void check_chunk(const Store& st, std::string_view where, std::string_view paper, int layer,
                   const chunk_type& c, const prefill_totals& tot, bool prompt_open) const {
    require(prompt_open, where, "request", c.request,
            "a request whose prompt has not ended on this layer (reset() it first)");
    require(c.queries.tokens <= c.keys.tokens, where, "queries.tokens", c.queries.tokens,
            "<= keys.tokens (the chunk's newest queries)");
    if (c.last) {
      require(c.queries.tokens >= 1, where, "queries.tokens", c.queries.tokens,
              ">= 1 on the last chunk: " + std::string(paper) + " scores the prompt's last query");
    }
    const int room = st.host_capacity() - st.host_length(c.request, layer);
    require(tot.added[c.request] + c.keys.tokens <= room, where, "keys.tokens", c.keys.tokens,
            "<= the room left in the host pool (" + std::to_string(room) + ")");
    const int tier_room = cap_ - st.host_length(c.request, layer);
    require(tot.added[c.request] + c.keys.tokens <= tier_room, where, "keys.tokens", c.keys.tokens,
            "<= the room left in the device tier (" + std::to_string(tier_room) +
                "): the whole prompt is resident until its end");
  }

  // Appends each request's token at its next position, then packs the step's plan: segment
  // i * kv_heads + h reads every resident token of KV head h of tokens[i]'s request, by position.
  void append_and_plan(Store& st, int layer, std::span<const decode_token<T>> tokens,
                       thrust::device_plan& plan) {
    const auto& sh = st.shape();
    using view = kv_view<const T, nhd, typename E::memory_space>;
    host_positions_.clear();
    for (const auto& t : tokens) {
      const std::int32_t pos = st.next_position(t.request, layer);
      st.append(t.request, layer, view::contiguous(t.key, 1, H_, sh.head_dim),
                view::contiguous(t.value, 1, H_, sh.head_dim), pos);
      host_positions_.push_back(pos);
    }
    plan.offsets.assign(1, 0);
    plan_base_.clear();
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      plan_base_.push_back(plan.offsets.back());
      seqs_.clear();
      for (int h = 0; h < H_; ++h) seqs_.push_back(sh.sequence(tokens[i].request, layer, h));
      st.plan_sorted(seqs_, local_offsets_.data() + i * (H_ + 1),
                     plan_slots_.data() + plan_base_.back(),
                     plan_positions_.data() + plan_base_.back());
      for (int h = 0; h < H_; ++h) {
        plan.offsets.push_back(plan.offsets.back() + st.length(seqs_[h]));
      }
      if (far_ == far_tier::attend) {  // the step's far rows, counted as its plan is made
        const split_part<T> part{st.rows(), local_offsets_.data() + i * (H_ + 1),
                                 plan_slots_.data() + plan_base_.back(), nullptr, seqs_[0], G_,
                                 sh.head_dim, 0.0f};
        ::thrust::for_each_n(exec_.policy(), ::thrust::counting_iterator<int>(0), H_,
                             count_far_fn<T>{part, far_rows_.data()});
      }
    }
    step_rows_ = plan.offsets.back();
    plan.page_offsets.clear();
    plan.pages = nullptr;
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(plan.offsets), plan_offsets_);
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(host_positions_), step_positions_);
    plan.device_offsets = plan_offsets_.data();
    plan.slots = plan_slots_.data();
    plan.positions = plan_positions_.data();
  }

  // The step's attention over its plan: out [tokens, q_heads, d] in E memory.
  void attend(const Store& st, int layer, std::span<const decode_token<T>> tokens,
              const thrust::device_plan& plan, float* out) const {
    const auto& sh = st.shape();
    const int d = sh.head_dim;
    if (far_ == far_tier::attend) {
      attend_split(st, layer, tokens, out);
      return;
    }
    const std::int64_t stride = static_cast<std::int64_t>(cap_) * d;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const std::int64_t seq0 = sh.sequence(tokens[i].request, layer, 0);
      const thrust::segmented_rows<T> k{st.tier_keys() + seq0 * stride, st.slot_offsets(),
                                        st.slot_positions() + seq0 * cap_, stride, H_, d};
      auto v = k;
      v.data = st.tier_values() + seq0 * stride;
      const thrust::window_queries q{tokens[i].query, step_positions_.data() + i, 1, H_, G_};
      const std::int64_t base = plan_base_[i];
      const std::int64_t total = plan.offsets[(i + 1) * H_] - base;
      const thrust::attention_plan local{local_offsets_.data() + i * (H_ + 1),
                                         plan_slots_.data() + base};
      thrust::attention_over(exec_.policy(), k, v, q, local, static_cast<std::int64_t>(H_) * cap_,
                             total, out + i * sh.q_heads * d, nullptr, attention_ws_.data(),
                             attention_ws_.size());
    }
  }

 private:
  [[nodiscard]] std::size_t per_request() const { return static_cast<std::size_t>(H_) * cap_; }

  // Partials for every request of the store, [requests, q_heads] rows each of near and far.
  [[nodiscard]] static std::size_t partial_rows(const Store& st) {
    return static_cast<std::size_t>(st.requests()) * st.shape().q_heads;
  }

  // far_tier::attend: per token of the step, the partial over the resident slots (the device
  // part), the partial over the far slots (the host part: a host task on exec::sim) and their
  // merge into out.
  void attend_split(const Store& st, int layer, std::span<const decode_token<T>> tokens,
                    float* out) const {
    const auto& sh = st.shape();
    const int d = sh.head_dim;
    const int Q = H_ * G_;
    const auto policy = exec_.policy();
    const ::thrust::counting_iterator<int> zero(0);
    const std::size_t far_at = part_lse_.size() / 2;  // the far partials follow the near ones
    const auto lse_of = [&](std::size_t i, bool far) {
      return part_lse_.data() + (far ? far_at : 0) + i * Q;
    };
    const auto out_of = [&](std::size_t i, bool far) {
      return part_out_.data() + ((far ? far_at : 0) + i * Q) * static_cast<std::size_t>(d);
    };
    const auto partial = [&](std::size_t i, bool far) {
      const split_part<T> part{st.rows(), local_offsets_.data() + i * (H_ + 1),
                               plan_slots_.data() + plan_base_[i], tokens[i].query,
                               sh.sequence(tokens[i].request, layer, 0), G_, d,
                               1.0f / std::sqrt(static_cast<float>(d))};
      return split_partial_fn<T>{part, far, out_of(i, far), lse_of(i, far),
                                 part_logits_.data() + plan_base_[i] * G_};
    };
    const auto device_part = [&] {
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        ::thrust::for_each_n(policy, zero, Q, partial(i, false));
      }
    };
    if constexpr (thrust::SimExec<E>) {  // the host part: sim memory is host memory
      if (!host_) host_ = std::make_unique<cpu::host_task>();
      // a query head reads about its KV head's share of the step's plan rows, keys and values
      const auto heads = static_cast<std::int64_t>(tokens.size()) * H_;
      const std::int64_t work = std::max<std::int64_t>(1, 2 * step_rows_ * d / heads);
      auto host_part = host_->start([&] {
        const auto n = static_cast<std::int64_t>(tokens.size()) * Q;
        cpu::parallel_for(n, [&](std::int64_t r) {
          partial(static_cast<std::size_t>(r / Q), true)(static_cast<int>(r % Q));
        }, cpu::par, work);
      });
      device_part();
      const auto device_end = host_->now();
      host_part.finish();
      far_overlaps_ += host_->started_at() < device_end ? 1 : 0;  // the worker is never the caller
    } else {
      device_part();
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        ::thrust::for_each_n(policy, zero, Q, partial(i, true));
      }
    }
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      ::thrust::for_each_n(policy, zero, Q,
                           merge_partials_fn{out_of(i, false), lse_of(i, false), out_of(i, true),
                                             lse_of(i, true),
                                             out + i * static_cast<std::size_t>(Q) * d, d});
    }
  }

  E exec_;
  far_tier far_;
  int H_, G_, cap_;
  // E memory: the plan (CSR, slots, positions), each request's local CSR, the tokens' positions,
  // attention's scratch
  thrust::buffer<std::int32_t, E> plan_offsets_, local_offsets_, plan_slots_, plan_positions_,
      step_positions_;
  mutable thrust::buffer<std::byte, E> attention_ws_;  // attend() is const
  // far_tier::attend (empty under recall): the partials [2, requests * Q, d] (near, then far),
  // their log-sum-exps [2, requests * Q], the step's logits [plan rows, G] and the far rows
  // attended per head-sequence [sequences]
  mutable thrust::buffer<float, E> part_out_, part_lse_, part_logits_;
  mutable thrust::buffer<std::int64_t, E> far_rows_;
  mutable std::unique_ptr<cpu::host_task> host_;  // exec::sim under attend: the far partials' task
  mutable std::int64_t far_overlaps_ = 0;
  // host: the step's descriptor
  std::vector<std::int64_t> seqs_, plan_base_;
  std::int64_t step_rows_ = 0;  // the step's plan rows, all tokens and KV heads
  std::vector<std::int32_t> host_positions_;
};

// The roles' device content halves that schedule::deferred_recall's one body calls (through
// device/deferred_recall.hpp): roles::clusters (device/roles_clusters.hpp, SyncKV) and
// roles::stars (device/roles_stars.hpp, HeteroCache). Each derives from device_roles_base and
// gives the body its slot_state (prompt_end, steps, n, roles) and slots_, and
//   reads_step_query                    whether after_attention reads the step's queries
//   begin(m, layer, chunk, s, slot)     a prompt's end (s.prompt_end, s.n set): budgets, placement
//   installed_length(m, s, r, layer, h) KV head h's tier length once this step's install ran
//   begin_step(m, layer, token)         before the token is appended: the recorded install, ...
//   refreshing(layer)                   whether a head of the layer can refresh
//   end_round(s) / fire(m, layer, token)  after a step: clear the last round; the trigger fired
//   refreshes()                         the refreshes so far
template <class Roles, Element T, thrust::DeviceExec E, class Recipe>
class device_roles {
  static_assert(sizeof(Roles) == 0,
                "kvsift::method on a device exec: the device deferred_recall state runs "
                "roles::clusters (SyncKV) and roles::stars (HeteroCache)");
};

// What both halves hold: the shape, the per-layer budgets, the decode step (device_two_tier).
template <Element T, thrust::DeviceExec E>
class device_roles_base {
 protected:
  template <class M>
  explicit device_roles_base(const M& m)
      : exec_(m.store().exec()),
        H_(m.store().shape().kv_heads),
        G_(m.store().shape().q_heads / m.store().shape().kv_heads),
        d_(m.store().shape().head_dim),
        cap_(m.store().tier_capacity()),
        layers_(m.store().shape().layers),
        layer_budgets_(static_cast<std::size_t>(layers_), -1),
        step_(m.store(), detail::far_policy_of(m.parameters())) {}

  E exec_;
  int H_, G_, d_, cap_, layers_;
  std::vector<int> layer_budgets_;  // -1 before any prefill
  bool skip_installs_ = false;      // tests only (debug_skip_installs)
  device_two_tier<T, E> step_;      // the decode step's append, plan and attention
};

}  // namespace kvsift::detail
