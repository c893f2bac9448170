// SPDX-License-Identifier: Apache-2.0
// kvsift calibrate: offline head profiling for SyncKV and HeteroCache (METHODS.md "SyncKV" /
// Calibration and "HeteroCache" / Profiling, Roles), writing the head-roles file
// (include/kvsift/calibrate/roles_file.hpp, docs/calibration.md).
//
//   kvsift calibrate --method synckv|heterocache (--model DIR --prompts FILE.jsonl | --traces F)
//                    [--steps T] [--limit N] [--clusters N_r] [--topk k] [--tau-sim x]
//                    [--tau-stable x] --out roles.json
//   kvsift calibrate --verify roles.json --model DIR     (checks a roles file, prints its roles)
//
// Per prompt and layer, from the last query's attention (softmax over every token it sees):
//   synckv:      profiled steps = the prefill step (last prompt query) and decode steps 1..T;
//                per step one top-k set per KV head (no pooling, GQA max, k = --topk, default
//                floor(n / 5)); S = mean over steps of the pairwise overlaps;
//   heterocache: per step (prefill and 1..T) top-k sets (avg-pool 5, GQA mean,
//                k = min(1024, floor(n / 5))); similarity = overlaps of the prefill sets,
//                stability = median over decode steps of overlap(prefill set, step set).
// Several prompts: the per-prompt matrices (S; similarity and stability) are averaged, then the
// roles are assigned once per layer (k-means with N_r clusters; star clustering).

#include "calibration_profile.hpp"
#include "calibration_trace.hpp"
#include "commands.hpp"

#include "engine/eval_harness.hpp"
#include "engine/llama.hpp"

