// SPDX-License-Identifier: Apache-2.0
#pragma once

// transfer::async — asynchronous recall from a tiered store's host pool (CPU backend).
//
//   auto t = xfer.submit(store, {{seq, {12, 13, 40}}});  // returns at once
//   ... the rest of the forward pass ...
//   const auto& landed = xfer.wait(t);   // blocks only if the copy is not done: a stall
//   store.install(seq, new_resident_set, landed);
//   xfer.release(t);
//
// A worker thread (std::jthread) runs the recalls in submission order, in claims of chunk_rows
// rows. A wait() on a recall that is not done yet does not just sleep: it takes the claims the
// worker has not reached and copies them on the waiting thread (the stall is still counted), so a
// short recall pays no hand-off latency and a long one is copied by two threads. A direct recall
// copies pool rows straight into the landing; a staged one streams through two staging buffers
// (FreeKV's double buffer; docs/architecture.md, "Design notes from the headers").
//
// Guarantees (each tested in tests/test_tiered.cpp, TSan-clean under the `tsan` label):
//  - submit() validates the request (head-sequences, ascending positions in the host pool) on
//    the calling thread and throws kvsift::error before anything is queued;
//  - no landing row is readable before its ticket completed: wait() is the only way to the
//    landing, and it returns after the worker's release store is observed;
//  - wait() on a ticket that has not completed counts one stall and the time spent waiting
//    (helping included);
//  - cancel() drops a queued recall, or waits for a running one, and frees its landing; nothing
//    of either tier changes;
//  - a recall that fails (an injected fault, an allocation failure) completes with an error:
//    wait() rethrows it as kvsift::error and the store is untouched (install never ran).
// The store must outlive the recalls submitted against it and must not reset() a request with a
// recall in flight (methods cancel theirs first).

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/store/tiered.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace kvsift::transfer {

// What one recall brings back: the listed positions of one head-sequence (ascending).
struct recall_request {
  std::int64_t seq = 0;
  std::vector<std::int32_t> positions;
};

// Counters of an asynchronous transfer.
struct transfer_stats {
  std::int64_t bytes_moved = 0;        // bytes copied host pool -> landing by completed recalls
  std::int64_t recalls_issued = 0;     // submit() calls accepted
  std::int64_t recalls_completed = 0;  // recalls finished (successfully or with an error)
  std::int64_t recalls_cancelled = 0;
  std::int64_t stalls = 0;             // wait() calls that found their recall not yet complete
  double wait_seconds = 0.0;           // time spent blocked in those waits
};

// Injectable failures, for reliability tests (issue 18): the next recall(s) fail this way.
enum class fault {
  none,
  submit_fails,   // submit() throws kvsift::error (as an allocation failure would), nothing queued
  copy_fails,     // the worker stops half way through the copy; wait() throws kvsift::error
};

template <Element T>
class async {
 public:
  using kvsift_role = transfer_tag;
  using ticket = std::uint64_t;
  using request_type = recall_request;
  struct params {
    int chunk_rows = 256;  // rows (or page rows) per staging buffer
    // Stream through the two staging buffers (FreeKV's double-buffered recall; the GPU path's
    // pinned staging). Off, the worker copies pool rows straight into the landing: on the CPU
    // the staging buffer is one more copy of every byte and buys nothing (bench/transfer.cpp
    // measures both).
    bool staged = false;
    // How long an idle worker, and a waiting caller whose recall is nearly done, poll before they
    // sleep on a condition variable. Waking a sleeping thread is a system call that costs about
    // as much as copying a 1024-row recall (20 us measured on a virtualised 2-core machine), and
    // a worker that is still polling when the next recall comes needs no wake-up at all.
    int spin_us = 50;
  };

  explicit async(params p = {}) : p_(p) {
    require(p.chunk_rows > 0, "transfer::async", "chunk_rows", p.chunk_rows, "> 0");
    require(p.spin_us >= 0, "transfer::async", "spin_us", p.spin_us, ">= 0 microseconds");
    worker_ = std::jthread([this](std::stop_token st) { run(st); });
  }
  async(const async&) = delete;
  async& operator=(const async&) = delete;
  ~async() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    // jthread joins; queued recalls are dropped.
  }

  // Queues a recall of `what` from `store`'s host pool; returns at once.
  ticket submit(const store::tiered<T>& store, std::vector<recall_request> what) {
    constexpr std::string_view where = "transfer::async.submit";
    auto job = std::make_shared<recall>();
    {
      std::lock_guard lock(mu_);
      if (!spare_.empty()) {  // reuse a released landing's buffers (no allocation, no page faults)
        job->landing = std::move(spare_.back());
        spare_.pop_back();
        job->landing.seqs.clear();
        job->landing.positions.clear();
      }
    }
    job->landing.dim = store.shape().head_dim;
    // Source rows as runs contiguous in the pool (at most one page of one head: the pool's rows
    // of a page are contiguous, a page's neighbour belongs to another head), split where a claim
    // of chunk_rows landing rows begins; runs [claim_runs[c], claim_runs[c + 1]) are claim c.
    const int page = store.page_size();
    const int chunk = p_.chunk_rows;
    std::int64_t rows = 0;
    int chunk_left = 0;  // landing rows left in the current chunk
    for (std::size_t r = 0; r < what.size(); ++r) {
      const auto seq = what[r].seq;
      const auto sequences = store.shape().sequences_per_request() * store.requests();
      require(seq >= 0 && seq < sequences, where, "what[" + std::to_string(r) + "].seq", seq,
              "a head-sequence id in [0, " + std::to_string(sequences) + ")");
      const auto [request, layer] = store.request_layer(seq);
      const auto& pos = what[r].positions;
      const auto pool = store.host_positions(request, layer);  // [host_length]: the pool's tokens
      const std::int32_t* pool_positions = pool.data();
      int hint = 0;
      for (std::size_t i = 0; i < pos.size();) {
        // messages are built only on failure: this loop runs once per run of recalled rows
        const int index =
            (i == 0 || pos[i] > pos[i - 1]) ? store.host_index(request, layer, pos[i], hint) : -2;
        if (index < 0) {
          throw make_error(where, "what[" + std::to_string(r) + "].positions[" + std::to_string(i) + "]",
                           pos[i],
                           index == -2 ? std::string("ascending positions without duplicates")
                                       : "a position in the host pool of head-sequence " + std::to_string(seq));
        }
        if (chunk_left == 0) {  // a claim begins at this row
          chunk_left = chunk;
          if (!p_.staged || job->claim_runs.empty()) job->claim_runs.push_back(static_cast<std::uint32_t>(job->runs.size()));
        }
        // the run: the following rows of this page of the pool, as long as they are the next
        // positions asked for (pool positions ascend, so these are found and ascending too). A
        // run never reaches past the pool's last token: the slots after it hold no position.
        const std::size_t limit = std::min({static_cast<std::size_t>(page - index % page),
                                            static_cast<std::size_t>(chunk_left), pos.size() - i,
                                            pool.size() - static_cast<std::size_t>(index)});
        std::size_t m = 1;
        while (m < limit && pool_positions[index + static_cast<int>(m)] == pos[i + m]) ++m;
        job->runs.push_back({store.host_key(seq, index), store.host_value(seq, index),
                             static_cast<std::size_t>(rows), m});
        hint = index + static_cast<int>(m);
        chunk_left -= static_cast<int>(m);
        rows += static_cast<std::int64_t>(m);
        i += m;
      }
      job->landing.seqs.push_back(seq);
      job->landing.positions.push_back(pos);
    }
    if (job->claim_runs.empty()) job->claim_runs.push_back(0);  // an empty recall: one empty claim
    job->claim_runs.push_back(static_cast<std::uint32_t>(job->runs.size()));
    job->rows = static_cast<std::size_t>(rows);
    // sized here, so that every claim writes its own rows of it (a reused landing keeps its
    // capacity: no allocation)
    job->landing.keys.resize(static_cast<std::size_t>(rows) * job->landing.dim);
    job->landing.values.resize(static_cast<std::size_t>(rows) * job->landing.dim);
    {
      std::lock_guard lock(mu_);
      if (fault_ == fault::submit_fails) {
        fault_ = fault::none;
        throw make_error(where, "what", std::to_string(rows) + " rows",
                         "a recall the transfer can allocate (injected fault: submit_fails)");
      }
      job->fail_half_way = fault_ == fault::copy_fails;
      job->claims = static_cast<int>(job->claim_runs.size()) - 1;
      if (job->fail_half_way) fault_ = fault::none;
      job->id = ++last_;
      jobs_[job->id] = job;
      queue_.push_back(job);
      queued_.store(queue_.size(), std::memory_order_relaxed);
      ++stats_.recalls_issued;
    }
    cv_.notify_all();
    return job->id;
  }

  // Whether the recall completed (successfully or not).
  [[nodiscard]] bool ready(ticket t) const {
    std::lock_guard lock(mu_);
    return find(t)->done;
  }

  // Blocks until the recall completed and returns what it brought. A wait that had to block is a
  // stall; while it waits it copies the claims of its recall the worker has not taken (a paused
  // worker included: a wait always makes progress). A failed recall throws kvsift::error (the
  // landing is then empty and must be released).
  const store::landing<T>& wait(ticket t) {
    std::unique_lock lock(mu_);
    auto job = find(t);
    if (!job->done) {
      ++stats_.stalls;
      const auto t0 = std::chrono::steady_clock::now();
      lock.unlock();
      help(*job);
      lock.lock();
      done_cv_.wait(lock, [&] { return job->done; });
      stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (!job->failure.empty()) {
      throw make_error("transfer::async.wait", "ticket", t, "a completed recall; it failed: " + job->failure);
    }
    return job->landing;
  }

  // Frees a completed recall's landing.
  void release(ticket t) {
    std::lock_guard lock(mu_);
    auto job = find(t);
    require(job->done, "transfer::async.release", "ticket", t, "a completed recall (wait() first)");
    if (spare_.size() < 4) spare_.push_back(std::move(job->landing));
    jobs_.erase(t);
  }

  // Drops a recall: claims not taken yet never run; claims running are waited for. Its landing is
  // freed; nothing of either tier changes.
  void cancel(ticket t) {
    std::unique_lock lock(mu_);
    auto job = find(t);
    std::erase(queue_, job);
    queued_.store(queue_.size(), std::memory_order_relaxed);
    job->cancelled = true;
    const int taken = std::min(job->next.exchange(job->claims), job->claims);
    if (taken < job->claims) {
      lock.unlock();
      settle(*job, job->claims - taken);  // the claims nobody will run are settled here
      lock.lock();
    }
    done_cv_.wait(lock, [&] { return job->done; });
    ++stats_.recalls_cancelled;
    jobs_.erase(t);
  }

  // Blocks until every recall submitted so far completed (the Transfer concept's wait()).
  void wait() {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] {
      return std::all_of(jobs_.begin(), jobs_.end(), [](const auto& j) { return j.second->done; });
    });
  }

  // The next recall(s) fail as `f` says (tests of faults in transfer).
  void inject(fault f) {
    std::lock_guard lock(mu_);
    fault_ = f;
  }

  [[nodiscard]] std::int64_t bytes_moved() const { return stats().bytes_moved; }
  [[nodiscard]] transfer_stats stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }
  // Recalls submitted and not yet released or cancelled.
  [[nodiscard]] std::size_t outstanding() const {
    std::lock_guard lock(mu_);
    return jobs_.size();
  }

  // Test hook: while paused, the worker starts no recall (lets a test keep a recall in flight
  // across decode steps deterministically, until a wait() on it copies it itself).
  void pause(bool on) {
    {
      std::lock_guard lock(mu_);
      paused_ = on;
    }
    cv_.notify_all();
  }

 private:
  // Landing rows [first, first + rows) come from `rows` consecutive pool rows from k (keys) and v.
  struct source_run {
    const T* k;
    const T* v;
    std::size_t first;
    std::size_t rows;
  };
  struct recall {
    ticket id = 0;
    std::vector<source_run> runs;          // the host pool rows, in landing order
    std::vector<std::uint32_t> claim_runs;  // [claims + 1]: claim c is runs [c], [c + 1])
    std::size_t rows = 0;                   // landing rows
    store::landing<T> landing;
    int claims = 1;              // claims that make up the copy: chunks of rows (staged: one)
    std::atomic<int> next{0};    // the next claim to take (>= claims: none left)
    std::atomic<int> settled{0};  // claims copied, failed or cancelled; the last one completes it
    std::atomic<bool> ran{false};  // a claim was copied (counts as a completed recall)
    std::atomic<bool> complete{false};  // `done`, readable without the mutex (polling waits)
    bool fail_half_way = false;
    // under mu_:
    bool done = false, cancelled = false;
    std::string failure;
  };

  std::shared_ptr<recall> find(ticket t) const {
    const auto it = jobs_.find(t);
    if (it == jobs_.end()) {
      throw make_error("transfer::async", "ticket", t, "a ticket submitted and not yet released");
    }
    return it->second;
  }

  void run(std::stop_token st) {
    std::vector<T> staging[2];
    for (;;) {
      std::shared_ptr<recall> job;
      spin_until([&] { return queued_.load(std::memory_order_relaxed) > 0 || st.stop_requested(); });
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || st.stop_requested() || (!paused_ && !queue_.empty()); });
        if (stopping_ || st.stop_requested()) return;
        job = queue_.front();
        queue_.pop_front();
        queued_.store(queue_.size(), std::memory_order_relaxed);
      }
      work(*job, staging);
    }
  }

  // Takes claims of `job` and copies them until none is left.
  void work(recall& job, std::vector<T> (&staging)[2]) {
    for (int c; (c = job.next.fetch_add(1, std::memory_order_relaxed)) < job.claims;) {
      try {
        if (p_.staged) {
          copy_staged(job, staging);
        } else {
          copy_claim(job, c);
        }
        job.ran.store(true, std::memory_order_relaxed);
      } catch (const std::exception& e) {
        std::lock_guard lock(mu_);
        if (job.failure.empty()) job.failure = e.what();
      }
      settle(job, 1);
    }
  }

  // A waiting thread's share: the claims not taken yet (a staged claim streams through staging
  // buffers of the waiting thread's own).
  void help(recall& job) {
    std::vector<T> staging[2];
    work(job, staging);
    // the worker may still be copying its last claim (at most chunk_rows rows): poll briefly
    // before the caller sleeps on the condition variable
    spin_until([&] { return job.complete.load(std::memory_order_acquire); });
  }

  // Polls `ready` for up to spin_us microseconds; returns whether it became true.
  template <class Ready>
  bool spin_until(Ready&& ready) const {
    if (p_.spin_us == 0) return ready();
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(p_.spin_us);
    for (unsigned i = 1;; ++i) {
      if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      if (i % 64 == 0 && std::chrono::steady_clock::now() > until) return false;
    }
  }

  // Counts `n` claims of `job` as settled; the thread that settles the last one completes it.
  // (Every claim's copies happen-before its settle; the last settle reads them all through the
  // acq_rel read-modify-write chain, and publishes `done` under the mutex.)
  void settle(recall& job, int n) {
    if (job.settled.fetch_add(n, std::memory_order_acq_rel) + n != job.claims) return;
    {
      std::lock_guard lock(mu_);
      job.done = true;
      job.complete.store(true, std::memory_order_release);
      const bool ran = job.ran.load(std::memory_order_relaxed);
      if (!job.failure.empty() || job.cancelled) job.landing = {};
      if (ran) ++stats_.recalls_completed;
      if (ran && job.failure.empty() && !job.cancelled) stats_.bytes_moved += job.landing.bytes();
    }
    done_cv_.notify_all();
  }

  // Stage 1 copies a chunk of source rows into staging[b] ([2, chunk, d]: keys, then values),
  // one memcpy per run (a whole-page recall is one block copy per page and side); stage 2
  // converts the previous chunk, in staging[1 - b], into the landing's NHD rows. Runs never cross
  // a chunk (submit splits them there).
  void copy_staged(recall& job, std::vector<T> (&staging)[2]) {
    const std::size_t d = static_cast<std::size_t>(job.landing.dim);
    const std::size_t rows = job.rows;
    const std::size_t chunk = static_cast<std::size_t>(p_.chunk_rows);
    for (auto& s : staging) s.resize(2 * chunk * d);
    std::size_t pending_first = 0, pending_count = 0;
    int b = 0;
    const auto convert = [&](int buf, std::size_t first, std::size_t count) {
      std::memcpy(job.landing.keys.data() + first * d, staging[buf].data(), count * d * sizeof(T));
      std::memcpy(job.landing.values.data() + first * d, staging[buf].data() + chunk * d,
                  count * d * sizeof(T));
    };
    std::size_t r = 0;
    for (std::size_t first = 0; first < rows; first += chunk) {
      if (job.fail_half_way && first >= rows / 2) {
        throw std::runtime_error("injected fault: copy_fails after " + std::to_string(first) + " of " +
                                 std::to_string(rows) + " rows");
      }
      const std::size_t count = std::min(chunk, rows - first);
      for (; r < job.runs.size() && job.runs[r].first < first + count; ++r) {
        const auto& run = job.runs[r];
        std::memcpy(staging[b].data() + (run.first - first) * d, run.k, run.rows * d * sizeof(T));
        std::memcpy(staging[b].data() + (chunk + run.first - first) * d, run.v, run.rows * d * sizeof(T));
      }
      if (pending_count > 0) convert(1 - b, pending_first, pending_count);
      pending_first = first;
      pending_count = count;
      b = 1 - b;
    }
    if (job.fail_half_way) {  // a recall too small to reach the half-way check still fails
      throw std::runtime_error("injected fault: copy_fails");
    }
    if (pending_count > 0) convert(1 - b, pending_first, pending_count);
  }

  // Claim c of a direct recall: its runs from the pool straight into the landing, one memcpy per
  // run and side.
  void copy_claim(recall& job, int c) {
    const std::size_t d = static_cast<std::size_t>(job.landing.dim);
    const std::size_t begin = job.claim_runs[static_cast<std::size_t>(c)];
    const std::size_t end = job.claim_runs[static_cast<std::size_t>(c) + 1];
    const std::size_t first = begin < end ? job.runs[begin].first : 0;
    // an injected copy_fails stops the copy half way: the claims from the middle on fail (the last
    // one always, so that a recall of one claim fails too)
    if (job.fail_half_way && (first >= job.rows / 2 || c + 1 == job.claims)) {
      throw std::runtime_error("injected fault: copy_fails after " + std::to_string(first) + " of " +
                               std::to_string(job.rows) + " rows");
    }
    for (std::size_t r = begin; r < end; ++r) {
      const auto& run = job.runs[r];
      std::memcpy(job.landing.keys.data() + run.first * d, run.k, run.rows * d * sizeof(T));
      std::memcpy(job.landing.values.data() + run.first * d, run.v, run.rows * d * sizeof(T));
    }
  }

  params p_;
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::shared_ptr<recall>> queue_;
  std::map<ticket, std::shared_ptr<recall>> jobs_;
  std::vector<store::landing<T>> spare_;  // released landings, reused by the next submits
  std::atomic<std::size_t> queued_{0};  // queue_.size(), readable without the mutex (polling)
  ticket last_ = 0;
  bool stopping_ = false, paused_ = false;
  fault fault_ = fault::none;
  transfer_stats stats_;
  std::jthread worker_;  // last member: started after, and joined before, everything above
};

static_assert(Transfer<async<float>>);

}  // namespace kvsift::transfer
