// SPDX-License-Identifier: Apache-2.0
// kvsift eval: a real model end to end. Each evaluation prompt (JSONL as in shared/eval) is
// prefilled by the example engine under full attention, its KV handed to a kvsift method
// (examples/engine/kvsift_cache.hpp), and len(answer) bytes are decoded greedily through the
// method's cache, the library's attention reading the method's plan. Scoring follows the
// tiny-recall README: exact match (passkey, chain) and chain hop accuracy.
//
// The engine's prefill forward pass does not depend on the cache (it runs full causal attention
// itself and then hands K/V/Q to the cache), so it runs once per prompt: its K/V/Q are kept and
// replayed into each method's cache (cache.start + cache.prefill per layer, exactly the calls
// generate_greedy makes), then decoding runs per method. "prefill s" is that forward pass plus
// the method's own prefill work (its compression round).
//
// Beside exact match: per-byte accuracy under teacher forcing (answer bytes after the first that
// are right when each decode step is fed the answer's previous byte) and, for SyncKV and
// HeteroCache, what their premise measures on the model (premise_stats below).
//
//   kvsift eval [--model DIR] [--prompts F1.jsonl,F2.jsonl] [--methods m1,m2]
//               [--budgets 0.25,0.5] [--match resident|budget] [--roles FILE] [--json]
//               [--json-out FILE] [--plot FILE.svg] [--limit N] [--kernel library|engine]
//               [--exec host|thrust-cpp|thrust-omp] [--verbose]
// Defaults: both shipped models, each on its own (protocol v2) prompts (data/tiny-recall on
// data/eval/{passkey,chain}.jsonl, data/recall-8kv on 12 prompts of each of
// data/eval/recall-8kv/{passkey,chain}.jsonl), every method, budget 0.25 matched as the
// device-resident share of the prompt's KV (--match resident).

#include "calibration_profile.hpp"
#include "commands.hpp"
#include "exec_choice.hpp"
#include "roles_choice.hpp"

#include "engine/eval_harness.hpp"
#include "engine/kvsift_cache.hpp"
#include "engine/llama.hpp"

#include <kvsift/calibrate/roles_file.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/method/any_method.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#ifndef KVSIFT_SOURCE_DIR
#define KVSIFT_SOURCE_DIR "."
#endif

namespace kvsift::cli {
namespace {

namespace ex = kvsift::examples;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// `path` as given if it exists, else relative to the source tree (so the defaults work from any
// directory), else as given (the loader reports it).
std::string resolve(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::exists(path)) return path;
  const fs::path p(path);
  if (p.is_relative()) {
    const fs::path in_tree = fs::path(KVSIFT_SOURCE_DIR) / p;
    if (fs::exists(in_tree)) return in_tree.string();
  }
  return path;
}

// Records the prompt's per-layer K/V/Q during the engine's prefill, to replay into each cache.
class prefill_capture : public ex::kv_cache {
 public:
  void start(const ex::cache_shape& s) override {
    shape = s;
    k.assign(static_cast<std::size_t>(s.num_layers), {});
    v.assign(static_cast<std::size_t>(s.num_layers), {});
    q.assign(static_cast<std::size_t>(s.num_layers), {});
  }
  void prefill(int layer, int, std::span<const float> k_rot, std::span<const float> vv,
               std::span<const float> q_rot) override {
    const auto l = static_cast<std::size_t>(layer);
    k[l].assign(k_rot.begin(), k_rot.end());
    v[l].assign(vv.begin(), vv.end());
    q[l].assign(q_rot.begin(), q_rot.end());
  }
  void decode(int, std::span<const float>, std::span<const float>, std::span<const float>, int,
              std::span<float>) override {
    throw make_error("kvsift eval", "prefill_capture", "decode", "prefill only");
  }
  [[nodiscard]] std::int64_t kept_tokens(int, int) const override { return 0; }

  ex::cache_shape shape;
  std::vector<std::vector<float>> k, v, q;  // [layers][n * heads * d]
};

// Forwards to another cache and keeps each layer's attention output of the current decode step.
class recording_cache : public ex::kv_cache {
 public:
  explicit recording_cache(ex::kv_cache& inner) : inner_(inner) {}
  void start(const ex::cache_shape& s) override {
    att.assign(static_cast<std::size_t>(s.num_layers), {});
    q.assign(static_cast<std::size_t>(s.num_layers), {});
    k.assign(static_cast<std::size_t>(s.num_layers), {});
    inner_.start(s);
  }
  void prefill(int layer, int n, std::span<const float> k, std::span<const float> v,
               std::span<const float> q) override {
    inner_.prefill(layer, n, k, v, q);
  }
  void decode(int layer, std::span<const float> q, std::span<const float> k,
              std::span<const float> v, int position, std::span<float> out) override {
    inner_.decode(layer, q, k, v, position, out);
    const auto L = static_cast<std::size_t>(layer);
    att[L].assign(out.begin(), out.end());
    this->q[L].assign(q.begin(), q.end());
    this->k[L].assign(k.begin(), k.end());
  }
  void after_attention(int layer, std::span<const float> q) override {
    inner_.after_attention(layer, q);
  }
  [[nodiscard]] std::int64_t kept_tokens(int layer, int kv_head) const override {
    return inner_.kept_tokens(layer, kv_head);
  }
  std::vector<std::vector<float>> att;  // [layers][q_heads * d] of the last decode step
  std::vector<std::vector<float>> q, k;  // [layers][heads * d]: its query and key (after RoPE)

