// SPDX-License-Identifier: Apache-2.0
// gpu_cost: per-decode-step bytes each kvsift method reads from HBM and moves over PCIe, and the
// resulting time on an H100 and an A100, from model shapes and METHODS.md defaults. Prints the
// Markdown tables pasted into docs/gpu.md. Plain C++20, no kvsift dependency:
//
//   g++ -std=c++20 -O2 -o gpu_cost tools/gpu_cost.cpp && ./gpu_cost [--churn 0.1]
//
// The model (one sequence, one decode step, KV traffic only; weights excluded) is documented in
// docs/gpu.md; every constant below is named there.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct model {
  const char* name = "Llama-3.1-8B";
  int layers = 32;
  int kv_heads = 8;
  int q_heads = 32;
  int head_dim = 128;
  int elem_bytes = 2;  // bf16
  // bytes of one token's K and V for one KV head
  [[nodiscard]] double head_token() const { return 2.0 * head_dim * elem_bytes; }
  // bytes of one token's K only for one KV head
  [[nodiscard]] double head_key() const { return 1.0 * head_dim * elem_bytes; }
};

struct gpu {
  const char* name;
  double hbm;   // bytes/s
  double pcie;  // bytes/s, effective host<->device
};

struct cost {
  double hbm = 0;   // bytes read from HBM per step
  double pcie = 0;  // bytes moved over PCIe per step (both directions, amortised)
  double kept = 0;  // tokens a compressed KV head attends to (average)
  std::string note;
};

// real -> integer as METHODS.md: floor(x + 1e-9 * max(1, |x|))
std::int64_t to_count(double x) {
  return static_cast<std::int64_t>(std::floor(x + 1e-9 * std::max(1.0, std::fabs(x))));
}

struct scenario {
  std::int64_t n;        // context tokens at the step
  std::int64_t budget;   // B in tokens per head-sequence
  std::string label;     // "2K tokens" / "30%"
  bool fraction;         // budget given as a kept fraction
  double f;              // the fraction (when fraction)
};

double churn = 0.10;  // FreeKV: share of selectable pages not resident at a step

