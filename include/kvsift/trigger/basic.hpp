// SPDX-License-Identifier: Apache-2.0
#pragma once

// The simple triggers. A prefill-end compression always runs for them (the prompt is compressed
// once it is complete); they decide about decode steps, and never fire between prefill chunks.

#include <kvsift/concepts.hpp>

namespace kvsift::trigger {

// Never refresh during decode (SnapKV, PyramidKV: decoding appends without evicting).
struct never {
  using kvsift_role = trigger_tag;
  struct params {};
  params p{};
  [[nodiscard]] bool fires(const trigger_context& ctx) const {
    return ctx.event == lifecycle_event::prefill_end;
  }
};
static_assert(Trigger<never>);

// Refresh after every decode step (StreamingLLM's rolling window, H2O's eviction).
struct every_step {
  using kvsift_role = trigger_tag;
  struct params {};
  params p{};
  [[nodiscard]] bool fires(const trigger_context& ctx) const {
    return ctx.event != lifecycle_event::prefill_chunk;
  }
};
static_assert(Trigger<every_step>);

// Refresh after steps m, 2m, ... (SyncKV's anticipation stride, default 5).
struct stride {
  using kvsift_role = trigger_tag;
  struct params {
    int m = 5;
  };
  params p{};
  void validate(std::string_view where) const { require(p.m > 0, where, "stride", p.m, "> 0"); }
  [[nodiscard]] bool fires(const trigger_context& ctx) const {
    return ctx.event == lifecycle_event::prefill_end ||
           (ctx.event == lifecycle_event::decode_step && ctx.step % p.m == 0);
  }
};
static_assert(Trigger<stride>);

}  // namespace kvsift::trigger