 private:
  ex::kv_cache& inner_;
};

// The full-cache reference of a prompt: the engine's full_cache decoding greedily from the same
// prefill. Per decode step s (input = answer byte s, logits of byte s + 1): its input token, each
// layer's attention output and the logits.
struct reference_run {
  std::vector<int> tokens;                            // [n_new] greedy tokens (byte 0 = prefill's)
  std::vector<std::vector<std::vector<float>>> att;   // [steps][layers][q_heads * d]
  std::vector<std::vector<float>> logits;             // [steps][vocab]
  std::vector<std::vector<std::vector<float>>> q, k;  // [steps][layers][heads * d] (premise)
};

// Fidelity of one prompt against its reference_run, on the decode steps whose input token and
// history equal the reference's (the method's greedy tokens so far agree with the full cache's,
// so both decode exactly the same sequence; step 0 always qualifies: byte 0 comes from the
// prefill, which is the same for every method).
struct fidelity {
  std::vector<double> layer_err;  // [layers] relative L2 of attention output, mean over steps
  double att_err = 0.0;           // mean over layers of layer_err
  double kl_first = 0.0;          // KL(full || method) of the logits of answer byte 1 (step 0)
  double kl_mean = 0.0;           // the same, mean over the compared steps
  int steps = 0;                  // decode steps compared
};

double mean(const std::vector<double>& xs) {
  double s = 0.0;
  for (double x : xs) s += x;
  return xs.empty() ? 0.0 : s / static_cast<double>(xs.size());
}

double rel_l2(const std::vector<float>& ref, const std::vector<float>& x) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < ref.size() && i < x.size(); ++i) {
    const double d = static_cast<double>(x[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

// KL(softmax(p) || softmax(q)) of two logit vectors, in nats.
double kl_logits(const std::vector<float>& p, const std::vector<float>& q) {
  const auto lse = [](const std::vector<float>& x) {
    const double m = *std::max_element(x.begin(), x.end());
    double s = 0.0;
    for (float v : x) s += std::exp(v - m);
    return m + std::log(s);
  };
  const double lp = lse(p), lq = lse(q);
  double kl = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double a = p[i] - lp, b = q[i] - lq;
    kl += std::exp(a) * (a - b);
  }
  return std::max(0.0, kl);
}

// One (method, budget) configuration and its results.
struct config {
  std::string method;
  double budget = 0.0;
  std::unique_ptr<ex::kvsift_cache> cache;
  std::vector<ex::eval_result> results;
  std::vector<double> resident;  // per prompt: resident KV bytes after the prompt / its full KV
  std::vector<double> resident_end;  // per prompt: resident KV bytes after decoding / full KV
  std::vector<std::string> notes;    // per prompt: what the resident-fraction hook set
  std::vector<double> read;      // per prompt: KV tokens attention read / a full cache's
  std::vector<int> budget_tokens;
  std::vector<std::vector<int>> layer_budgets;  // per prompt: the last budget of each layer
  std::vector<double> recalled;  // per prompt: bytes recalls installed (host pool -> resident tier)
  std::vector<double> stalls;    // per prompt: decode steps that waited for a transfer
  std::vector<std::int64_t> far_rows;  // per prompt: host-pool rows attended where they lie
  std::vector<std::int64_t> far_overlaps;  // per prompt: steps whose host part overlapped (sim)
  std::vector<fidelity> fid;     // per prompt: attention-output error and logit KL vs full
  std::vector<int> bytes_right;  // per prompt: answer bytes 1.. right under teacher forcing
  std::vector<int> bytes_scored; // per prompt: answer bytes 1.. (len(answer) - 1)
  std::vector<std::vector<double>> layer_resident;  // per prompt: [layers] resident KV share
  std::vector<std::int64_t> peak_pages;  // per prompt (paged store): most pages held at once
  std::vector<std::int64_t> full_pages;  // per prompt (paged store): a full cache's pages at the end
  std::string store;  // the store the method ran over: dense, paged or tiered
  std::string far;    // a two-tier method's far-tier policy (recall, attend); empty otherwise
  std::string error;  // set when the method could not run (e.g. budget below its window)
  // The registry the cache looks its name up in (the default one plus this model's head roles);
  // shared so it outlives the cache's factory.
  std::shared_ptr<const method_registry<float>> registry;
};

// Greedy decoding of one prompt through `cache`, from a captured prefill: the same calls and
// tokens as llama_model::generate_greedy. With `ref`, fills `fid` (see fidelity) and, with
// `record`, `ref` is filled instead (the full-cache reference itself). `layer_resident`, if
// given, gets each layer's resident KV share right after the prompt (kept tokens of its KV heads
// / the prompt's).
ex::eval_result run_one(const ex::llama_model& model, const ex::eval_item& item,
                        const prefill_capture& cap, const std::vector<float>& prefill_logits,
                        double forward_seconds, ex::kv_cache& inner, reference_run* ref,
                        bool record, fidelity* fid, std::vector<double>* layer_resident) {
  const int n = cap.shape.prompt_len;
  const int n_new = static_cast<int>(item.answer.size());
  const int layers = cap.shape.num_layers;
  recording_cache cache(inner);
  const auto t0 = clock_type::now();
  cache.start(cap.shape);
  for (int l = 0; l < layers; ++l) {
    const auto L = static_cast<std::size_t>(l);
    cache.prefill(l, n, cap.k[L], cap.v[L], cap.q[L]);
  }
  const double method_prefill = seconds_since(t0);
  if (layer_resident) {
    layer_resident->assign(static_cast<std::size_t>(layers), 0.0);
    for (int l = 0; l < layers; ++l) {
      std::int64_t kept = 0;
      for (int h = 0; h < cap.shape.num_kv_heads; ++h) kept += cache.kept_tokens(l, h);
      (*layer_resident)[static_cast<std::size_t>(l)] =
          static_cast<double>(kept) / (static_cast<double>(n) * cap.shape.num_kv_heads);
    }
  }
  if (record && ref) *ref = reference_run{};
  if (fid) {
    *fid = fidelity{};
    fid->layer_err.assign(static_cast<std::size_t>(layers), 0.0);
  }
  double decode_seconds = 0.0;
  std::vector<int> out;
  std::vector<float> logits = prefill_logits;
  int position = n;
  bool agree = true;  // the tokens so far equal the reference's
  for (int s = 0; s < n_new; ++s) {
    const int next = ex::llama_model::argmax(logits);
    out.push_back(next);
    if (record && ref) ref->tokens.push_back(next);
    if (s + 1 >= n_new) break;
    const auto t1 = clock_type::now();
    logits = model.decode(next, position++, cache);
    decode_seconds += seconds_since(t1);
    const auto S = static_cast<std::size_t>(s);
    if (record && ref) {
      ref->att.push_back(cache.att);
      ref->q.push_back(cache.q);
      ref->k.push_back(cache.k);
      ref->logits.push_back(logits);
    } else if (ref && fid) {
      agree = agree && S < ref->tokens.size() && ref->tokens[S] == next;
      if (agree && S < ref->att.size()) {
        for (int l = 0; l < layers; ++l) {
          const auto L = static_cast<std::size_t>(l);
          fid->layer_err[L] += rel_l2(ref->att[S][L], cache.att[L]);
        }
        const double kl = kl_logits(ref->logits[S], logits);
        if (s == 0) fid->kl_first = kl;
        fid->kl_mean += kl;
        ++fid->steps;
      }
    }
  }
  if (fid && fid->steps > 0) {
    for (auto& e : fid->layer_err) e /= fid->steps;
    fid->kl_mean /= fid->steps;
    fid->att_err = mean(fid->layer_err);
  }

  ex::eval_result r;
  r.id = item.id;
  r.task = item.task;
  r.context_len = item.context_len;
  r.prompt_len = n;
  r.answer = item.answer;
  r.output = ex::byte_detokenize(out);
  r.exact = r.output == r.answer;
  if (item.task == "chain") {
    r.hops_total = static_cast<int>(ex::chain_hops(item.answer).size());
    r.hops_right = ex::hop_count(item.answer, r.output);
  }
  r.prefill_seconds = forward_seconds + method_prefill;
  r.decode_seconds = decode_seconds;
  r.decode_steps = std::max(0, n_new - 1);
  return r;
}

// Per-byte accuracy under teacher forcing: the prompt's captured prefill replayed into `cache`,
// then decode step s feeds answer byte s (not the method's own greedy byte), and answer byte
// s + 1 is right when it is the argmax of that step's logits. Returns how many of the answer's
// bytes 1..len-1 are right; byte 0 comes from the prefill's logits (full attention for every
// method) and is not scored.
int teacher_forced_right(const ex::llama_model& model, const ex::eval_item& item,
                         const prefill_capture& cap, ex::kv_cache& cache) {
  const int n = cap.shape.prompt_len;
  const auto answer = ex::byte_tokenize(item.answer);
  cache.start(cap.shape);
  for (int l = 0; l < cap.shape.num_layers; ++l) {
    const auto L = static_cast<std::size_t>(l);
    cache.prefill(l, n, cap.k[L], cap.v[L], cap.q[L]);
  }
  int right = 0;
  int position = n;
  for (std::size_t s = 0; s + 1 < answer.size(); ++s) {
    const auto logits = model.decode(answer[s], position++, cache);
    right += ex::llama_model::argmax(logits) == answer[s + 1] ? 1 : 0;
  }
  return right;
}

// What SyncKV's and HeteroCache's premise measures on the model (intra-layer similarity): in
// each layer, the overlap |A n B| / k of a leader head's top-k set A with each of its followers'
// B (SyncKV: an R-head and the other heads of its cluster; HeteroCache: a pivot and its
// satellites; pairs from the head-roles file the method runs with), from the full cache's
// attention of one query: the prompt's last query, and each decode step's query of the full
// cache's greedy decoding. k and the top-k rule are the method's calibration's
// (include/kvsift/calibrate/profile.hpp): SyncKV floor(n / 5), no pooling, GQA max; HeteroCache
// min(1024, floor(n / 5)), avg-pool 5, GQA mean. "random" is what two independent uniformly
// random k-sets of the s keys the query sees would overlap on average, k / s.
struct premise_stats {
  std::string method;
  std::vector<std::vector<std::pair<int, int>>> pairs;  // [layers] (leader, follower)
  std::vector<double> last, last_random, decode, decode_random;  // [layers] sums
  std::vector<long> last_n, decode_n;                            // [layers] counts
  int prompts = 0;

  void init(int layers) {
    last.assign(static_cast<std::size_t>(layers), 0.0);
    last_random = decode = decode_random = last;
    last_n.assign(static_cast<std::size_t>(layers), 0);
    decode_n = last_n;
  }
  [[nodiscard]] std::size_t pair_count() const {
    std::size_t c = 0;
    for (const auto& p : pairs) c += p.size();
    return c;
  }
};

// Leader/follower pairs of a method's roles (empty layers where a layer has none).
premise_stats premise_of(const calibrate::synckv_roles& r) {
  premise_stats p;
  p.method = "synckv";
  for (const auto& l : r.layers) {
    std::vector<std::pair<int, int>> pl;
    for (std::size_t h = 0; h < l.assign.size(); ++h) {
      const int rep = l.representatives[static_cast<std::size_t>(l.assign[h])];
      if (rep != static_cast<int>(h)) pl.emplace_back(rep, static_cast<int>(h));
    }
    p.pairs.push_back(std::move(pl));
  }
  p.init(static_cast<int>(r.layers.size()));
  return p;
}
premise_stats premise_of(const calibrate::heterocache_roles& r) {
  premise_stats p;
  p.method = "heterocache";
  for (const auto& l : r.layers) {
    std::vector<std::pair<int, int>> pl;
    for (std::size_t h = 0; h < l.roles.size(); ++h) {
      if (l.roles[h] == calibrate::head_role::satellite) pl.emplace_back(l.leader[h], static_cast<int>(h));
    }
    p.pairs.push_back(std::move(pl));
  }
  p.init(static_cast<int>(r.layers.size()));
  return p;
}

// Adds one prompt: its captured prefill (keys, last query) and the full cache's decode steps.
void add_premise(premise_stats& p, const prefill_capture& cap, const reference_run& ref) {
  const auto& sh = cap.shape;
  const int n = sh.prompt_len, H = sh.num_kv_heads, Hq = sh.num_q_heads, d = sh.head_dim;
  const int T = static_cast<int>(ref.k.size());
  const auto kvrow = static_cast<std::size_t>(H) * d;
  const auto qrow = static_cast<std::size_t>(Hq) * d;
  prompt_trace tr;
  tr.shape = {sh.num_layers, Hq, H, d};
  tr.n = n;
  tr.window = 1;
  tr.steps = T;
  tr.keys.resize(static_cast<std::size_t>(sh.num_layers) * (n + T) * kvrow);
  tr.queries.resize(static_cast<std::size_t>(sh.num_layers) * (1 + T) * qrow);
  for (int l = 0; l < sh.num_layers; ++l) {
    const auto L = static_cast<std::size_t>(l);
    auto kd = tr.keys.begin() + static_cast<std::ptrdiff_t>(L * (n + T) * kvrow);
    kd = std::copy_n(cap.k[L].begin(), static_cast<std::size_t>(n) * kvrow, kd);
    auto qd = tr.queries.begin() + static_cast<std::ptrdiff_t>(L * (1 + T) * qrow);
    qd = std::copy_n(cap.q[L].begin() + static_cast<std::ptrdiff_t>((n - 1) * qrow), qrow, qd);
    for (int t = 0; t < T; ++t) {
      const auto S = static_cast<std::size_t>(t);
      kd = std::copy_n(ref.k[S][L].begin(), kvrow, kd);
      qd = std::copy_n(ref.q[S][L].begin(), qrow, qd);
    }
  }
  const bool sync = p.method == "synckv";
  const int k = sync ? calibrate::synckv_topk(n, {}) : calibrate::heterocache_topk(n, {});
  const calibrate::topk_params tp =
      sync ? calibrate::topk_params{.k = k, .group = Hq / H, .kernel = 1,
                                    .gqa = gqa_reduce::max}
           : calibrate::topk_params{.k = k, .group = Hq / H, .kernel = 5,
                                    .pool = pooling::avg, .gqa = gqa_reduce::mean};
  for (int l = 0; l < sh.num_layers; ++l) {
    const auto L = static_cast<std::size_t>(l);
    if (p.pairs[L].empty()) continue;
    const auto sets = step_sets(tr, l, tp);
    for (std::size_t t = 0; t < sets.size(); ++t) {
      const int seen = n + static_cast<int>(t);
      for (const auto& [a, b] : p.pairs[L]) {
        const double o = calibrate::overlap(sets[t][static_cast<std::size_t>(a)],
                                            sets[t][static_cast<std::size_t>(b)]);
        const double rnd = static_cast<double>(std::min(k, seen)) / seen;
        if (t == 0) {
          p.last[L] += o;
          p.last_random[L] += rnd;
          ++p.last_n[L];
        } else {
          p.decode[L] += o;
          p.decode_random[L] += rnd;
          ++p.decode_n[L];
        }
      }
    }
  }
  ++p.prompts;
}

double ratio(double sum, long n) { return n > 0 ? sum / static_cast<double>(n) : 0.0; }

double sum_all(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x;
  return s;
}
long sum_all(const std::vector<long>& v) {
  long s = 0;
  for (long x : v) s += x;
  return s;
}

void print_premise(const std::vector<premise_stats>& ps) {
  if (ps.empty()) return;
  std::printf(
      "\npremise of the tiered methods on this model (full-KV attention, per layer and over all\n"
      "layers): mean top-k overlap of each leader head with its followers (SyncKV: R-head and\n"
      "cluster; HeteroCache: pivot and satellites; the roles file's pairs) at the prompt's last\n"
      "query and at the decode steps, against two random k-sets of the keys seen (k / n)\n");
  std::printf("%-12s %5s %6s | %10s %8s | %10s %8s\n", "method", "layer", "pairs", "last query",
              "random", "decode", "random");
  for (const auto& p : ps) {
    if (p.pair_count() == 0) {
      std::printf("%-12s   all      0 | no leader/follower pair in the roles file (%s)\n",
                  p.method.c_str(),
                  p.method == "synckv" ? "every head is its cluster's R-head"
                                       : "no satellite: every head keeps its own set");
      continue;
    }
    for (std::size_t l = 0; l <= p.pairs.size(); ++l) {
      const bool all = l == p.pairs.size();
      if (!all && p.pairs[l].empty()) continue;
      const double last = all ? ratio(sum_all(p.last), sum_all(p.last_n)) : ratio(p.last[l], p.last_n[l]);
      const double lr = all ? ratio(sum_all(p.last_random), sum_all(p.last_n))
                            : ratio(p.last_random[l], p.last_n[l]);
      const double dec = all ? ratio(sum_all(p.decode), sum_all(p.decode_n)) : ratio(p.decode[l], p.decode_n[l]);
      const double dr = all ? ratio(sum_all(p.decode_random), sum_all(p.decode_n))
                            : ratio(p.decode_random[l], p.decode_n[l]);
      std::printf("%-12s %5s %6zu | %10.3f %8.3f | %10.3f %8.3f\n", p.method.c_str(),
                  all ? "all" : std::to_string(l).c_str(), all ? p.pair_count() : p.pairs[l].size(),
                  last, lr, dec, dr);
    }
  }
  std::printf("(k: SyncKV floor(n/5), GQA max; HeteroCache min(1024, floor(n/5)), avg-pool 5, GQA\n"
              "mean; over %d prompts, decode steps of the full cache's greedy answer)\n",
              ps.front().prompts);
}

nlohmann::json premise_json(const std::vector<premise_stats>& ps) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& p : ps) {
    nlohmann::json m;
    m["prompts"] = p.prompts;
    m["pairs"] = p.pair_count();
    m["k"] = p.method == "synckv" ? "floor(n/5), GQA max" : "min(1024, floor(n/5)), avg-pool 5, GQA mean";
    m["overlap_last_query"] = ratio(sum_all(p.last), sum_all(p.last_n));
    m["random_last_query"] = ratio(sum_all(p.last_random), sum_all(p.last_n));
    m["overlap_decode"] = ratio(sum_all(p.decode), sum_all(p.decode_n));
    m["random_decode"] = ratio(sum_all(p.decode_random), sum_all(p.decode_n));
    m["by_layer"] = nlohmann::json::array();
    for (std::size_t l = 0; l < p.pairs.size(); ++l) {
      m["by_layer"].push_back({{"pairs", p.pairs[l].size()},
                               {"overlap_last_query", ratio(p.last[l], p.last_n[l])},
                               {"random_last_query", ratio(p.last_random[l], p.last_n[l])},
                               {"overlap_decode", ratio(p.decode[l], p.decode_n[l])},
                               {"random_decode", ratio(p.decode_random[l], p.decode_n[l])}});
    }
    j[p.method] = m;
  }
  return j;
}

