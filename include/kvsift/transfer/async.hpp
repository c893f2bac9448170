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
// A worker thread (std::jthread) runs the recalls in submission order. Each recall is streamed
// through two staging buffers (the double buffer of FreeKV's recall): a chunk of the host pool's
// HND page blocks (or of scattered token rows) is copied into one staging buffer while the
// chunk before it, in the other buffer, is converted HND -> NHD rows into the ticket's landing.
// On the CPU both stages run on the worker in alternation (the structure the GPU path overlaps:
// copy engine and conversion kernel, cuda/transfer.cuh). Rows contiguous in the pool (the rows
// of one page of one head) are copied as one block; scattered tokens row by row.
//
// Guarantees (each tested in tests/test_tiered.cpp, TSan-clean under the `tsan` label):
//  - submit() validates the request (head-sequences, ascending positions in the host pool) on
//    the calling thread and throws kvsift::error before anything is queued;
//  - no landing row is readable before its ticket completed: wait() is the only way to the
//    landing, and it returns after the worker's release store is observed;
//  - wait() on a ticket that has not completed counts one stall and the time spent waiting;
//  - cancel() drops a queued recall, or waits for a running one, and frees its landing; nothing
//    of either tier changes;
//  - a recall that fails (an injected fault, an allocation failure) completes with an error:
//    wait() rethrows it as kvsift::error and the store is untouched (install never ran).
// The store must outlive the recalls submitted against it and must not reset() a request with a
// recall in flight (methods cancel theirs first).

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/store/tiered.hpp>

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
  struct params {
    int chunk_rows = 256;  // rows (or page rows) per staging buffer
    // Stream through the two staging buffers (FreeKV's double-buffered recall; the GPU path's
    // pinned staging). Off, the worker copies pool rows straight into the landing: on the CPU
    // the staging buffer is one more copy of every byte and buys nothing (bench/transfer.cpp
    // measures both).
    bool staged = false;
  };

  explicit async(params p = {}) : p_(p) {
    require(p.chunk_rows > 0, "transfer::async", "chunk_rows", p.chunk_rows, "> 0");
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
    std::int64_t rows = 0;
    for (std::size_t r = 0; r < what.size(); ++r) {
      const auto seq = what[r].seq;
      const auto sequences = store.shape().sequences_per_request() * store.requests();
      require(seq >= 0 && seq < sequences, where, "what[" + std::to_string(r) + "].seq", seq,
              "a head-sequence id in [0, " + std::to_string(sequences) + ")");
      const auto [request, layer] = store.request_layer(seq);
      const auto& pos = what[r].positions;
      job->sources.reserve(job->sources.size() + pos.size());
      int hint = 0;
      for (std::size_t i = 0; i < pos.size(); ++i) {
        // messages are built only on failure: this loop runs once per recalled row
        const int index =
            (i == 0 || pos[i] > pos[i - 1]) ? store.host_index(request, layer, pos[i], hint) : -2;
        hint = index + 1;
        if (index < 0) {
          throw make_error(where, "what[" + std::to_string(r) + "].positions[" + std::to_string(i) + "]",
                           pos[i],
                           index == -2 ? std::string("ascending positions without duplicates")
                                       : "a position in the host pool of head-sequence " + std::to_string(seq));
        }
        job->sources.push_back({store.host_key(seq, index), store.host_value(seq, index)});
      }
      job->landing.seqs.push_back(seq);
      job->landing.positions.push_back(pos);
      rows += static_cast<std::int64_t>(pos.size());
    }
    {
      std::lock_guard lock(mu_);
      if (fault_ == fault::submit_fails) {
        fault_ = fault::none;
        throw make_error(where, "what", std::to_string(rows) + " rows",
                         "a recall the transfer can allocate (injected fault: submit_fails)");
      }
      job->fail_half_way = fault_ == fault::copy_fails;
      if (job->fail_half_way) fault_ = fault::none;
      job->id = ++last_;
      jobs_[job->id] = job;
      queue_.push_back(job);
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
  // stall. A failed recall throws kvsift::error (the landing is then empty and must be released).
  const store::landing<T>& wait(ticket t) {
    std::unique_lock lock(mu_);
    auto job = find(t);
    if (!job->done) {
      ++stats_.stalls;
      const auto t0 = std::chrono::steady_clock::now();
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

  // Drops a recall: a queued one never runs; a running one is waited for. Its landing is freed.
  void cancel(ticket t) {
    std::unique_lock lock(mu_);
    auto job = find(t);
    if (!job->started) {
      std::erase(queue_, job);
      job->done = true;
    }
    done_cv_.wait(lock, [&] { return job->done; });
    ++stats_.recalls_cancelled;
    jobs_.erase(t);
  }

  // Blocks until every recall submitted so far completed (the Transfer concept's wait()).
  void wait() {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
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

  // Test hook: while paused, the worker takes no new recall (lets a test keep a recall in flight
  // across decode steps deterministically).
  void pause(bool on) {
    {
      std::lock_guard lock(mu_);
      paused_ = on;
    }
    cv_.notify_all();
  }

 private:
  struct recall {
    ticket id = 0;
    std::vector<std::pair<const T*, const T*>> sources;  // host pool rows, in landing order
    store::landing<T> landing;
    bool started = false, done = false, fail_half_way = false;
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
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || st.stop_requested() || (!paused_ && !queue_.empty()); });
        if (stopping_ || st.stop_requested()) return;
        job = queue_.front();
        queue_.pop_front();
        job->started = true;
        busy_ = true;
      }
      std::string failure;
      try {
        copy(*job, staging);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      {
        std::lock_guard lock(mu_);
        job->failure = failure;
        if (!failure.empty()) job->landing = {};
        job->done = true;
        busy_ = false;
        ++stats_.recalls_completed;
        if (failure.empty()) stats_.bytes_moved += job->landing.bytes();
      }
      done_cv_.notify_all();
    }
  }

  // Stage 1 copies a chunk of source rows into staging[b] ([2, chunk, d]: keys, then values),
  // one memcpy per run of rows that are contiguous in the pool (a page's rows are: a whole-page
  // recall is one block copy per side); stage 2 converts the previous chunk, in staging[1 - b],
  // into the landing's NHD rows.
  void copy(recall& job, std::vector<T> (&staging)[2]) {
    const std::size_t d = static_cast<std::size_t>(job.landing.dim);
    const std::size_t rows = job.sources.size();
    job.landing.keys.resize(rows * d);
    job.landing.values.resize(rows * d);
    if (!p_.staged) {
      copy_direct(job);
      return;
    }
    const std::size_t chunk = static_cast<std::size_t>(p_.chunk_rows);
    for (auto& s : staging) s.resize(2 * chunk * d);
    std::size_t pending_first = 0, pending_count = 0;
    int b = 0;
    const auto convert = [&](int buf, std::size_t first, std::size_t count) {
      std::memcpy(job.landing.keys.data() + first * d, staging[buf].data(), count * d * sizeof(T));
      std::memcpy(job.landing.values.data() + first * d, staging[buf].data() + chunk * d,
                  count * d * sizeof(T));
    };
    for (std::size_t first = 0; first < rows; first += chunk) {
      if (job.fail_half_way && first >= rows / 2) {
        throw std::runtime_error("injected fault: copy_fails after " + std::to_string(first) + " of " +
                                 std::to_string(rows) + " rows");
      }
      const std::size_t count = std::min(chunk, rows - first);
      for (std::size_t i = 0; i < count;) {
        std::size_t run = 1;
        const auto [k, v] = job.sources[first + i];
        while (i + run < count && job.sources[first + i + run].first == k + run * d &&
               job.sources[first + i + run].second == v + run * d) {
          ++run;
        }
        std::memcpy(staging[b].data() + i * d, k, run * d * sizeof(T));
        std::memcpy(staging[b].data() + (chunk + i) * d, v, run * d * sizeof(T));
        i += run;
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

  // Pool rows straight into the landing, one memcpy per contiguous run per side.
  void copy_direct(recall& job) {
    const std::size_t d = static_cast<std::size_t>(job.landing.dim);
    const std::size_t rows = job.sources.size();
    for (std::size_t i = 0; i < rows;) {
      if (job.fail_half_way && i >= rows / 2) {
        throw std::runtime_error("injected fault: copy_fails after " + std::to_string(i) + " of " +
                                 std::to_string(rows) + " rows");
      }
      std::size_t run = 1;
      const auto [k, v] = job.sources[i];
      while (i + run < rows && job.sources[i + run].first == k + run * d &&
             job.sources[i + run].second == v + run * d) {
        ++run;
      }
      std::memcpy(job.landing.keys.data() + i * d, k, run * d * sizeof(T));
      std::memcpy(job.landing.values.data() + i * d, v, run * d * sizeof(T));
      i += run;
    }
    if (job.fail_half_way) throw std::runtime_error("injected fault: copy_fails");
  }

  params p_;
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::shared_ptr<recall>> queue_;
  std::map<ticket, std::shared_ptr<recall>> jobs_;
  std::vector<store::landing<T>> spare_;  // released landings, reused by the next submits
  ticket last_ = 0;
  bool stopping_ = false, busy_ = false, paused_ = false;
  fault fault_ = fault::none;
  transfer_stats stats_;
  std::jthread worker_;  // last member: started after, and joined before, everything above
};

static_assert(Transfer<async<float>>);

}  // namespace kvsift::transfer
