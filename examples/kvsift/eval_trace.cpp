// SPDX-License-Identifier: Apache-2.0
// kvsift eval-trace: every method at one budget over a KV trace, against full attention.
//
// Trace file (safetensors, float32/float16/bfloat16), one model's KV for one request:
//   keys     [layers, tokens, kv_heads, d]   keys after RoPE, prompt then decode tokens
//   values   [layers, tokens, kv_heads, d]
//   queries  [layers, tokens, q_heads, d]    the query of every position
//   prompt_len  I32 [1]                      tokens of the prompt; the rest are decode steps
// Without --trace, a trace is generated with a fixed seed: sink tokens, local heads, heavy
// hitters, and retrieval heads whose focus drifts from needle to needle during decode.

#include "commands.hpp"

#include <kvsift/io/safetensors.hpp>
#include <kvsift/kvsift.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace kvsift::cli {
namespace {

struct trace {
  model_shape shape;
  int prompt = 0;
  int tokens = 0;                  // prompt + decode steps
  std::vector<float> keys, values;  // [layers, tokens, kv_heads, d]
  std::vector<float> queries;       // [layers, tokens, q_heads, d]

  [[nodiscard]] const float* k(int l, int t) const {
    return keys.data() + ((static_cast<std::size_t>(l) * tokens + t) * shape.kv_heads) * shape.head_dim;
  }
  [[nodiscard]] const float* v(int l, int t) const {
    return values.data() + ((static_cast<std::size_t>(l) * tokens + t) * shape.kv_heads) * shape.head_dim;
  }
  [[nodiscard]] const float* q(int l, int t) const {
    return queries.data() + ((static_cast<std::size_t>(l) * tokens + t) * shape.q_heads) * shape.head_dim;
  }
};

// A synthetic trace with the attention structure compression methods are about.
trace generate(unsigned seed, int prompt, int steps) {
  trace tr;
  tr.shape = {4, 8, 2, 64};
  tr.prompt = prompt;
  tr.tokens = prompt + steps;
  const auto& sh = tr.shape;
  const int d = sh.head_dim;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::size_t kv_n = static_cast<std::size_t>(sh.layers) * tr.tokens * sh.kv_heads * d;
  tr.keys.resize(kv_n);
  tr.values.resize(kv_n);
  tr.queries.resize(static_cast<std::size_t>(sh.layers) * tr.tokens * sh.q_heads * d);
  for (auto& x : tr.keys) x = nd(rng);
  for (auto& x : tr.values) x = nd(rng);
  // needles: retrieval targets spread over the prompt; decode focus moves every 8 steps
  std::vector<int> needles;
  for (int i = 0; i < 6; ++i) needles.push_back(prompt / 10 + i * (prompt * 7 / 60));
  std::vector<float> sink_dir(d), heavy_dir(d);
  for (auto& x : sink_dir) x = nd(rng) / std::sqrt(static_cast<float>(d));
  for (auto& x : heavy_dir) x = nd(rng) / std::sqrt(static_cast<float>(d));
  std::vector<int> heavy;
  for (int t = 4; t < prompt; t += 37) heavy.push_back(t);
  for (int l = 0; l < sh.layers; ++l) {
    for (int h = 0; h < sh.kv_heads; ++h) {
      auto kp = [&](int t) { return const_cast<float*>(tr.k(l, t)) + h * d; };
      for (int t = 0; t < 4; ++t) {
        for (int c = 0; c < d; ++c) kp(t)[c] += 6.0f * sink_dir[c] * std::sqrt(static_cast<float>(d));
      }
      for (int t : heavy) {
        for (int c = 0; c < d; ++c) kp(t)[c] += 3.0f * heavy_dir[c] * std::sqrt(static_cast<float>(d));
      }
      const int kind = (l + h) % 3;  // 0: sink + heavy hitters, 1: local, 2: retrieval
      for (int g = 0; g < sh.group_size(); ++g) {
        const int hq = h * sh.group_size() + g;
        for (int t = 0; t < tr.tokens; ++t) {
          float* q = const_cast<float*>(tr.q(l, t)) + hq * d;
          for (int c = 0; c < d; ++c) q[c] = 0.3f * nd(rng);
          if (kind == 0) {
            for (int c = 0; c < d; ++c) q[c] += 0.8f * sink_dir[c] * std::sqrt(float(d)) + 0.9f * heavy_dir[c] * std::sqrt(float(d));
          } else if (kind == 1) {
            for (int back = 1; back <= 8 && t - back >= 0; ++back) {
              for (int c = 0; c < d; ++c) q[c] += 0.25f * kp(t - back)[c];
            }
          } else {
            const bool decoding = t >= prompt;
            const int focus = decoding ? needles[std::min<int>(1 + (t - prompt) / 8, 5)]
                                       : (t >= prompt - 32 ? needles[0] : -1);
            if (focus >= 0) {
              for (int c = 0; c < d; ++c) q[c] += 1.1f * kp(focus)[c];
            }
            for (int c = 0; c < d; ++c) q[c] += 0.3f * sink_dir[c] * std::sqrt(float(d));
          }
        }
      }
    }
  }
  return tr;
}

trace load(const std::string& path) {
  const auto f = io::safetensors_file::open(path);
  const auto& ki = f.info("keys");
  const auto& qi = f.info("queries");
  require(ki.shape.size() == 4, "eval-trace", "keys.shape", io::shape_string(ki.shape),
          "[layers, tokens, kv_heads, d]");
  require(qi.shape.size() == 4 && qi.shape[0] == ki.shape[0] && qi.shape[1] == ki.shape[1] &&
              qi.shape[3] == ki.shape[3],
          "eval-trace", "queries.shape", io::shape_string(qi.shape),
          "[layers, tokens, q_heads, d] matching keys " + io::shape_string(ki.shape));
  trace tr;
  tr.shape = {static_cast<int>(ki.shape[0]), static_cast<int>(qi.shape[2]),
              static_cast<int>(ki.shape[2]), static_cast<int>(ki.shape[3])};
  tr.shape.validate("eval-trace");
  tr.tokens = static_cast<int>(ki.shape[1]);
  tr.keys = f.to_float("keys");
  tr.values = f.to_float("values", ki.shape);
  tr.queries = f.to_float("queries");
  tr.prompt = f.to_int32("prompt_len").at(0);
  require(tr.prompt > 0 && tr.prompt < tr.tokens, "eval-trace", "prompt_len", tr.prompt,
          "in [1, tokens=" + std::to_string(tr.tokens) + ")");
  return tr;
}

struct row {
  std::string method;
  int budget = 0;
  double resident_pct = 0, rel_error = 0, recall = 0, ms_per_step = 0;
  std::vector<int> layer_budgets;
};

row evaluate(const trace& tr, const std::string& name, int budget, double fraction,
             std::int64_t full_bytes) {
  const auto& sh = tr.shape;
  const int d = sh.head_dim;
  const int steps = tr.tokens - tr.prompt;
  store::dense<float> st(sh, 1, tr.tokens);
  auto m = make_method(name, st, budget, fraction);
  for (int l = 0; l < sh.layers; ++l) {
    prefill_chunk<float> c{
        0, kv_view<const float>::contiguous(tr.k(l, 0), tr.prompt, sh.kv_heads, d),
        kv_view<const float>::contiguous(tr.v(l, 0), tr.prompt, sh.kv_heads, d),
        kv_view<const float>::contiguous(tr.q(l, 0), tr.prompt, sh.q_heads, d), 0, true};
    m->prefill(l, std::span<const prefill_chunk<float>>(&c, 1));
  }
  std::vector<float> out(static_cast<std::size_t>(sh.q_heads) * d), ref(out.size());
  std::vector<float> w(static_cast<std::size_t>(tr.tokens));
  double err = 0, recall = 0, seconds = 0;
  long samples = 0;
  for (int t = tr.prompt; t < tr.tokens; ++t) {
    for (int l = 0; l < sh.layers; ++l) {
      const decode_token<float> tok{0, tr.q(l, t), tr.k(l, t), tr.v(l, t)};
      const std::span<const decode_token<float>> batch(&tok, 1);
      const auto t0 = std::chrono::steady_clock::now();
      const auto& plan = m->decode(l, batch);
      m->attend(l, batch, out.data());
      const auto t1 = std::chrono::steady_clock::now();
      // full attention reference over positions [0, t]
      for (int hq = 0; hq < sh.q_heads; ++hq) {
        const int h = hq / sh.group_size();
        attention::attend_row(
            tr.q(l, t) + hq * d, d, t + 1, [&](int j) { return tr.k(l, j) + h * d; },
            [&](int j) { return tr.v(l, j) + h * d; }, ref.data() + hq * d, w.data());
        double num = 0, den = 0, mass = 0;
        for (int c = 0; c < d; ++c) {
          num += std::pow(out[hq * d + c] - ref[hq * d + c], 2);
          den += std::pow(ref[hq * d + c], 2);
        }
        for (const auto pos : plan.positions[h]) mass += w[pos];
        err += std::sqrt(num / std::max(den, 1e-30));
        recall += mass;
        ++samples;
      }
      const auto t2 = std::chrono::steady_clock::now();
      m->after_attention(l, batch);
      const auto t3 = std::chrono::steady_clock::now();
      seconds += std::chrono::duration<double>(t1 - t0).count() +
                 std::chrono::duration<double>(t3 - t2).count();
    }
  }
  const auto s = m->stats();
  row r;
  r.method = name;
  r.budget = budget;
  r.resident_pct = 100.0 * static_cast<double>(s.resident_bytes) / static_cast<double>(full_bytes);
  r.rel_error = err / static_cast<double>(samples);
  r.recall = recall / static_cast<double>(samples);
  r.ms_per_step = 1e3 * seconds / std::max(steps, 1);
  r.layer_budgets = s.layer_budgets;
  return r;
}

}  // namespace