// Progress on stderr: a redrawn bar on a terminal, a line every few runs otherwise (CI logs).
class progress {
 public:
  explicit progress(int total) : total_(total), tty_(::isatty(2) != 0), t0_(clock_type::now()) {}
  [[nodiscard]] bool tty() const { return tty_; }
  void update(int done, const std::string& what) {
    const double el = seconds_since(t0_);
    const double left = done > 0 ? el / done * (total_ - done) : 0.0;
    char eta[32];
    std::snprintf(eta, sizeof eta, "%dm%02ds", static_cast<int>(left) / 60,
                  static_cast<int>(left) % 60);
    if (tty_) {
      constexpr int width = 30;
      const int fill = total_ > 0 ? width * done / total_ : width;
      std::string bar(static_cast<std::size_t>(fill), '=');
      bar.resize(width, ' ');
      std::fprintf(stderr, "\r[%s] %d/%d  %-40.40s  %s left   ", bar.c_str(), done, total_,
                   what.c_str(), eta);
      if (done == total_) std::fputc('\n', stderr);
    } else if (done == total_ || done - last_ >= std::max(8, total_ / 20)) {
      std::fprintf(stderr, "kvsift eval: %d/%d runs (%.0f s, ~%s left) %s\n", done, total_, el,
                   eta, what.c_str());
      last_ = done;
    }
    std::fflush(stderr);
  }

 private:
  int total_;
  bool tty_;
  int last_ = 0;
  clock_type::time_point t0_;
};

struct task_numbers {
  int n = 0;
  double exact = 0.0, hops = 0.0;
  double bytes = 0.0;  // answer bytes after the first right under teacher forcing / scored
  int bytes_scored = 0;
};

// Accuracy of one configuration for a task, at one context length (0 = all).
task_numbers numbers(const config& c, const std::string& task, int context) {
  task_numbers t;
  for (const auto& r : c.results) {
    if (r.task != task || (context != 0 && r.context_len != context)) continue;
    ++t.n;
    t.exact += r.exact ? 1.0 : 0.0;
    t.hops += r.hops_total ? static_cast<double>(r.hops_right) / r.hops_total : 0.0;
    const auto i = static_cast<std::size_t>(&r - c.results.data());
    if (i < c.bytes_scored.size()) {
      t.bytes += c.bytes_right[i];
      t.bytes_scored += c.bytes_scored[i];
    }
  }
  if (t.bytes_scored > 0) t.bytes /= t.bytes_scored;
  if (t.n) {
    t.exact /= t.n;
    t.hops /= t.n;
  }
  return t;
}

