// SPDX-License-Identifier: Apache-2.0
#pragma once

// roles — head-role parts of the two-tier methods (schedule::deferred_recall): per layer, each
// KV head keeps its whole KV (full), its own top set, or follows a leader's sets. A roles part
// places the prompt at its end and, when the trigger fires after a decode step, turns that
// step's scores into new prefill parts for the follower heads plus a decision (the part's state
// once the followers' rows are installed). This header is what every roles part is handed.
//
//   roles::clusters   SyncKV: representative heads full, followers share their static ∪ dynamic
//   roles::stars      HeteroCache: volatile / pivot heads full, anchors and satellites their caps

#include <kvsift/core/view.hpp>
#include <kvsift/score/context.hpp>

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace kvsift::roles {

// A refresh's input, per firing request i: its prompt end (positions below it are the prompt),
// its newest queries (oldest first, this step's last; as many as the part's query_window()),
// and, when the part scores the step (scores_step), the scorer's scores of this step's query
// (kv_heads segments per request).
struct refresh_input {
  int layer = 0;
  std::span<const int> requests;
  std::span<const std::int32_t> prompt_end;
  std::span<const kv_view<const float, nhd>> windows;
  const score_sets* scores = nullptr;
};

// A refresh's outcome for one request: the follower head-sequences' new prefill parts (original
// positions, ascending), the decision committed once they are installed, and counters (sets
// refreshed, checks run). Nothing is submitted when `parts` is empty.
template <class Decision>
struct proposal {
  std::vector<std::pair<std::int64_t, std::vector<std::int32_t>>> parts;
  Decision decision{};
  int refreshes = 0;
  int checks = 0;
};

}  // namespace kvsift::roles