#include <kvsift/calibrate/all.hpp>
#include <kvsift/core/error.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace kvsift::cli {
namespace {

namespace cal = kvsift::calibrate;
namespace ex = kvsift::examples;

// A threshold in [0, 1].
double real_option(const std::string& cmd, const std::string& name, const std::string& s) {
  std::size_t used = 0;
  double v = -1.0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  require(used == s.size() && v >= 0.0 && v <= 1.0, cmd, name, s, "a number in [0, 1]");
  return v;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

void print_synckv(const cal::synckv_roles& r) {
  for (std::size_t l = 0; l < r.layers.size(); ++l) {
    const auto& x = r.layers[l];
    std::printf("layer %zu:", l);
    for (std::size_t c = 0; c < x.representatives.size(); ++c) {
      std::vector<int> members;
      for (std::size_t h = 0; h < x.assign.size(); ++h) {
        if (x.assign[h] == static_cast<int>(c)) members.push_back(static_cast<int>(h));
      }
      std::printf("  cluster %zu {%s} R-head %d", c, join(members).c_str(),
                  x.representatives[c]);
    }
    std::printf("\n");
  }
}

void print_heterocache(const cal::heterocache_roles& r) {
  for (std::size_t l = 0; l < r.layers.size(); ++l) {
    const auto& x = r.layers[l];
    std::printf("layer %zu:", l);
    for (std::size_t h = 0; h < x.roles.size(); ++h) {
      std::printf(" %zu:%s", h, std::string(cal::role_name(x.roles[h])).c_str());
      if (x.roles[h] == cal::head_role::satellite) std::printf("(of %d)", x.leader[h]);
      std::printf("[s=%.3f]", static_cast<double>(x.stability[h]));
    }
    std::printf("\n");
  }
}

int verify(const std::vector<std::string>& args) {
  const std::string cmd = "kvsift calibrate --verify";
  const std::string path = resolve_path(option(args, "--verify", ""));
  const std::string model_dir = resolve_path(option(args, "--model", ""));
  require(!option(args, "--model", "").empty(), cmd, "--model", "missing", "a model directory");
  const auto model = ex::llama_model::load(model_dir);
  const auto fp = fingerprint_of(model, model_dir);
  std::ifstream in(path);
  require(static_cast<bool>(in), cmd, "path", path, "a readable roles file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw make_error(cmd, "path", path, std::string("valid JSON (") + e.what() + ")");
  }
  const std::string method = j.value("method", std::string());
  if (method == "synckv") {
    print_synckv(cal::synckv_roles_from_json(j, fp, path));
  } else {
    require(method == "heterocache", cmd, "method", method, "\"synckv\" or \"heterocache\"");
    print_heterocache(cal::heterocache_roles_from_json(j, fp, path));
  }
  std::printf("%s: a valid %s roles file for %s\n", path.c_str(), method.c_str(),
              model_dir.c_str());
  return 0;
}

}  // namespace

int calibrate_heads(const std::vector<std::string>& args) {
  const std::string cmd = "kvsift calibrate";
  if (flag(args, "--help") || flag(args, "-h")) {
    std::puts(
        "usage: kvsift calibrate --method synckv|heterocache\n"
        "                        (--model DIR --prompts FILE.jsonl | --traces FILE.safetensors)\n"
        "                        [--steps T] [--limit N] [--clusters N_r] [--topk k]\n"
        "                        [--tau-sim x] [--tau-stable x] --out roles.json\n"
        "       kvsift calibrate --verify roles.json --model DIR\n"
        "  Profiles the heads on calibration prompts (never evaluation prompts) and writes the\n"
        "  head-roles file (docs/calibration.md). Defaults: --steps 8 greedy decode steps,\n"
        "  all prompts, --clusters 2 and --topk floor(n/5) (synckv), --tau-sim 0.5 and\n"
        "  --tau-stable 0.5 (heterocache). --traces reads a `kvsift trace` file instead of\n"
        "  running the model (with --model too, the trace must match that model).\n"
        "  --verify reads a roles file, checks it against the model and prints its roles.");
    return 0;
  }
  static const std::set<std::string> known = {
      "--method", "--model",    "--prompts", "--traces",     "--steps",  "--limit",
      "--clusters", "--topk",   "--tau-sim", "--tau-stable", "--out",    "--verify"};
  for (std::size_t i = 0; i < args.size(); i += 2) {
    require(known.count(args[i]) > 0 && i + 1 < args.size(), cmd, "argument", args[i],
            "a known option with a value (kvsift calibrate --help)");
  }
  if (!option(args, "--verify", "").empty()) return verify(args);

  const std::string method = option(args, "--method", "");
  require(method == "synckv" || method == "heterocache", cmd, "--method", method,
          "synckv or heterocache");
  const std::string out = option(args, "--out", "");
  require(!out.empty(), cmd, "--out", "missing", "an output roles.json path");
  const std::string traces = option(args, "--traces", "");
  const std::string model_arg = option(args, "--model", "");
  const std::string prompts_arg = option(args, "--prompts", "");
  require(!traces.empty() || (!model_arg.empty() && !prompts_arg.empty()), cmd,
          "--model/--prompts/--traces", "missing", "--model DIR --prompts FILE, or --traces FILE");
  require(traces.empty() || prompts_arg.empty(), cmd, "--prompts", prompts_arg,
          "not given together with --traces");
  const int steps = int_option(cmd, "--steps", option(args, "--steps", "8"));
  const int limit = int_option(cmd, "--limit", option(args, "--limit", "0"));
  cal::synckv_profile_params sp;
  sp.clusters = int_option(cmd, "--clusters", option(args, "--clusters", "2"));
  sp.topk = int_option(cmd, "--topk", option(args, "--topk", "0"));
  cal::heterocache_profile_params hp;
  hp.tau_sim = real_option(cmd, "--tau-sim", option(args, "--tau-sim", "0.5"));
  hp.tau_stable = real_option(cmd, "--tau-stable", option(args, "--tau-stable", "0.5"));
  require(sp.clusters >= 1, cmd, "--clusters", sp.clusters, ">= 1");
  require(method != "heterocache" || steps >= 1 || !traces.empty(), cmd, "--steps", steps,
          ">= 1 (stability needs decode steps)");

  // Source of prompt traces: the engine, or a trace file.
  cal::model_fingerprint fp;
  std::function<prompt_trace(int)> next;
  std::vector<std::string> names;
  std::optional<ex::llama_model> model;
  std::optional<trace_file> tf;
  std::vector<ex::eval_item> items;
  if (!model_arg.empty()) {
    const std::string dir = resolve_path(model_arg);
    model.emplace(ex::llama_model::load(dir));
    fp = fingerprint_of(*model, dir);
  }
  if (!traces.empty()) {
    tf.emplace(trace_file::open(resolve_path(traces)));
    const auto& m = tf->model;
    if (model) {
      require(m.layers == fp.layers && m.q_heads == fp.q_heads && m.kv_heads == fp.kv_heads &&
                  m.head_dim == fp.head_dim &&
                  (m.config_hash.empty() || m.config_hash == fp.config_hash),
              cmd, "--traces", traces, "a trace recorded on --model " + model_arg);
    } else {
      fp = m;
    }
    const int P = limit > 0 ? std::min(limit, tf->prompts) : tf->prompts;
    for (int p = 0; p < P; ++p) names.push_back("trace prompt " + std::to_string(p));
    next = [&](int p) { return tf->prompt(p); };
  } else {
    items = ex::load_eval_jsonl(resolve_path(prompts_arg));
    if (limit > 0 && static_cast<int>(items.size()) > limit) items.resize(limit);
    for (const auto& it : items) names.push_back(it.id);
    next = [&](int p) {
      const auto ids = ex::byte_tokenize(items[static_cast<std::size_t>(p)].prompt);
      return record_prompt(*model, ids, steps, 1);
    };
  }
  require(!names.empty(), cmd, "prompts", 0, "at least one calibration prompt");

  accumulator acc;
  acc.init(fp.layers, fp.kv_heads);
  int min_steps = 1 << 30, max_steps = 0;
  for (std::size_t p = 0; p < names.size(); ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    const prompt_trace tr = next(static_cast<int>(p));
    require(method != "heterocache" || tr.steps >= 1, cmd, names[p] + " steps", tr.steps,
            ">= 1 decode step (stability)");
    profile_prompt(method, tr, acc, sp, hp);
    min_steps = std::min(min_steps, tr.steps);
    max_steps = std::max(max_steps, tr.steps);
    std::fprintf(stderr, "calibrate %s: prompt %zu/%zu %s (n=%d, %d decode steps) %.2f s\n",
                 method.c_str(), p + 1, names.size(), names[p].c_str(), tr.n, tr.steps,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }

  const int H = fp.kv_heads;
  nlohmann::json params = {
      {"prompts", acc.prompts},
      {"prompts_file",
       traces.empty() ? std::filesystem::path(prompts_arg).filename().string() : std::string()},
      {"traces_file",
       traces.empty() ? std::string() : std::filesystem::path(traces).filename().string()},
      {"decode_steps", traces.empty() ? steps : max_steps},  // asked for (--steps), or traced
      {"decode_steps_range", {min_steps, max_steps}},
      {"combine", "mean over prompts of the per-prompt matrices"}};
  if (method == "synckv") {
    params["clusters"] = sp.clusters;
    params["max_iter"] = 100;
    params["topk"] = sp.topk > 0 ? nlohmann::json(sp.topk) : nlohmann::json("floor(n/5)");
    params["pooling_kernel"] = 1;
    params["gqa"] = "max";
    params["profiled_steps"] = "prefill (last prompt query) and decode steps 1..T";
    cal::synckv_roles r;
    r.model = fp;
    r.parameters = params;
    for (int l = 0; l < fp.layers; ++l) {
      const auto S = acc.mean(acc.sim[static_cast<std::size_t>(l)]);
      const auto km = cal::kmeans_roles(S, H, {.clusters = sp.clusters, .max_iter = 100});
      r.layers.push_back({km.assign, km.representative, S});
    }
    cal::write_roles(out, r);
    (void)cal::read_synckv_roles(out, fp);  // what was written reads back and matches
    print_synckv(r);
  } else {
    params["tau_sim"] = hp.tau_sim;
    params["tau_stable"] = hp.tau_stable;
    params["pooling_kernel"] = hp.kernel;
    params["pooling"] = "avg";
    params["gqa"] = "mean";
    params["topk"] = "min(1024, floor(n/5))";
    cal::heterocache_roles r;
    r.model = fp;
    r.parameters = params;
    for (int l = 0; l < fp.layers; ++l) {
      const auto S = acc.mean(acc.sim[static_cast<std::size_t>(l)]);
      const auto s = acc.mean(acc.stab[static_cast<std::size_t>(l)]);
      const auto sc = cal::star_cluster(S, s, {.tau_sim = hp.tau_sim, .tau_stable = hp.tau_stable});
      r.layers.push_back({sc.roles, sc.leader, s, S});
    }
    cal::write_roles(out, r);
    (void)cal::read_heterocache_roles(out, fp);
    print_heterocache(r);
  }
  std::printf("wrote %s (%s, %d prompts)\n", out.c_str(), method.c_str(), acc.prompts);
  return 0;
}

}  // namespace kvsift::cli