double tokens_per_second(const config& c) {
  double s = 0.0;
  long steps = 0;
  for (const auto& r : c.results) {
    s += r.decode_seconds;
    steps += r.decode_steps;
  }
  return s > 0.0 ? static_cast<double>(steps) / s : 0.0;
}

double mean_prefill(const config& c) {
  double s = 0.0;
  for (const auto& r : c.results) s += r.prefill_seconds;
  return c.results.empty() ? 0.0 : s / static_cast<double>(c.results.size());
}

// Mean over prompts of a per-prompt fidelity number.
template <class F>
double mean_fid(const config& c, F f) {
  std::vector<double> xs;
  for (const auto& x : c.fid) {
    if (x.steps > 0) xs.push_back(f(x));
  }
  return mean(xs);
}

// Mean over prompts of per-layer vectors (all of one length).
std::vector<double> mean_layers(const std::vector<std::vector<double>>& per_prompt) {
  std::vector<double> m;
  for (const auto& v : per_prompt) {
    if (m.empty()) m.assign(v.size(), 0.0);
    for (std::size_t l = 0; l < v.size() && l < m.size(); ++l) m[l] += v[l];
  }
  for (auto& x : m) x /= static_cast<double>(per_prompt.size());
  return m;
}

std::vector<double> mean_layer_err(const config& c) {
  std::vector<std::vector<double>> v;
  for (const auto& x : c.fid) {
    if (x.steps > 0) v.push_back(x.layer_err);
  }
  return mean_layers(v);
}

std::string pct(double x, bool have) {
  if (!have) return "-";
  char b[16];
  std::snprintf(b, sizeof b, "%.0f%%", 100.0 * x);
  return b;
}

std::string budget_label(double b) {
  char s[16];
  std::snprintf(s, sizeof s, "%g", b);
  return s;
}

void print_tables(const std::vector<config>& configs, const std::vector<int>& contexts,
                  const std::map<std::string, int>& task_counts, bool match_resident,
                  bool verbose) {
  std::string counts;
  for (const char* first : {"passkey", "chain"}) {
    if (task_counts.count(first)) counts += (counts.empty() ? "" : ", ") + std::string(first) +
                                            " " + std::to_string(task_counts.at(first));
  }
  for (const auto& [task, n] : task_counts) {
    if (task != "passkey" && task != "chain") counts += ", " + task + " " + std::to_string(n);
  }
  std::printf("prompts: %s; greedy decoding, exact match; budget = %s\n\n", counts.c_str(),
              match_resident ? "target device-resident share of the prompt's KV (--match resident)"
                             : "fraction of the prompt kept per KV head (--match budget)");
  std::printf("%-14s %6s %8s %6s %8s %6s %6s %7s %7s %8s %8s %8s %9s\n", "method", "budget",
              "KV res.", "read", "passkey", "chain", "hops", "pk.byte", "ch.byte", "att.err", "KL",
              "tok/s", "prefill s");
  for (const auto& c : configs) {
    if (!c.error.empty()) {
      // "infeasible: ..." (a resident target the method's roles cannot meet) stays as it is
      const bool infeasible = c.error.rfind("infeasible: ", 0) == 0;
      std::printf("%-14s %6s  %s%s\n", c.method.c_str(), budget_label(c.budget).c_str(),
                  infeasible ? "" : "not run: ", c.error.c_str());
      continue;
    }
    const auto pk = numbers(c, "passkey", 0);
    const auto ch = numbers(c, "chain", 0);
    // the resident share with one decimal; '*' where --match resident missed the target by more
    // than 2 points (a method whose parameter cannot reach it) — not full_kv / quest by design
    char res[24];
    const double rm = mean(c.resident);
    const bool by_design = c.method == "full_kv" || c.method == "quest";
    std::snprintf(res, sizeof res, "%.1f%%%s", 100.0 * rm,
                  match_resident && !by_design && std::abs(rm - c.budget) > 0.02 ? "*" : "");
    std::printf("%-14s %6s %8s %6s %8s %6s %6s %7s %7s %8.4f %8.4f %8.1f %9.3f\n",
                c.method.c_str(), budget_label(c.budget).c_str(), res,
                pct(mean(c.read), true).c_str(), pct(pk.exact, pk.n > 0).c_str(),
                pct(ch.exact, ch.n > 0).c_str(), pct(ch.hops, ch.n > 0).c_str(),
                pct(pk.bytes, pk.bytes_scored > 0).c_str(), pct(ch.bytes, ch.bytes_scored > 0).c_str(),
                mean_fid(c, [](const fidelity& f) { return f.att_err; }),
                mean_fid(c, [](const fidelity& f) { return f.kl_first; }),
                tokens_per_second(c), mean_prefill(c));
  }
  // the tiered methods' traffic: what they recalled from the host pool and the steps that waited
  bool any_transfer = false;
  const auto mean_far = [](const config& c) {
    double sum = 0;
    for (const auto x : c.far_rows) sum += static_cast<double>(x);
    return c.far_rows.empty() ? 0.0 : sum / static_cast<double>(c.far_rows.size());
  };
  for (const auto& c : configs) {
    any_transfer = any_transfer || (c.error.empty() && (mean(c.recalled) > 0 || mean_far(c) > 0));
  }
  if (any_transfer) {
    std::printf("\n%-14s %6s %14s %14s %10s %12s\n", "method", "budget", "params", "recalled KiB",
                "stalls", "far rows");
    for (const auto& c : configs) {
      if (!c.error.empty() || (mean(c.recalled) == 0 && mean(c.stalls) == 0 && mean_far(c) == 0)) continue;
      std::printf("%-14s %6s %14s %14.1f %10.2f %12.0f\n", c.method.c_str(),
                  budget_label(c.budget).c_str(), c.notes.empty() ? "" : c.notes.front().c_str(),
                  mean(c.recalled) / 1024.0, mean(c.stalls), mean_far(c));
    }
    std::printf("(per prompt, mean: bytes that recalls installed host pool -> resident tier, equal\n"
                "on every exec; decode steps that waited for a recall; host-pool rows attended\n"
                "where they lie, summed over steps, layers and KV heads (--far attend); methods\n"
                "that moved and attended nothing there are not listed)\n");
  }
  // a paged store's pages: the most held at once against a full cache's on the same prompts
  bool any_pages = false;
  for (const auto& c : configs) any_pages = any_pages || (c.error.empty() && !c.peak_pages.empty());
  if (any_pages) {
    std::printf("\n%-14s %6s %12s %12s %8s\n", "method", "budget", "peak pages", "full pages",
                "share");
    for (const auto& c : configs) {
      if (!c.error.empty() || c.peak_pages.empty()) continue;
      std::int64_t peak = 0, full = 0;
      for (std::size_t i = 0; i < c.peak_pages.size(); ++i) {
        peak += c.peak_pages[i];
        full += c.full_pages[i];
      }
      std::printf("%-14s %6s %12lld %12lld %7.1f%%\n", c.method.c_str(),
                  budget_label(c.budget).c_str(), static_cast<long long>(peak),
                  static_cast<long long>(full), full > 0 ? 100.0 * peak / full : 0.0);
    }
    std::printf("(the paged store: store::paged, thrust::paged_store on a device exec; summed over\n"
                "the prompts: the most pages each held at once, the prefill's pages before its round\n"
                "frees any included; a full cache's at the end)\n");
  }
  if (verbose) {
    // per layer: resident KV share after the prompt, and attention-output error
    std::printf("\nper layer (--verbose): resident KV share after the prompt | attention-output "
                "error vs full\n");
    for (const auto& c : configs) {
      if (!c.error.empty()) continue;
      std::printf("%-14s %6s |", c.method.c_str(), budget_label(c.budget).c_str());
      for (double x : mean_layers(c.layer_resident)) std::printf(" %5.1f%%", 100.0 * x);
      std::printf(" |");
      for (double x : mean_layer_err(c)) std::printf(" %6.4f", x);
      std::printf("\n");
    }
  }
  if (contexts.size() < 2) return;
  std::printf("\nby context length (bytes of prompt + answer):\n");
  std::string head = "method         budget |";
  std::string sub = "                      |";
  const char* groups[] = {"passkey", "chain", "hops", "pk.byte", "ch.byte"};
  for (const char* g : groups) {
    std::string h = std::string(" ") + g;
    const std::size_t w = contexts.size() * 6;
    h.resize(w, ' ');
    head += h + " |";
    for (int ctx : contexts) {
      char b[16];
      std::snprintf(b, sizeof b, "%6d", ctx);
      sub += b;
    }
    sub += " |";
  }
  std::printf("%s\n%s\n", head.c_str(), sub.c_str());
  for (const auto& c : configs) {
    if (!c.error.empty()) continue;
    std::printf("%-14s %6s |", c.method.c_str(), budget_label(c.budget).c_str());
    for (int g = 0; g < 5; ++g) {
      for (int ctx : contexts) {
        const auto t = numbers(c, g == 0 || g == 3 ? "passkey" : "chain", ctx);
        const double x = g == 2 ? t.hops : g >= 3 ? t.bytes : t.exact;
        std::printf("%6s", pct(x, g >= 3 ? t.bytes_scored > 0 : t.n > 0).c_str());
      }
      std::printf(" |");
    }
    std::printf("\n");
  }
  std::printf(
      "\nKV res.: device-resident KV bytes right after the prompt / the prompt's full KV (mean\n"
      "over prompts; full_kv and quest keep it all by design; * = more than 2 points from the\n"
      "target); read: KV tokens a decode step's attention reads / a full cache's; hops: chain\n"
      "hops right before the first wrong one; pk.byte / ch.byte (bytes): answer bytes after the\n"
      "first that are right under teacher forcing (each step fed the answer's previous byte);\n"
      "att.err: relative L2 error of each layer's\n"
      "attention output against the full cache's (engine full_cache, same prompt), mean over\n"
      "layers and over the decode steps whose tokens so far equal the full cache's (always the\n"
      "first); KL: KL(full || method) in nats of the logits of answer byte 1, the first byte\n"
      "that reads the method's cache (byte 0 comes from the full-attention prefill);\n"
      "tok/s: decode steps per second (batch 1);\n"
      "prefill s: the engine's forward pass + the method's prefill work, per prompt.\n");
}

