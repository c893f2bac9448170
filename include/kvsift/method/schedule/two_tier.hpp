// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the two-tier schedules (deferred_recall, speculative) share, over store::tiered and
// transfer::async:
//   detail::pending_recalls   a decision carried with its recall, committed after its install
//   detail::two_tier          the shell hooks both schedules answer the same way: a chunk's
//                             checks (prompt open, the last chunk's query, room in the host
//                             pool), a step's checks (prompt ended, host room), the plan that
//                             reads every resident token
//
// detail::pending_recalls — the "recall decided after step t, used from step t+1" machinery of
// the dynamic methods over store::tiered and transfer::async (SyncKV's anticipation, HeteroCache's
// drift retrieval; any method whose compressed heads get host-pool tokens back while decoding).
//
// One slot per key (the methods use request * layers + layer). After step t's attention a method
// calls submit() with, per head-sequence to change, its new PREFILL part: the positions below
// `boundary` it must hold from step t+1 (tokens at or above the boundary — the decode tokens —
// stay as they are), and the method's `Decision` (what its state becomes once the rows are
// there: SyncKV's dynamic sets, HeteroCache's references). submit() sends the positions that are
// not resident to the transfer in ONE recall and returns at once. At the start of step t+1
// (before its token is appended) the method calls complete(): it waits on the recall (the
// transfer counts a stall when the copy is not done yet — the step then blocks; it never reads
// stale or partial rows), installs each target's working set = prefill part ∪ {resident positions
// >= boundary}, releases the landing and only then hands the decision to `commit`. A decision is
// thus committed to the method's state only after its install succeeded: a recall that fails (at
// submit or in the copy) leaves the method's state as it was, matching what the store holds. A
// target with nothing to fetch is applied by store.promote, which copies nothing. cancel() drops
// a pending recall and its decision (reset of a request). Cost: one transfer per key per
// decision; O(resident) per installed head-sequence.
//
// The far-tier policy (far_tier, method/lifecycle.hpp) is applied here, in the one place every
// row that enters a working set passes through: under far_tier::attend, submit() sends nothing,
// and complete() and place() set each working set to the target's resident positions only, the
// rest kept per head-sequence as its far rows (far(seq)), which fill_far() puts into the step's
// plan. The decision is committed at the same step as under recall, so both policies read the
// same rows at every step.

#include <kvsift/attention/reference.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/transfer/async.hpp>

#include <algorithm>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <cstdint>
#include <utility>
#include <vector>

namespace kvsift::detail {

template <class Store, class Decision>
class pending_recalls {
  using T = typename Store::element_type;
  // the store's Transfer slot: every recall goes through it
  using xfer_type = typename Store::transfer_type;
  static_assert(RecallTransfer<xfer_type, Store>,
                "kvsift: a two-tier store's transfer_type recalls through submit/ready/wait/"
                "release/cancel/stats (RecallTransfer, concepts.hpp)");

 public:
  struct target {
    std::int64_t seq = 0;
    std::vector<std::int32_t> prefill;  // the new working set below `boundary`, ascending
    std::int32_t boundary = 0;          // positions >= boundary (decode tokens) are kept as resident
  };

  explicit pending_recalls(std::size_t keys = 0, std::size_t seqs = 0, far_tier policy = far_tier::recall)
      : slots_(keys), far_(policy == far_tier::attend ? seqs : 0), policy_(policy) {}

  [[nodiscard]] far_tier policy() const { return policy_; }
  // The host-pool positions head-sequence seq reads where they lie (empty under recall).
  [[nodiscard]] std::span<const std::int32_t> far(std::int64_t seq) const {
    return far_.empty() ? std::span<const std::int32_t>{} : std::span<const std::int32_t>(far_[seq]);
  }
  // Forgets seq's far rows (a reset, a new prompt).
  void clear_far(std::int64_t seq) {
    if (!far_.empty()) far_[seq].clear();
  }

