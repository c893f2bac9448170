// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>

#include <algorithm>

namespace kvsift::trigger {

// Length threshold — LagKV (Liang et al., 2025, "LagKV: Lag-Relative Information of the KV Cache
// Tells Which Tokens Are Important"). Fires, at any lifecycle event (between prefill chunks, at
// the end of the prompt, after a decode step's attention), when the uncompressed tail of a
// head-sequence reaches two partitions: length - base >= 2 * lag, base = max(frozen, sink) (the
// method's frozen prefix, starting at the sink). With the frozen prefix advanced by each round,
// this makes compression recursive: during decode it fires exactly when the tail reaches 2L.
// Parameters (paper defaults): sink 16, lag 128. Cost: O(1).
struct length {
  using kvsift_role = trigger_tag;
  struct params {
    int sink = 16;  // S: the frozen prefix is at least [0, S)
    int lag = 128;  // L: partition length
  };
  params p{};

  void validate(std::string_view where) const {
    require(p.sink > 0, where, "sink", p.sink, "> 0");
    require(p.lag > 0, where, "lag", p.lag, "> 0");
  }

  [[nodiscard]] bool fires(const trigger_context& ctx) const {
    return ctx.length - std::max(ctx.frozen, p.sink) >= 2 * p.lag;
  }
};
static_assert(Trigger<length>);

}  // namespace kvsift::trigger