// Per-layer budgets of a prompt; null for a layer without a token budget (full_kv, LagKV).
nlohmann::json layer_budgets_json(const std::vector<int>& b) {
  nlohmann::json j = nlohmann::json::array();
  for (int x : b) {
    if (x < 0 || x == std::numeric_limits<int>::max()) {
      j.push_back(nullptr);
    } else {
      j.push_back(x);
    }
  }
  return j;
}

nlohmann::json to_json(const std::string& model_dir, const std::string& kernel_name,
                       const std::string& match, const std::vector<std::string>& files,
                       const std::vector<config>& configs, const std::vector<int>& contexts) {
  nlohmann::json j;
  j["model"] = model_dir;
  j["prompts"] = files;
  j["kernel"] = kernel_name;
  j["match"] = match;
  j["runs"] = nlohmann::json::array();
  for (const auto& c : configs) {
    nlohmann::json r;
    r["method"] = c.method;
    r["budget"] = c.budget;
    r["store"] = c.store;
    if (!c.far.empty()) r["far"] = c.far;
    if (!c.error.empty()) {
      r["error"] = c.error;
      j["runs"].push_back(r);
      continue;
    }
    r["resident_kv"] = mean(c.resident);
    r["resident_kv_end"] = mean(c.resident_end);
    r["read_kv"] = mean(c.read);
    r["decode_tokens_per_s"] = tokens_per_second(c);
    r["prefill_s"] = mean_prefill(c);
    r["attention_error"] = mean_fid(c, [](const fidelity& f) { return f.att_err; });
    r["attention_error_by_layer"] = mean_layer_err(c);
    r["kl_first_byte"] = mean_fid(c, [](const fidelity& f) { return f.kl_first; });
    r["kl_mean"] = mean_fid(c, [](const fidelity& f) { return f.kl_mean; });
    r["fidelity_steps"] = mean_fid(c, [](const fidelity& f) { return f.steps; });
    r["layer_resident_kv"] = mean_layers(c.layer_resident);
    if (!c.peak_pages.empty()) {  // summed over the prompts, each run on its own
      std::int64_t peak = 0, full = 0;
      for (std::size_t i = 0; i < c.peak_pages.size(); ++i) {
        peak += c.peak_pages[i];
        full += c.full_pages[i];
      }
      r["peak_pages"] = peak;
      r["full_pages"] = full;
    }
    for (const char* task : {"passkey", "chain"}) {
      const auto all = numbers(c, task, 0);
      if (all.n == 0) continue;
      nlohmann::json t;
      t["n"] = all.n;
      t["exact"] = all.exact;
      if (std::string(task) == "chain") t["hops"] = all.hops;
      t["byte_accuracy_tf"] = all.bytes;  // answer bytes 1.. right under teacher forcing
      t["bytes_scored"] = all.bytes_scored;
      for (int ctx : contexts) {
        const auto x = numbers(c, task, ctx);
        if (x.n == 0) continue;
        nlohmann::json b{{"n", x.n}, {"exact", x.exact}, {"byte_accuracy_tf", x.bytes}};
        if (std::string(task) == "chain") b["hops"] = x.hops;
        t["by_context"][std::to_string(ctx)] = b;
      }
      r[task] = t;
    }
    r["items"] = nlohmann::json::array();
    for (std::size_t i = 0; i < c.results.size(); ++i) {
      const auto& x = c.results[i];
      nlohmann::json it{{"id", x.id},           {"task", x.task},
                        {"context_len", x.context_len}, {"prompt_len", x.prompt_len},
                        {"budget_tokens", c.budget_tokens[i]},
                        {"layer_budgets", layer_budgets_json(c.layer_budgets[i])},
                        {"answer", x.answer},   {"output", x.output},
                        {"exact", x.exact},     {"resident_kv", c.resident[i]},
                        {"resident_kv_end", c.resident_end[i]}, {"params", c.notes[i]},
                        {"bytes_recalled", c.recalled[i]}, {"stalls", c.stalls[i]},
                        {"prefill_s", x.prefill_seconds}, {"decode_s", x.decode_seconds}};
      if (x.task == "chain") it["hops_right"] = x.hops_right;
      if (!c.far.empty()) {
        it["far_rows"] = c.far_rows[i];
        it["far_overlaps"] = c.far_overlaps[i];
      }
      it["bytes_right_tf"] = c.bytes_right[i];
      it["bytes_scored_tf"] = c.bytes_scored[i];
      it["layer_resident_kv"] = c.layer_resident[i];
      if (i < c.peak_pages.size()) {
        it["peak_pages"] = c.peak_pages[i];
        it["full_pages"] = c.full_pages[i];
      }
      const auto& f = c.fid[i];
      it["attention_error"] = f.att_err;
      it["attention_error_by_layer"] = f.layer_err;
      it["kl_first_byte"] = f.kl_first;
      it["kl_mean"] = f.kl_mean;
      it["fidelity_steps"] = f.steps;
      r["items"].push_back(it);
    }
    j["runs"].push_back(r);
  }
  return j;
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '<') o += "&lt;";
    else if (ch == '>') o += "&gt;";
    else if (ch == '&') o += "&amp;";
    else o += ch;
  }
  return o;
}