  // Sets the working set of seq to `positions` (ascending, in the host pool) now: under recall
  // the missing rows are copied synchronously (store.promote, a stall's worth of copy); under
  // attend the resident ones stay, the others become seq's far rows.
  void place(Store& st, std::int64_t seq, std::span<const std::int32_t> positions) {
    if (policy_ == far_tier::recall) {
      st.promote(seq, positions);
      return;
    }
    thread_local std::vector<std::int32_t> near;
    near.clear();
    auto& far = far_[seq];
    far.clear();
    for (const auto pos : positions) (st.resident(seq, pos) ? near : far).push_back(pos);
    st.promote(seq, near);  // every row resident: copies nothing, drops what left the set
  }

  // The step's far rows into plan.far, one segment per segment of plan.slots (requests x KV
  // heads of `layer`); plan.far is left empty under recall.
  void fill_far(const Store& st, int layer, attention_plan& plan, std::int64_t& rows) const {
    plan.far.clear();
    if (policy_ == far_tier::recall) return;
    const auto& sh = st.shape();
    plan.far.offsets.assign(1, 0);
    for (const int r : plan.requests) {
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto& f = far_[sh.sequence(r, layer, h)];
        plan.far.values.insert(plan.far.values.end(), f.begin(), f.end());
        plan.far.offsets.push_back(static_cast<std::int32_t>(plan.far.values.size()));
      }
    }
    rows += static_cast<std::int64_t>(plan.far.values.size());
  }

  [[nodiscard]] bool has(std::size_t key) const { return slots_[key].active; }
  [[nodiscard]] bool in_flight(const xfer_type& x, std::size_t key) const {
    return slots_[key].active && slots_[key].ticket != 0 && !x.ready(slots_[key].ticket);
  }
  // Rows the pending recall of `key` brings (0 when none or nothing to fetch).
  [[nodiscard]] std::int64_t rows(std::size_t key) const { return slots_[key].rows; }
  // The decision pending for `key` (nullptr when none): not yet the method's state.
  [[nodiscard]] const Decision* decision(std::size_t key) const {
    return slots_[key].active ? &slots_[key].decision : nullptr;
  }

  // Submits the rows `targets` miss and keeps `decision` with them, uncommitted. An older
  // pending decision of `key` is completed (and committed through `commit`) first, so decisions
  // apply in order. Positions must be in the host pool. A submit that throws leaves no pending
  // decision (the method's state is unchanged).
  template <class Commit>
  void submit(xfer_type& x, Store& st, std::size_t key, std::vector<target> targets,
              Decision decision, Commit&& commit) {
    if (slots_[key].active) complete(x, st, key, commit);
    std::vector<transfer::recall_request> what;
    std::int64_t rows = 0;
    for (const auto& t : targets) {
      if (policy_ == far_tier::attend) break;  // nothing moves: complete() places what is resident
      transfer::recall_request r{t.seq, {}};
      for (const auto pos : t.prefill) {
        if (!st.resident(t.seq, pos)) r.positions.push_back(pos);
      }
      rows += static_cast<std::int64_t>(r.positions.size());
      if (!r.positions.empty()) what.push_back(std::move(r));
    }
    auto& s = slots_[key];
    s.ticket = what.empty() ? 0 : x.submit(st, std::move(what));  // validates before queueing
    s.targets = std::move(targets);
    s.decision = std::move(decision);
    s.rows = rows;
    s.active = true;
  }

  // Waits for the pending recall of `key` (a stall when it is not done), installs every target,
  // releases the landing, then calls commit(decision). Nothing happens when none is pending. A
  // failed recall throws kvsift::error with the store and the method's state unchanged (the
  // decision is dropped, never committed).
  template <class Commit>
  void complete(xfer_type& x, Store& st, std::size_t key, Commit&& commit) {
    auto& s = slots_[key];
    if (!s.active) return;
    s.active = false;
    const auto ticket = std::exchange(s.ticket, 0);
    const auto targets = std::move(s.targets);
    auto decision = std::move(s.decision);
    s.targets.clear();
    s.decision = {};
    s.rows = 0;
    if (ticket == 0) {
      for (const auto& t : targets) place(st, t.seq, working_set(st, t));
    } else {
      const store::landing<T>* landed = nullptr;
      try {
        landed = &x.wait(ticket);
      } catch (...) {
        x.release(ticket);
        throw;
      }
      for (const auto& t : targets) st.install(t.seq, working_set(st, t), *landed);
      x.release(ticket);
    }
    commit(std::move(decision));
  }

