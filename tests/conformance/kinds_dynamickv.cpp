// SPDX-License-Identifier: Apache-2.0
// DynamicKV kinds (SPEC.md §5): budget.dynamickv drives budget::dynamic_layer exactly as the
// method does (budgets() per layer, select::topk with the window, revise() after each layer's
// round, revisions applied to the kept sets: host code; its Thrust handler is
// thrust/kinds_thrust_dynamickv.cpp's); method.dynamickv.prefill is method_kinds.hpp's body on
// host_backend (the named method dynamickv over a store::dense<float>, prefilled layer by layer
// as an engine does; the Thrust runners run the same body on the device,
// thrust/kinds_thrust_methods.cpp).

#include "method_kinds.hpp"
#include "runner.hpp"

#include <kvsift/budget/dynamic_layer.hpp>
#include <kvsift/select/topk.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace {
namespace kc = kvsift::conformance;
using kc::dim;
using kc::param;

void put_common(kc::outputs& out, int L, const std::vector<int>& past,
                const std::vector<std::vector<int>>& history,
                const std::vector<std::vector<std::int32_t>>& kept) {
  out.put_i32("past_budget", {L}, std::vector<std::int32_t>(past.begin(), past.end()));
  std::vector<std::int32_t> h;
  for (const auto& row : history) h.insert(h.end(), row.begin(), row.end());
  out.put_i32("history", {static_cast<std::int64_t>(history.size()), L}, std::move(h));
  std::vector<std::int32_t> values, offsets{0};
  for (const auto& set : kept) {
    values.insert(values.end(), set.begin(), set.end());
    offsets.push_back(static_cast<std::int32_t>(values.size()));
  }
  const auto total = static_cast<std::int64_t>(values.size());
  const auto rows = static_cast<std::int64_t>(offsets.size());
  out.put_i32("kept", {total}, std::move(values));
  out.put_i32("kept_offsets", {rows}, std::move(offsets));
}

const kc::registrar budget_dynamickv{
    "budget.dynamickv", [](const kc::case_data& c, kc::outputs& out) {
      const auto& sc = c.in("scores");
      const int L = dim(sc, 0), H = dim(sc, 1), M = dim(sc, 2);
      const int n = param(c, "n"), w = param(c, "window");
      if (M != std::max(n - w, 0)) throw kc::runner_error("scores: last dim != n - window");
      kvsift::budget::dynamic_layer b{{.tokens = param(c, "budget"), .window = w,
                                       .r_max = param(c, "r_max"),
                                       .interval = param(c, "interval")}};
      b.validate("budget.dynamickv");
      const kvsift::select::topk sel{{.window = w}};
      // kept[l * H + h]: original positions resident, as a store would hold them
      std::vector<std::vector<std::int32_t>> kept(static_cast<std::size_t>(L) * H);
      const int request = 0;
      std::vector<kvsift::budget_revision> revisions;
      for (int l = 0; l < L; ++l) {
        kvsift::score_sets scores;  // one score per slot, window slots 0 (the scorer's layout)
        std::vector<float> row(static_cast<std::size_t>(n), 0.0f);
        for (int h = 0; h < H; ++h) {
          std::copy_n(sc.f32.data() + (static_cast<std::size_t>(l) * H + h) * M, M, row.begin());
          scores.push_back(row);
        }
        const std::vector<int> lengths(static_cast<std::size_t>(H), n);
        std::vector<int> budgets;
        b.budgets(kvsift::budget_context{l, L, H, lengths}, budgets);
        kvsift::index_sets round_kept;
        sel.select(scores, budgets, round_kept);
        for (int h = 0; h < H; ++h) {
          const auto seg = round_kept[h];
          kept[static_cast<std::size_t>(l) * H + h].assign(seg.begin(), seg.end());
        }
        revisions.clear();
        b.revise(kvsift::budget_round{l, L, H, kvsift::lifecycle_event::prefill_end,
                                      {&request, 1}, &scores, &round_kept},
                 revisions);
        for (const auto& rv : revisions) {
          for (int h = 0; h < H; ++h) {
            auto& set = kept[static_cast<std::size_t>(rv.layer) * H + h];
            std::vector<std::int32_t> next;
            for (const auto slot : rv.kept[h]) {
              next.push_back(set.at(static_cast<std::size_t>(slot)));
            }
            set = std::move(next);
          }
        }
      }
      put_common(out, L, b.past_budgets(0), b.history(0), kept);
    }};

const kc::registrar method_dynamickv_prefill{"method.dynamickv.prefill",
                                             kc::method_kinds::dynamickv_prefill<kc::method_kinds::host_backend>};

}  // namespace