// Accuracy against the measured device-resident KV share (after the prompt, mean over prompts)
// per method, one line per method through its budgets, one panel per metric (passkey exact,
// chain exact, chain hops); hand-written SVG.
std::string svg_chart(const std::vector<config>& configs) {
  const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
                          "#000000", "#aec7e8"};
  constexpr std::size_t n_colors = sizeof colors / sizeof colors[0];
  struct panel {
    const char* title;
    const char* task;
    bool hops;
  };
  const panel panels[] = {{"passkey exact", "passkey", false},
                          {"chain exact", "chain", false},
                          {"chain hops", "chain", true}};
  const int pw = 300, ph = 260, ml = 50, mt = 60, gap = 60, legend_w = 150;
  const int width = ml + 3 * pw + 2 * gap + 20 + legend_w;
  const int height = mt + ph + 60;
  std::vector<std::string> methods;
  for (const auto& c : configs) {
    if (c.error.empty() && std::find(methods.begin(), methods.end(), c.method) == methods.end()) {
      methods.push_back(c.method);
    }
  }
  char b[512];
  std::string s;
  std::snprintf(b, sizeof b,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
                "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                "<text x=\"%d\" y=\"20\" font-size=\"15\">kvsift eval: accuracy vs resident KV "
                "(device-resident share of the prompt's KV, measured)</text>\n",
                width, height, width, height, ml);
  s += b;
  for (int p = 0; p < 3; ++p) {
    const int x0 = ml + p * (pw + gap);
    const int y0 = mt;
    auto X = [&](double resident) { return x0 + std::clamp(resident, 0.0, 1.0) * pw; };
    auto Y = [&](double acc) { return y0 + (1.0 - acc) * ph; };
    std::snprintf(b, sizeof b,
                  "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-weight=\"bold\">%s</text>\n"
                  "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
                  "stroke=\"#444\"/>\n",
                  x0 + pw / 2, y0 - 8, panels[p].title, x0, y0, pw, ph);
    s += b;
    for (int i = 0; i <= 4; ++i) {
      const double v = i / 4.0;
      std::snprintf(b, sizeof b,
                    "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n"
                    "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%d%%</text>\n"
                    "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>\n"
                    "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n",
                    x0, Y(v), x0 + pw, Y(v), x0 - 4, Y(v) + 4, i * 25, X(v), y0, X(v), y0 + ph,
                    X(v), y0 + ph + 16, v);
      s += b;
    }
    std::snprintf(b, sizeof b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">resident KV</text>\n",
                  x0 + pw / 2, y0 + ph + 34);
    s += b;
    for (std::size_t m = 0; m < methods.size(); ++m) {
      const char* color = colors[m % n_colors];
      std::vector<std::pair<double, double>> pts;
      for (const auto& c : configs) {
        if (c.method != methods[m] || !c.error.empty()) continue;
        const auto t = numbers(c, panels[p].task, 0);
        if (t.n == 0) continue;
        pts.emplace_back(mean(c.resident), panels[p].hops ? t.hops : t.exact);
      }
      std::sort(pts.begin(), pts.end());
      if (pts.size() > 1) {
        s += "<polyline fill=\"none\" stroke=\"" + std::string(color) +
             "\" stroke-width=\"2\" points=\"";
        for (const auto& [x, y] : pts) {
          std::snprintf(b, sizeof b, "%.1f,%.1f ", X(x), Y(y));
          s += b;
        }
        s += "\"/>\n";
      }
      for (const auto& [x, y] : pts) {
        std::snprintf(b, sizeof b,
                      "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"><title>%s resident %.1f%%: "
                      "%.0f%%</title></circle>\n",
                      X(x), Y(y), color, xml_escape(methods[m]).c_str(), 100 * x, 100 * y);
        s += b;
      }
    }
  }
  const int lx = ml + 3 * pw + 2 * gap + 20;
  for (std::size_t m = 0; m < methods.size(); ++m) {
    const int ly = mt + 10 + static_cast<int>(m) * 20;
    std::snprintf(b, sizeof b,
                  "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
                  "stroke-width=\"3\"/>\n<text x=\"%d\" y=\"%d\">%s</text>\n",
                  lx, ly, lx + 20, ly, colors[m % n_colors], lx + 26, ly + 4,
                  xml_escape(methods[m]).c_str());
    s += b;
  }
  s += "</svg>\n";
  return s;
}