  // Drops the pending decision of `key` (the store is unchanged).
  void cancel(xfer_type& x, std::size_t key) {
    auto& s = slots_[key];
    if (s.active && s.ticket != 0) x.cancel(s.ticket);
    s = {};
  }

  // A schedule that uses part of a decision (FreeKV: the heads that did not correct) completes
  // it with complete_part(): waits like complete(), installs only the targets `keep(i)` names
  // (i: index in the submitted targets; an empty landing when nothing was fetched, so every
  // kept row must be resident), releases the recall, then calls commit(decision). A failed
  // recall throws like complete() (the landing released, the decision dropped).
  template <class Keep, class Commit>
  void complete_part(xfer_type& x, Store& st, std::size_t key, Keep&& keep,
                     Commit&& commit) {
    auto& s = slots_[key];
    if (!s.active) return;
    s.active = false;
    const auto ticket = std::exchange(s.ticket, 0);
    const auto targets = std::move(s.targets);
    auto decision = std::move(s.decision);
    s.targets.clear();
    s.decision = {};
    s.rows = 0;
    store::landing<T> none;
    none.dim = st.shape().head_dim;
    const store::landing<T>* landed = &none;
    if (ticket != 0) {
      try {
        landed = &x.wait(ticket);
      } catch (...) {
        x.release(ticket);
        throw;
      }
    }
    for (std::size_t i = 0; i < targets.size(); ++i) {
      if (!keep(i)) continue;
      if (policy_ == far_tier::attend) {
        place(st, targets[i].seq, working_set(st, targets[i]));
      } else {
        st.install(targets[i].seq, working_set(st, targets[i]), *landed);
      }
    }
    if (ticket != 0) x.release(ticket);
    commit(std::move(decision));
  }
  // Drops the pending decision of `key` without waiting for its recall: a finished recall is
  // released now, a running one runs to its end and is released by a later sweep() (a step
  // that corrects never blocks on a copy it discards). The store is unchanged.
  void discard(xfer_type& x, std::size_t key) {
    auto& s = slots_[key];
    if (s.active && s.ticket != 0) {
      if (x.ready(s.ticket)) {
        x.release(s.ticket);
      } else {
        discarded_.push_back(s.ticket);
      }
    }
    s = {};
  }
  // Releases the discarded recalls that finished.
  void sweep(xfer_type& x) {
    std::erase_if(discarded_, [&](auto tk) {
      if (!x.ready(tk)) return false;
      x.release(tk);
      return true;
    });
  }
  // Cancels every discarded recall still held (a reset: none may read a pool being reset).
  void cancel_discarded(xfer_type& x) {
    for (const auto tk : discarded_) x.cancel(tk);
    discarded_.clear();
  }
  [[nodiscard]] std::size_t keys() const { return slots_.size(); }

 private:
  struct slot {
    bool active = false;
    typename xfer_type::ticket ticket = 0;  // 0: nothing to fetch
    std::vector<target> targets;
    Decision decision{};
    std::int64_t rows = 0;
  };
  // prefill part ∪ the resident positions >= boundary, ascending.
  static std::vector<std::int32_t> working_set(const Store& st, const target& t) {
    std::vector<std::int32_t> out = t.prefill;
    for (int i = 0; i < st.length(t.seq); ++i) {
      if (st.position(t.seq, i) >= t.boundary) out.push_back(st.position(t.seq, i));
    }
    return out;
  }
  std::vector<slot> slots_;
  std::vector<typename xfer_type::ticket> discarded_;  // discard()ed, still running
  std::vector<std::vector<std::int32_t>> far_;  // [head-sequences] under attend: far rows, ascending
  far_tier policy_ = far_tier::recall;
};