std::vector<std::pair<std::string, cost>> methods(const model& m, const scenario& s) {
  const double n = static_cast<double>(s.n);
  const double B = static_cast<double>(std::min(s.budget, s.n));
  const double L = m.layers;
  const double H = m.kv_heads;
  const double tok = m.head_token();
  const double key = m.head_key();
  std::vector<std::pair<std::string, cost>> out;

  // full_kv: every token of every head of every layer, plus the new one
  out.push_back({"full_kv", {L * H * (n + 1) * tok, 0, n + 1, "no compression"}});

  // streaming_llm: sink 4 + recent B-4, plus the new token
  out.push_back({"streaming_llm", {L * H * (B + 1) * tok, 0, B + 1, "sink 4 + window"}});

  // h2o: kept set + new token; its scorer recomputes the step's attention from Q and K (engines'
  // flash kernels do not expose probabilities): K of the read set once more; running scores
  // (float) read and written for every read token
  out.push_back({"h2o",
                 {L * H * ((B + 1) * tok + (B + 1) * key + (B + 1) * 8.0), 0, B + 1,
                  "+K re-read for scores, +score r/w"}});

  // snapkv / pyramidkv / dynamickv: prefill-only selection; decode reads the kept set. The
  // pyramid and DynamicKV's layer budgets average to B per head-sequence.
  out.push_back({"snapkv", {L * H * (B + 1) * tok, 0, B + 1, "window 32 inside B"}});
  out.push_back({"pyramidkv", {L * H * (B + 1) * tok, 0, B + 1, "layer budgets average B"}});
  out.push_back({"dynamickv", {L * H * (B + 1) * tok, 0, B + 1, "layer budgets average B"}});

  // quest: layers 0-1 dense; other layers read all page digests (min and max of K, p = 16) and
  // max(3, B/16) pages of K and V. Full KV stays resident.
  {
    const double p = 16;
    const double pages = std::ceil((n + 1) / p);
    const double sel_pages = std::max(3.0, std::floor(B / p));
    const double read_tokens = std::min(n + 1, sel_pages * p);
    const double dense = 2 * H * (n + 1) * tok;
    const double sparse = (L - 2) * H * (pages * 2 * key + read_tokens * tok);
    out.push_back({"quest", {dense + sparse, 0, read_tokens, "digests + pages; 2 dense layers"}});
  }

  // lagkv: sink 16, lag 128; r chosen as floor(128 * B / n) / 128 (>= 1/128) so the kept size
  // tracks the budget; steady-state tail of ~1.5 L raw tokens; one round per L appended tokens
  // reads 2 L tokens (K and V) of the head: amortised 2 L * tok / L per step
  {
    const double lag = 128;
    const double S = 16;
    const double r_eff = std::max(1.0, std::floor(lag * B / n)) / lag;
    const double tail = 1.5 * lag;
    const double kept = std::min(n, S + tail + r_eff * std::max(0.0, n - S - tail));
    out.push_back({"lagkv", {L * H * ((kept + 1) * tok + 2 * tok), 0, kept + 1,
                             "r = " + std::to_string(static_cast<int>(r_eff * lag)) + "/128"}});
  }

  // synckv: N_r = 2 representative heads per layer keep full KV; the 6 followers keep k tokens
  // (2K column: k = B; fraction column: k = floor((M N - N_R) n / (N - N_R)), M = f) plus the
  // decode tokens; every m = 5 steps each follower fetches k - floor(k/2) tokens from host
  {
    const double NR = 2 * L;
    const double N = H * L;
    double k = B;
    if (s.fraction) {
      k = static_cast<double>(to_count((s.f * N - NR) * n / (N - NR)));
    }
    const double kdyn = k - std::floor(0.5 * k);
    const double followers = (H - 2) * L;
    const double hbm = 2 * L * (n + 1) * tok + followers * (k + 1) * tok;
    const double pcie = followers * kdyn * tok / 5.0;
    out.push_back({"synckv", {hbm, pcie, k + 1, "2 R-heads/layer full; fetch every 5 steps"}});
  }

  // heterocache: assumed roles per layer of 8 KV heads: 1 pivot, 2 satellites, 4 anchors,
  // 1 volatile (F = 2 full heads per layer). Compressed heads keep cap = base (equal
  // stabilities; 2K column: base = B; fraction column: base = floor((rho N - F) n / N_c)).
  // Every W = 5 steps the pivot scores W queries over its prefill K (read once) and, as an upper
  // bound, drift fires and both satellites fetch cap tokens from host.
  {
    const double F = 2 * L;
    const double N = H * L;
    const double Nc = N - F;
    double cap = B;
    if (s.fraction) {
      cap = static_cast<double>(to_count((s.f * N - F) * n / Nc));
    }
    const double hbm = F * (n + 1) * tok + Nc * (cap + 1) * tok + L * n * key / 5.0;
    const double pcie = 2 * L * cap * tok / 5.0;
    out.push_back({"heterocache", {hbm, pcie, cap + 1, "2 full heads/layer; drift every 5 (bound)"}});
  }

  // freekv: p = 32, sink 512 + window 512 inside B (2K column: B = 2048; fraction column:
  // B = 30% of n rounded down to whole pages); layer 0 dense; device reads B / p pages + the
  // minmax digests of the candidate pages; PCIe: `churn` of the selectable pages are recalled
  // (HND pages, K and V), and the step's new K/V is written back to the host pool
  {
    const double p = 32;
    const double Bp = std::floor(B / p) * p;
    const double pages = std::ceil((n + 1) / p);
    const double cand = std::max(0.0, pages - (512 + 512) / p);
    const double selectable = std::max(0.0, Bp / p - (512 + 512) / p);
    const double read = std::min(n + 1, Bp);
    const double hbm = H * (n + 1) * tok + (L - 1) * H * (read * tok + cand * 2 * key);
    const double pcie = (L - 1) * H * (churn * selectable * p * tok + tok);
    out.push_back({"freekv", {hbm, pcie, read, "recall churn " + std::to_string(int(churn * 100)) + "% of pages"}});
  }
  return out;
}

void print_table(const model& m, const scenario& s, const std::vector<gpu>& gpus) {
  std::printf("\n### %s, context %lldK, budget %s\n\n", m.name, static_cast<long long>(s.n / 1024),
              s.label.c_str());
  std::printf("| method | tokens read / compressed head | HBM MB/step | PCIe MB/step |");
  for (const auto& g : gpus) {
    std::printf(" %s HBM us | %s PCIe us | %s total us |", g.name, g.name, g.name);
  }
  std::printf(" notes |\n|---|---:|---:|---:|");
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    std::printf("---:|---:|---:|");
  }
  std::printf("---|\n");
  for (const auto& [name, c] : methods(m, s)) {
    std::printf("| %s | %.0f | %.1f | %.2f |", name.c_str(), c.kept, c.hbm / 1e6, c.pcie / 1e6);
    for (const auto& g : gpus) {
      const double th = c.hbm / g.hbm * 1e6;
      const double tp = c.pcie / g.pcie * 1e6;
      std::printf(" %.0f | %.0f | %.0f |", th, tp, th + tp);
    }
    std::printf(" %s |\n", c.note.c_str());
  }
}