int eval_trace(const std::vector<std::string>& args) {
  const std::string path = option(args, "--trace", "");
  const unsigned seed = static_cast<unsigned>(std::stoul(option(args, "--seed", "7")));
  const int context = std::stoi(option(args, "--context", "2048"));
  const int steps = std::stoi(option(args, "--steps", "32"));
  const double fraction = std::stod(option(args, "--budget", "0.25"));
  const trace tr = path.empty() ? generate(seed, context, steps) : load(path);
  const int budget = budget::tokens_from_keep_fraction(tr.prompt, fraction);
  std::vector<std::string> methods = split_list(option(args, "--methods", ""));
  if (methods.empty()) methods = method_names();

  const auto& sh = tr.shape;
  const std::int64_t full_bytes = static_cast<std::int64_t>(sh.layers) * sh.kv_heads * tr.tokens *
                                  2 * sh.head_dim * static_cast<std::int64_t>(sizeof(float));
  std::printf("trace: %s, %d layers, %d q heads, %d kv heads, d %d, prompt %d, %d decode steps\n",
              path.empty() ? ("generated (seed " + std::to_string(seed) + ")").c_str() : path.c_str(),
              sh.layers, sh.q_heads, sh.kv_heads, sh.head_dim, tr.prompt, tr.tokens - tr.prompt);
  std::printf("budget: %.3g of the prompt = %d tokens per head-sequence\n\n", fraction, budget);
  std::printf("%-14s %8s %11s %11s %11s %9s\n", "method", "budget", "resident %", "out error",
              "attn recall", "ms/step");
  std::vector<row> rows;
  for (const auto& name : methods) {
    rows.push_back(evaluate(tr, name, budget, fraction, full_bytes));
    const auto& r = rows.back();
    std::printf("%-14s %8d %10.1f%% %11.4f %11.4f %9.3f\n", r.method.c_str(), r.budget,
                r.resident_pct, r.rel_error, r.recall, r.ms_per_step);
  }
  // per-layer budgets of methods whose layers differ (PyramidKV, DynamicKV)
  for (const auto& r : rows) {
    const auto [lo, hi] = std::minmax_element(r.layer_budgets.begin(), r.layer_budgets.end());
    if (r.layer_budgets.empty() || *lo == *hi || *lo < 0) continue;
    std::printf("\n%s: tokens kept per layer\n", r.method.c_str());
    for (std::size_t l = 0; l < r.layer_budgets.size(); ++l) {
      const int bar = static_cast<int>(40.0 * r.layer_budgets[l] / std::max(*hi, 1));
      std::printf("  layer %2zu %6d %s\n", l, r.layer_budgets[l], std::string(bar, '#').c_str());
    }
  }
  return 0;
}

}  // namespace kvsift::cli