// The plan of a step that reads every resident token of each head-sequence of `plan.requests`
// (SyncKV and HeteroCache: the working set is what each head reads), slots and positions.
template <Element T>
void plan_whole_working_set(const store::tiered<T>& st, int layer, attention_plan& plan) {
  const auto& sh = st.shape();
  // CSR offsets built in place (the plan's buffers are reused step after step: no allocation)
  auto& offsets = plan.slots.offsets;
  offsets.assign(1, 0);
  std::int64_t total = 0;
  for (const int r : plan.requests) {
    for (int h = 0; h < sh.kv_heads; ++h) {
      total += st.length(sh.sequence(r, layer, h));
      require(total <= index_sets::max_offset, "plan_whole_working_set", "resident tokens", total,
              "<= INT32_MAX summed over the step's head-sequences (int32 offsets)");
      offsets.push_back(static_cast<std::int32_t>(total));
    }
  }
  plan.slots.values.resize(static_cast<std::size_t>(total));
  plan.positions.offsets = offsets;
  plan.positions.values.resize(static_cast<std::size_t>(total));
  plan.pages.clear();
  for (int s = 0; s < plan.slots.segments(); ++s) {
    const auto seq = sh.sequence(plan.requests[s / sh.kv_heads], layer, s % sh.kv_heads);
    auto slots = plan.slots[s];
    auto pos = plan.positions[s];
    std::iota(slots.begin(), slots.end(), 0);
    for (std::size_t i = 0; i < slots.size(); ++i) pos[i] = st.position(seq, slots[i]);
  }
}

// The shell hooks the two-tier schedules share. `prompt_end(slot)` of the schedule's state is
// -1 until the prompt of (request, layer) ended.
template <class Store>
class two_tier {
 public:
  using T = typename Store::element_type;

  // A chunk's checks: the prompt of its request is still open on this layer; the chunk carries
  // at most its own tokens' queries, the last one at least the prompt's last query (`who` scores
  // it); the host pool has room for the call's chunks.
  template <class M>
  static void check_chunk(const M& m, std::string_view where, std::string_view who, int layer,
                          const prefill_chunk<T>& c, const prefill_totals& tot, bool prompt_open,
                          bool needs_last_query) {
    const auto& st = m.store();
    require(prompt_open, where, "request", c.request,
            "a request whose prompt has not ended on this layer (reset() it first)");
    require(c.queries.tokens <= c.keys.tokens, where, "queries.tokens", c.queries.tokens,
            "<= keys.tokens (the chunk's newest queries)");
    if (c.last && needs_last_query) {
      require(c.queries.tokens >= 1, where, "queries.tokens", c.queries.tokens,
              ">= 1 on the last chunk: " + std::string(who) + " scores the prompt's last query");
    }
    const int room = st.host_capacity() - st.host_length(c.request, layer);
    require(tot.added[c.request] + c.keys.tokens <= room, where, "keys.tokens", c.keys.tokens,
            "<= the room left in the host pool (" + std::to_string(room) + ")");
  }

  // A step's checks: each request's prompt ended on this layer and its host pool has room.
  template <class M>
  static void check_step(const M& m, std::string_view where, int layer,
                         std::span<const decode_token<T>> tokens, auto&& prompt_ended) {
    const auto& st = m.store();
    for (const auto& t : tokens) {
      require(prompt_ended(t.request), where, "request", t.request,
              "a request whose prompt ended on this layer (prefill with last = true first)");
      require(st.host_length(t.request, layer) < st.host_capacity(), where, "request", t.request,
              "a head-sequence with room for one more token in the host pool");
    }
  }

  // Appends each request's token to both tiers at its next position.
  template <class M>
  static void append_tokens(M& m, int layer, std::span<const decode_token<T>> tokens) {
    auto& st = m.store();
    const auto& sh = st.shape();
    for (const auto& t : tokens) {
      st.append(t.request, layer, kv_view<const T, nhd>::contiguous(t.key, 1, sh.kv_heads, sh.head_dim),
                kv_view<const T, nhd>::contiguous(t.value, 1, sh.kv_heads, sh.head_dim),
                st.next_position(t.request, layer));
    }
  }
};

}  // namespace kvsift::detail