// The far-tier policy of the two-tier methods (issue "Attend where the far tier lives"): the rows
// a step needs from the host tier either cross PCIe into device memory and are attended there
// (recall) or are attended on the CPU where they lie, the two partial outputs merged by
// log-sum-exp (attend: a few KB of partial outputs cross instead). Per step and sequence:
//   recall   device reads every attended row (HBM); PCIe carries the recalled rows, amortised
//            over the method's refresh period; serial time HBM + PCIe, overlapped max(HBM, PCIe)
//   attend   device reads the resident rows only; the CPU reads the far rows every step (a
//            recall's rows are reused until the next refresh; attend reads them at each step);
//            time max(HBM, CPU) (the host part overlaps the device part)
struct far_rows {
  double far_bytes_step;  // K and V of the host-tier rows a step attends (attend: CPU reads)
  double recall_bytes;    // PCIe bytes per step under recall (amortised)
};
far_rows far_of(const model& m, const scenario& s, const std::string& name) {
  const double n = static_cast<double>(s.n);
  const double B = static_cast<double>(std::min(s.budget, s.n));
  const double L = m.layers, H = m.kv_heads, tok = m.head_token();
  if (name == "synckv") {  // followers' dynamic tokens, refreshed every 5 steps
    const double NR = 2 * L, N = H * L;
    double k = B;
    if (s.fraction) k = static_cast<double>(to_count((s.f * N - NR) * n / (N - NR)));
    const double kdyn = k - std::floor(0.5 * k);
    const double followers = (H - 2) * L;
    return {followers * kdyn * tok, followers * kdyn * tok / 5.0};
  }
  if (name == "heterocache") {  // both satellites' cap tokens, drift every 5 steps (bound)
    const double F = 2 * L, N = H * L;
    double cap = B;
    if (s.fraction) cap = static_cast<double>(to_count((s.f * N - F) * n / (N - F)));
    return {2 * L * cap * tok, 2 * L * cap * tok / 5.0};
  }
  // freekv: `churn` of the selectable pages are not resident at a step
  const double p = 32;
  const double Bp = std::floor(B / p) * p;
  const double selectable = std::max(0.0, Bp / p - (512 + 512) / p);
  const double rows = churn * selectable * p;
  return {(L - 1) * H * rows * tok, (L - 1) * H * rows * tok};
}

void print_far_table(const model& m, const std::vector<scenario>& scenarios, const gpu& g,
                     const std::vector<double>& cpu_bws) {
  std::printf("\n### Far-tier policy on the %s (PCIe %.0f GB/s), %s\n\n", g.name, g.pcie / 1e9,
              m.name);
  std::printf("| method | context | budget | far rows MB/step | recall PCIe MB/step | recall us (serial / overlapped) |");
  for (const double bw : cpu_bws) std::printf(" attend us, CPU %.0f GB/s |", bw / 1e9);
  std::printf(" wins (overlapped recall vs attend, per CPU) |\n|---|---:|---|---:|---:|---:|");
  for (std::size_t i = 0; i < cpu_bws.size(); ++i) std::printf("---:|");
  std::printf("---|\n");
  for (const auto& s : scenarios) {
    for (const auto& [name, c] : methods(m, s)) {
      if (name != "synckv" && name != "heterocache" && name != "freekv") continue;
      const far_rows f = far_of(m, s, name);
      const double hbm = c.hbm / g.hbm * 1e6;
      const double pcie = f.recall_bytes / g.pcie * 1e6;
      const double device_part = (c.hbm - f.far_bytes_step) / g.hbm * 1e6;  // resident rows only
      std::printf("| %s | %lldK | %s | %.1f | %.2f | %.0f / %.0f |", name.c_str(),
                  static_cast<long long>(s.n / 1024), s.label.c_str(), f.far_bytes_step / 1e6,
                  f.recall_bytes / 1e6, hbm + pcie, std::max(hbm, pcie));
      std::string wins;
      for (const double bw : cpu_bws) {
        const double attend = std::max(device_part, f.far_bytes_step / bw * 1e6);
        std::printf(" %.0f |", attend);
        const double recall = std::max(hbm, pcie);
        wins += std::string(wins.empty() ? "" : ", ") +
                (std::abs(attend - recall) <= 0.02 * recall ? "tie"
                 : attend < recall                          ? "attend"
                                                            : "recall");
      }
      std::printf(" %s |\n", wins.c_str());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--churn") == 0 && i + 1 < argc) {
      churn = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--churn FRACTION]\n", argv[0]);
      return 2;
    }
  }
  const model m;
  const std::vector<gpu> gpus{{"H100", 3.35e12, 55e9}, {"A100", 2.0e12, 25e9}};
  std::printf("<!-- generated by tools/gpu_cost.cpp (churn %.2f); do not edit by hand -->\n",
              churn);
  std::printf("Model: %s, %d layers, %d KV heads, %d query heads, d = %d, bf16; "
              "one sequence, one decode step, KV traffic only (weights excluded).\n",
              m.name, m.layers, m.kv_heads, m.q_heads, m.head_dim);
  for (const std::int64_t n : {std::int64_t{32768}, std::int64_t{131072}}) {
    print_table(m, {n, 2048, "2K tokens", false, 0.0}, gpus);
    print_table(m, {n, to_count(0.3 * static_cast<double>(n)), "30%", true, 0.3}, gpus);
  }
  std::vector<scenario> far;
  for (const std::int64_t n : {std::int64_t{32768}, std::int64_t{131072}}) {
    far.push_back({n, 2048, "2K tokens", false, 0.0});
    far.push_back({n, to_count(0.3 * static_cast<double>(n)), "30%", true, 0.3});
  }
  for (const auto& g : gpus) print_far_table(m, far, g, {50e9, 200e9});
  return 0;
}
