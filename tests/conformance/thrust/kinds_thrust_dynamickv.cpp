// SPDX-License-Identifier: Apache-2.0
// Thrust handler of budget.dynamickv: DynamicKV's rounds below over the case's scores.
// (method.dynamickv.prefill runs the library's method on the device: kinds_thrust_methods.cpp.)
//
// Budgets are host-side shapes in the device design: the budgeter budget::dynamic_layer runs on
// the host, as the method runs it, fed with host copies of each round's scores and kept sets;
// every selection runs on the device (device_topk). Per layer, as the method prefills:
//   1. first pass: budgets() -> device_topk (the window protected) -> the round's kept sets;
//   2. revise() with the round: the budgeter keeps the layer's scores and resident counts and,
//      after every interval-th layer and the last, recounts every seen layer's past budget.
// The budgeter's shrink orders (budget_revision) are not applied slot by slot: after the last
// round one device_topk per layer keeps its final past budget (budgeter.past_budgets) plus the
// window. That is the same set: a first pass keeps the top of the past tokens in the order
// (score descending, lower index first), every shrink keeps the top of the resident ones in the
// same order, and the top k of a top-r prefix (k <= r) is the top k of all. The budgeter's
// internal global top-k (hits per layer) is budget arithmetic, not a selection of kept tokens.

#include "helpers.hpp"

#include <kvsift/budget/dynamic_layer.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace {
using namespace kvsift::conformance::thrust_kinds;  // kc, kt, dvec, device_topk, gather_kept, ...

kvsift::budget::dynamic_layer budgeter_of(const kc::case_data& c, const char* where) {
  kvsift::budget::dynamic_layer b{{.tokens = param(c, "budget"), .window = param(c, "window"),
                                   .r_max = param(c, "r_max"), .interval = param(c, "interval")}};
  b.validate(where);
  return b;
}

// DynamicKV's rounds over L layers of H heads of n tokens; scores [L * H * n] on the device
// (window slots 0, the scorer's layout); rows [L * H * n, d] are what the kept sets gather.
// Puts past_budget, history, kept and kept_offsets.
void dynamickv_rounds(kvsift::budget::dynamic_layer& b, const dvec<float>& scores,
                      const dvec<float>& rows, int d, int L, int H, int n, kc::outputs& out) {
  const int w = std::min(b.p.window, n);
  const auto exec = ::thrust::device;
  const dvec<i32> offsets = to_device(uniform_offsets(H, n));
  const std::vector<int> lengths(static_cast<std::size_t>(H), n);
  const std::vector<i32> window(static_cast<std::size_t>(H), w);
  const std::size_t per_layer = static_cast<std::size_t>(H) * n;
  const int request = 0;
  std::vector<kvsift::budget_revision> revisions;
  for (int l = 0; l < L; ++l) {
    dvec<float> layer(per_layer);
    ::thrust::copy_n(exec, scores.begin() + static_cast<std::ptrdiff_t>(l * per_layer), per_layer,
                     layer.begin());
    std::vector<int> budgets;
    b.budgets(kvsift::budget_context{l, L, H, lengths}, budgets);
    const auto kept =
        device_topk(layer, offsets, H, std::vector<i32>(budgets.begin(), budgets.end()), 0, window);
    // the round as the budgeter sees it: host copies of its scores and kept slots
    const auto host_scores = to_host(layer);
    kvsift::score_sets round_scores;
    for (int h = 0; h < H; ++h) {
      round_scores.push_back(std::span<const float>(
          host_scores.data() + static_cast<std::size_t>(h) * n, static_cast<std::size_t>(n)));
    }
    kvsift::index_sets round_kept;
    round_kept.offsets = to_host(kept.offsets);
    round_kept.values = to_host(kept.values);
    revisions.clear();
    b.revise(kvsift::budget_round{l, L, H, kvsift::lifecycle_event::prefill_end, {&request, 1},
                                  &round_scores, &round_kept},
             revisions);
  }
  // Final sets: each layer's past budget (the budgeter's) plus the window, in one batched top-k.
  const auto past = b.past_budgets(request);
  std::vector<i32> final_budgets;
  for (int l = 0; l < L; ++l) final_budgets.insert(final_budgets.end(), H, past[l] + w);
  const auto kept = device_topk(scores, to_device(uniform_offsets(L * H, n)), L * H, final_budgets,
                                0, std::vector<i32>(static_cast<std::size_t>(L) * H, w));
  const auto sets = gather_kept(rows, L * H, n, d, kept);  // the gathered rows' positions
  out.put_i32("past_budget", {L}, std::vector<i32>(past.begin(), past.end()));
  std::vector<i32> hist;
  const auto history = b.history(request);
  for (const auto& row : history) hist.insert(hist.end(), row.begin(), row.end());
  out.put_i32("history", {static_cast<std::int64_t>(history.size()), L}, std::move(hist));
  put_csr(out, "kept", sets);
}

const kc::registrar budget_dynamickv{
    handlers_backend, "budget.dynamickv", [](const kc::case_data& c, kc::outputs& out) {
      const auto& sc = c.in("scores");
      const int L = dim(sc, 0), H = dim(sc, 1), M = dim(sc, 2);
      const int n = param(c, "n"), w = param(c, "window");
      if (M != std::max(n - w, 0)) throw kc::runner_error("scores: last dim != n - window");
      auto b = budgeter_of(c, "budget.dynamickv");
      // one score per slot, window slots 0 (the scorer's layout)
      std::vector<float> padded(static_cast<std::size_t>(L) * H * n, 0.0f);
      for (int r = 0; r < L * H; ++r) {
        std::copy_n(sc.f32.data() + static_cast<std::size_t>(r) * M, M,
                    padded.begin() + static_cast<std::ptrdiff_t>(r) * n);
      }
      // no keys in this kind: the score rows (d = 1) are what the kept sets gather
      const dvec<float> scores = to_device(padded);
      dynamickv_rounds(b, scores, scores, 1, L, H, n, out);
    }};

}  // namespace