double parse_budget(const std::string& s) {
  std::size_t used = 0;
  double b = -1.0;
  try {
    b = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  require(used == s.size() && b > 0.0 && b <= 1.0, "kvsift eval", "--budgets", s,
          "fractions in (0, 1], comma-separated");
  return b;
}

int parse_limit(const std::string& s) {
  std::size_t used = 0;
  long v = -1;
  try {
    v = std::stol(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  require(used == s.size() && v >= 0, "kvsift eval", "--limit", s,
          "a number of prompts per file (0 = all)");
  return static_cast<int>(v);
}

}  // namespace

// One model and its prompts.
struct job {
  std::string model_dir;
  std::vector<std::string> files;
  int limit = 0;  // prompts per file (0 = all)
};

// Everything a job needs from the command line.
struct run_options {
  std::vector<std::string> methods;
  std::vector<double> budgets;
  bool match_resident = true;
  std::string roles_file;
  ex::attention_kernel kernel = ex::attention_kernel::library;
  std::string kernel_name;
  std::string exec = "host";  // --exec: registry_on_exec (exec_choice.hpp)
  std::string store = "dense";  // --store: the one-tier methods' store (dense or paged)
  int page_size = 16;           // --page-size: tokens per page of --store paged
  kvsift::far_tier far = kvsift::far_tier::recall;  // --far: the two-tier methods' far-tier policy
  bool verbose = false;  // per-layer table
};

// `base` (the default registry, or its --exec counterpart) with SyncKV's and HeteroCache's
// entries given this model's head roles (read and checked against the model here: the library's
// factories take them JSON-free).
template <class ModelConfig>
std::shared_ptr<const method_registry<float>> registry_with_roles(const std::string& model_dir,
                                                                  const run_options& o,
                                                                  const ModelConfig& cfg,
                                                                  const method_registry<float>& base) {
  const calibrate::model_fingerprint fp{.layers = cfg.num_layers, .q_heads = cfg.num_q_heads,
                                        .kv_heads = cfg.num_kv_heads, .head_dim = cfg.head_dim,
                                        .config_hash = ""};
  std::vector<select::cluster_roles> sync;
  std::vector<method_config::heterocache_layer> hetero;
  const bool wants_sync =
      std::find(o.methods.begin(), o.methods.end(), "synckv") != o.methods.end();
  const bool wants_hetero =
      std::find(o.methods.begin(), o.methods.end(), "heterocache") != o.methods.end();
  if (wants_sync) {
    if (const auto p = roles_path(model_dir, o.roles_file, "synckv"); !p.empty()) {
      sync = synckv_roles_of(calibrate::read_synckv_roles(p, fp));
    }
  }
  if (wants_hetero) {
    if (const auto p = roles_path(model_dir, o.roles_file, "heterocache"); !p.empty()) {
      hetero = heterocache_roles_of(calibrate::read_heterocache_roles(p, fp));
    }
  }
  auto r = std::make_shared<method_registry<float>>();
  for (const auto& name : base.names()) {
    auto e = base.at(name);
    if (e.name == "synckv" || e.name == "heterocache") {
      const bool is_sync = e.name == "synckv";
      auto fill = [sync, hetero, is_sync](method_config& c) {
        if (is_sync) c.synckv_roles = sync;
        else c.heterocache_roles = hetero;
      };
      e.make = [make = e.make, fill](const method_config& c0) {
        method_config c = c0;
        fill(c);
        return make(c);
      };
      e.for_resident_fraction = [hook = e.for_resident_fraction, fill](method_config c, double f) {
        fill(c);
        return hook(std::move(c), f);
      };
    }
    r->add(std::move(e));
  }
  return r;
}

// The premise figures to gather (print_premise): one per tiered method asked for that has roles
// for this model (the same files registry_with_roles reads).
template <class ModelConfig>
std::vector<premise_stats> premise_setup(const std::string& model_dir, const run_options& o,
                                         const ModelConfig& cfg) {
  const calibrate::model_fingerprint fp{.layers = cfg.num_layers, .q_heads = cfg.num_q_heads,
                                        .kv_heads = cfg.num_kv_heads, .head_dim = cfg.head_dim,
                                        .config_hash = ""};
  std::vector<premise_stats> out;
  const auto wants = [&](const char* m) {
    return std::find(o.methods.begin(), o.methods.end(), m) != o.methods.end();
  };
  if (wants("synckv")) {
    if (const auto p = roles_path(model_dir, o.roles_file, "synckv"); !p.empty()) {
      out.push_back(premise_of(calibrate::read_synckv_roles(p, fp)));
    }
  }
  if (wants("heterocache")) {
    if (const auto p = roles_path(model_dir, o.roles_file, "heterocache"); !p.empty()) {
      out.push_back(premise_of(calibrate::read_heterocache_roles(p, fp)));
    }
  }
  return out;
}

// Runs one job; prints its tables (or returns its JSON) and fills `configs` (for the plot).
// With `json`, only the JSON is made (no tables); with `keep_json` the tables are printed and
// the JSON returned as well (--json-out).
nlohmann::json run_job(const job& jb, const run_options& o, bool json, bool print_header,
                       std::vector<config>& configs, bool keep_json = false) {
  const auto model = ex::llama_model::load(jb.model_dir);
  std::vector<ex::eval_item> items;
  std::map<std::string, int> task_counts;
  std::set<int> context_set;
  for (const auto& f : jb.files) {
    auto part = ex::load_eval_jsonl(f);
    if (jb.limit > 0 && static_cast<int>(part.size()) > jb.limit) {
      part.resize(static_cast<std::size_t>(jb.limit));
    }
    for (auto& it : part) {
      ++task_counts[it.task];
      context_set.insert(it.context_len);
      items.push_back(std::move(it));
    }
  }
  require(!items.empty(), "kvsift eval", "--prompts", jb.files.front(),
          "files with at least one prompt");
  const std::vector<int> contexts(context_set.begin(), context_set.end());

  configs.clear();
  // a device exec builds its paged store itself; the host's is method_registry_paged's
  const bool device_paged = o.store == "paged" && o.exec != "host";
  const auto on_exec = registry_on_exec(
      o.exec, std::shared_ptr<const method_registry<float>>(&default_method_registry<float>(),
                                                            [](const method_registry<float>*) {}),
      device_paged ? o.page_size : 0);
  std::shared_ptr<const method_registry<float>> on_store = on_exec;
  if (o.store == "paged" && !device_paged) {
    on_store = std::make_shared<const method_registry<float>>(
        method_registry_paged<float>(*on_exec, o.page_size));
  }
  if (o.far != kvsift::far_tier::recall) {
    on_store = std::make_shared<const method_registry<float>>(method_registry_far<float>(*on_store, o.far));
  }
  const auto registry = registry_with_roles(jb.model_dir, o, model.config(), *on_store);
  std::vector<premise_stats> premise = premise_setup(jb.model_dir, o, model.config());
  for (const auto& m : o.methods) {
    for (double b : o.budgets) {
      config c;
      c.method = m;
      c.budget = b;
      c.registry = registry;
      c.store = detail::is_one_tier_method(m) ? o.store : "tiered";
      if (!detail::is_one_tier_method(m)) c.far = std::string(kvsift::to_string(o.far));
      c.cache = std::make_unique<ex::kvsift_cache>(  // throws for an unknown name
          m, b, ex::cache_options{.keep_fraction = std::nullopt, .roles_file = o.roles_file,
                                 .match_resident = o.match_resident, .registry = registry.get()});
      c.cache->set_attention_kernel(o.kernel);
      configs.push_back(std::move(c));
    }
  }

  const int total = static_cast<int>(items.size() * configs.size());
  std::fprintf(stderr, "kvsift eval: %s, %zu prompts x %zu methods x %zu budgets, exec %s\n",
               jb.model_dir.c_str(), items.size(), o.methods.size(), o.budgets.size(),
               o.exec.c_str());
  progress bar(total);
  const auto& cfg = model.config();
  const std::int64_t row_bytes =
      static_cast<std::int64_t>(cfg.num_layers) * cfg.num_kv_heads * cfg.head_dim * 2 *
      static_cast<std::int64_t>(sizeof(float));
  int done = 0;
  prefill_capture cap;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto& item = items[i];
    const auto ids = ex::byte_tokenize(item.prompt);
    const int n_new = static_cast<int>(item.answer.size());
    const auto t0 = clock_type::now();
    const std::vector<float> logits = model.prefill(ids, cap, n_new);
    const double forward = seconds_since(t0);
    // the full-cache reference of this prompt (fidelity); the engine's full_cache, not timed
    reference_run ref;
    {
      ex::full_cache full;
      (void)run_one(model, item, cap, logits, 0.0, full, &ref, /*record=*/true, nullptr, nullptr);
    }
    for (auto& p : premise) add_premise(p, cap, ref);
    // The configuration right after the forward pass decodes on colder caches: rotate which one
    // goes first, so timings stay comparable.
    for (std::size_t k = 0; k < configs.size(); ++k) {
      auto& c = configs[(i + k) % configs.size()];
      ++done;
      if (c.error.empty()) {
        try {
          fidelity f;
          std::vector<double> lr;
          c.results.push_back(
              run_one(model, item, cap, logits, forward, *c.cache, &ref, false, &f, &lr));
          c.fid.push_back(std::move(f));
          c.layer_resident.push_back(std::move(lr));
          const auto& r = c.results.back();
          const auto prompt_bytes = static_cast<double>(r.prompt_len * row_bytes);
          const auto end_bytes = static_cast<double>((r.prompt_len + r.decode_steps) * row_bytes);
          c.resident.push_back(static_cast<double>(c.cache->prompt_resident_bytes()) / prompt_bytes);
          c.resident_end.push_back(static_cast<double>(c.cache->stats().resident_bytes) / end_bytes);
          c.read.push_back(c.cache->full_attended_tokens() > 0
                               ? static_cast<double>(c.cache->attended_tokens()) /
                                     static_cast<double>(c.cache->full_attended_tokens())
                               : 1.0);
          c.budget_tokens.push_back(c.cache->budget_tokens());
          c.layer_budgets.push_back(c.cache->stats().layer_budgets);
          c.notes.push_back(c.cache->parameter_note());
          c.recalled.push_back(static_cast<double>(c.cache->stats().bytes_transferred));
          c.stalls.push_back(static_cast<double>(c.cache->stats().stalls));
          c.far_rows.push_back(c.cache->stats().far_rows);
          c.far_overlaps.push_back(c.cache->stats().far_overlaps);
          if (c.cache->page_size() > 0) {  // a full cache's pages at the end: prompt + decoded
            const std::int64_t P = c.cache->page_size();
            const std::int64_t tokens = r.prompt_len + r.decode_steps;
            c.peak_pages.push_back(c.cache->peak_pages());
            c.full_pages.push_back(static_cast<std::int64_t>(cfg.num_layers) * cfg.num_kv_heads *
                                   ((tokens + P - 1) / P));
          }
          // per-byte accuracy under teacher forcing: an exact greedy answer is the teacher-
          // forced path itself (every byte right); otherwise a second decode feeds the answer
          const int scored = std::max(0, n_new - 1);
          const int right = r.exact ? scored : teacher_forced_right(model, item, cap, *c.cache);
          c.bytes_scored.push_back(scored);
          c.bytes_right.push_back(right);
        } catch (const kvsift::error& e) {
          c.error = e.what();
          if (c.results.size() > c.resident.size()) c.results.pop_back();
          if (c.fid.size() > c.resident.size()) c.fid.pop_back();
          if (c.layer_resident.size() > c.resident.size()) c.layer_resident.pop_back();
          std::fprintf(stderr, "%skvsift eval: %s at %g not run: %s\n", bar.tty() ? "\n" : "",
                       c.method.c_str(), c.budget, e.what());
        }
      }
      bar.update(done, c.method + " " + budget_label(c.budget) + " " + item.id);
    }
  }
  const std::string match = o.match_resident ? "resident" : "budget";
  nlohmann::json j;
  if (json || keep_json) {
    j = to_json(jb.model_dir, o.kernel_name, match, jb.files, configs, contexts);
    j["exec"] = o.exec;
    j["store"] = o.store;
    j["far"] = std::string(kvsift::to_string(o.far));
    if (!premise.empty()) j["premise"] = premise_json(premise);
    if (json) return j;
  }
  if (print_header) {
    std::printf("== model %s (%d layers, %d query heads, %d KV heads)\n",
                std::filesystem::path(jb.model_dir).filename().string().c_str(), cfg.num_layers,
                cfg.num_q_heads, cfg.num_kv_heads);
  }
  print_tables(configs, contexts, task_counts, o.match_resident, o.verbose);
  print_premise(premise);
  return j;
}

// The shipped prompts of a shipped model: recall-8kv has its own (with the BOS byte).
std::vector<std::string> default_prompts(const std::string& model_dir) {
  if (std::filesystem::path(model_dir).filename() == "recall-8kv") {
    return {resolve("data/eval/recall-8kv/passkey.jsonl"),
            resolve("data/eval/recall-8kv/chain.jsonl")};
  }
  return {resolve("data/eval/passkey.jsonl"), resolve("data/eval/chain.jsonl")};
}

int eval(const std::vector<std::string>& args) {
  if (flag(args, "--help") || flag(args, "-h")) {
    std::puts(
        "usage: kvsift eval [--model DIR] [--prompts F1.jsonl,F2.jsonl] [--methods m1,m2]\n"
        "                   [--budgets 0.25,0.5] [--match resident|budget] [--roles FILE]\n"
        "                   [--json] [--json-out FILE] [--plot FILE.svg] [--limit N]\n"
        "                   [--kernel library|engine] [--exec host|thrust-cpp|thrust-omp]\n"
        "                   [--store dense|paged|tiered] [--page-size P] [--far recall|attend]\n"
        "                   [--verbose]\n"
        "  defaults: both shipped models, each on its shipped prompts (protocol v2: the answer's\n"
        "  separator space ends the prompt): data/tiny-recall on\n"
        "  data/eval/{passkey,chain}.jsonl (12 + 12) and data/recall-8kv on the first 12 of\n"
        "  data/eval/recall-8kv/{passkey,chain}.jsonl (--limit 12); with --model, that model on\n"
        "  its shipped prompts (all of them); relative paths also resolve against the source tree.\n"
        "  Every method, budget 0.25. --match resident (default): the budget is the target\n"
        "  device-resident share of the prompt's KV at the end of the prompt, each method's\n"
        "  parameter set for it (full_kv and quest keep the whole prompt resident by design);\n"
        "  --match budget: the budget is the fraction of the prompt kept per KV head\n"
        "  (floor(b * n) tokens; LagKV keeps that share of each partition). --roles FILE: a\n"
        "  head-roles file (kvsift calibrate) for SyncKV or HeteroCache, whichever its \"method\"\n"
        "  names; otherwise each takes the model's roles-synckv.json / roles-heterocache.json\n"
        "  when it has one (a resident target its roles cannot meet shows as infeasible).\n"
        "  --kernel engine: the engine's\n"
        "  attend_decode over each plan instead of the library's attention, on the steps whose\n"
        "  rows are in slot order (a dense host store before a round reorders them; attend() on\n"
        "  the others).\n"
        "  --exec thrust-cpp|thrust-omp: the methods run over device memory on a simulated device\n"
        "  (Thrust's CPP or OMP system; every method); answers and resident shares equal\n"
        "  --exec host's.\n"
        "  --store paged: the one-tier methods run over store::paged (pages of --page-size\n"
        "  tokens, default 16, one pool per method), so an eviction frees whole pages; the\n"
        "  pages table and the JSON give the most pages held at once (peak_pages) against a\n"
        "  full cache's pages on the same prompts (full_pages). SyncKV, HeteroCache and FreeKV\n"
        "  run over their two-tier store (store::tiered) whatever --store says; the JSON names\n"
        "  each run's store. With --exec thrust-cpp|thrust-omp the paged store is in device\n"
        "  memory (thrust::paged_store). --store tiered names that store for a call of\n"
        "  two-tier methods only (a one-tier method in --methods is refused).\n"
        "  --far recall|attend: where SyncKV, HeteroCache and FreeKV read the host-pool rows a\n"
        "  step needs: recall copies them into the resident tier (default); attend leaves them\n"
        "  in the host pool and attends them there, merged by log-sum-exp (bytes_recalled 0;\n"
        "  far_rows counts them; far_overlaps, the layer steps whose host part ran beside the\n"
        "  device part, on thrust-cpp|thrust-omp). The JSON names the policy (\"far\"). Every\n"
        "  --exec; with --kernel library only (the engine's kernel reads the resident rows only).\n"
        "  Fidelity (table and JSON): each prompt is also decoded through the engine's full_cache;\n"
        "  att.err is the relative L2 error of each layer's attention output against it (mean over\n"
        "  layers and over the decode steps whose tokens so far equal the full cache's), KL the\n"
        "  KL(full || method) of the logits of answer byte 1 (the first that reads the cache).\n"
        "  pk.byte / ch.byte: answer bytes after the first that are right under teacher forcing\n"
        "  (JSON: byte_accuracy_tf under each task and context length). With SyncKV or\n"
        "  HeteroCache, the premise table: top-k overlap of each leader head with its followers\n"
        "  (from the roles file) at the prompt's last query and at decode steps, full-KV\n"
        "  attention, against two random sets of that size (JSON: premise).\n"
        "  --json-out FILE: the tables on stdout and the JSON written to FILE.\n"
        "  --verbose: a per-layer table of resident KV share and attention error.\n"
        "  --plot: accuracy against the measured resident KV share, one line per method.");
    return 0;
  }
  static const std::set<std::string> known = {"--model", "--prompts", "--methods", "--budgets",
                                              "--json",  "--plot",    "--limit",   "--kernel",
                                              "--match", "--roles",   "--verbose", "--json-out",
                                              "--exec",  "--store", "--page-size", "--far"};
  for (std::size_t i = 0; i < args.size(); ++i) {
    require(known.count(args[i]) > 0, "kvsift eval", "argument", args[i],
            "one of --model --prompts --methods --budgets --match --roles --json --json-out --plot "
            "--limit --kernel --exec --store --page-size --far --verbose");
    if (args[i] != "--json" && args[i] != "--verbose") {
      require(i + 1 < args.size(), "kvsift eval", args[i], "missing", "a value");
      ++i;
    }
  }
  run_options o;
  o.methods = split_list(option(args, "--methods", ""));
  if (o.methods.empty()) o.methods = default_method_registry<float>().names();
  for (const auto& b : split_list(option(args, "--budgets", "0.25"))) {
    o.budgets.push_back(parse_budget(b));
  }
  require(!o.budgets.empty(), "kvsift eval", "--budgets", "empty", "at least one value");
  const std::string match = option(args, "--match", "resident");
  require(match == "resident" || match == "budget", "kvsift eval", "--match", match,
          "resident (the budget is the device-resident KV share) or budget (tokens kept per head)");
  o.match_resident = match == "resident";
  o.roles_file = option(args, "--roles", "");
  if (!o.roles_file.empty()) {
    o.roles_file = resolve(o.roles_file);
    require(std::filesystem::exists(o.roles_file), "kvsift eval", "--roles", o.roles_file,
            "an existing head-roles file");
    (void)roles_file_method(o.roles_file);  // parses, names synckv or heterocache, or throws
  }
  o.kernel_name = option(args, "--kernel", "library");
  require(o.kernel_name == "library" || o.kernel_name == "engine", "kvsift eval", "--kernel",
          o.kernel_name, "library (kvsift's attention over the plan) or engine (attend_decode)");
  o.kernel = o.kernel_name == "engine" ? ex::attention_kernel::engine
                                       : ex::attention_kernel::library;
  o.exec = option(args, "--exec", "host");
  (void)registry_on_exec(o.exec, std::make_shared<const method_registry<float>>());  // names checked first
  o.store = option(args, "--store", "dense");
  require(o.store == "dense" || o.store == "paged" || o.store == "tiered", "kvsift eval", "--store",
          o.store,
          "dense (one capacity per head-sequence), paged (store::paged: pages freed on eviction) "
          "or tiered (the two-tier methods' store, which they run over whatever --store says)");
  if (o.store == "tiered") {
    for (const auto& m : o.methods) {
      require(!detail::is_one_tier_method(m), "kvsift eval", "--store", "tiered",
              "--methods of SyncKV, HeteroCache or FreeKV only (" + m +
                  " is a one-tier method: --store dense or paged)");
    }
  }
  {
    const std::string ps = option(args, "--page-size", "16");
    int v = 0;
    const auto r = std::from_chars(ps.data(), ps.data() + ps.size(), v);
    require(r.ec == std::errc() && r.ptr == ps.data() + ps.size() && v > 0 && v <= 4096,
            "kvsift eval", "--page-size", ps, "an integer in [1, 4096] (tokens per page)");
    o.page_size = v;
  }
  {
    const std::string far = option(args, "--far", "recall");
    require(far == "recall" || far == "attend", "kvsift eval", "--far", far,
            "recall (copy the host-pool rows a step needs into the resident tier) or attend "
            "(attend them in the host pool, merged by log-sum-exp)");
    o.far = far == "attend" ? kvsift::far_tier::attend : kvsift::far_tier::recall;
    require(o.far == kvsift::far_tier::recall || o.kernel == ex::attention_kernel::library,
            "kvsift eval", "--far", far,
            "recall with --kernel engine: the engine's kernel reads the resident rows only (use "
            "--kernel library, which attends the plan's far rows too)");
  }
  const bool json = flag(args, "--json");
  o.verbose = flag(args, "--verbose");
  const std::string plot = option(args, "--plot", "");
  const std::string json_out = option(args, "--json-out", "");
  const bool has_limit = !option(args, "--limit", "").empty();
  const int limit = parse_limit(option(args, "--limit", "0"));

  std::vector<job> jobs;
  const std::string model_arg = option(args, "--model", "");
  const std::string prompts_arg = option(args, "--prompts", "");
  if (model_arg.empty() && prompts_arg.empty()) {
    // the main job: both shipped models on their own prompts
    jobs.push_back({resolve("data/tiny-recall"), default_prompts("data/tiny-recall"), limit});
    jobs.push_back({resolve("data/recall-8kv"), default_prompts("data/recall-8kv"),
                    has_limit ? limit : 12});
  } else {
    job jb;
    jb.model_dir = resolve(model_arg.empty() ? "data/tiny-recall" : model_arg);
    if (prompts_arg.empty()) {
      jb.files = default_prompts(jb.model_dir);
    } else {
      for (const auto& f : split_list(prompts_arg)) jb.files.push_back(resolve(f));
    }
    require(!jb.files.empty(), "kvsift eval", "--prompts", prompts_arg, "at least one file");
    jb.limit = limit;
    jobs.push_back(std::move(jb));
  }

  nlohmann::json all = nlohmann::json::array();
  std::vector<config> configs;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    if (!json && j > 0) std::printf("\n");
    all.push_back(run_job(jobs[j], o, json, jobs.size() > 1, configs, !json_out.empty()));
    if (!plot.empty()) {
      // one chart per model: FILE.svg for the first, FILE.<model>.svg for the others
      std::string path = plot;
      if (j > 0) {
        const std::filesystem::path pp(plot);
        path = (pp.parent_path() / (pp.stem().string() + "." +
                                    std::filesystem::path(jobs[j].model_dir).filename().string() +
                                    pp.extension().string()))
                   .string();
      }
      std::ofstream out(path, std::ios::trunc);
      require(static_cast<bool>(out), "kvsift eval", "--plot", path, "a writable file");
      out << svg_chart(configs);
      std::fprintf(stderr, "kvsift eval: wrote %s\n", path.c_str());
    }
  }
  const nlohmann::json out = all.size() == 1 ? all[0] : nlohmann::json{{"jobs", all}};
  if (json) std::printf("%s\n", out.dump(2).c_str());
  if (!json_out.empty()) {
    std::ofstream f(json_out, std::ios::trunc);
    require(static_cast<bool>(f), "kvsift eval", "--json-out", json_out, "a writable file");
    f << out.dump(1) << "\n";
    std::fprintf(stderr, "kvsift eval: wrote %s\n", json_out.c_str());
  }
  return 0;
}

}  // namespace kvsift::cli
