// SPDX-License-Identifier: Apache-2.0
// kvsift trace: records what offline calibration needs from the example engine: each prompt is
// prefilled, then T greedy decode steps run under full attention, and per layer the prompt's
// keys and values, its last W queries, and every decode step's q, k, v are written to one
// safetensors file (schema in calibration_trace.hpp and docs/calibration.md).
//
//   kvsift trace --model DIR --prompts FILE.jsonl [--steps T] [--window W] [--limit N]
//                --out FILE.safetensors

#include "calibration_trace.hpp"
#include "commands.hpp"

#include "engine/eval_harness.hpp"
#include "engine/llama.hpp"

#include <kvsift/core/error.hpp>
#include <kvsift/io/safetensors.hpp>

#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

namespace kvsift::cli {

int trace_prompts(const std::vector<std::string>& args) {
  namespace ex = kvsift::examples;
  const std::string cmd = "kvsift trace";
  if (flag(args, "--help") || flag(args, "-h")) {
    std::puts(
        "usage: kvsift trace --model DIR --prompts FILE.jsonl [--steps T] [--window W]\n"
        "                    [--limit N] --out FILE.safetensors\n"
        "  Runs each prompt (JSONL with a \"prompt\" field, byte tokens) through the example\n"
        "  engine: prefill, then T greedy decode steps (default 8, fewer where the model's\n"
        "  max_position_embeddings ends). Writes per prompt and layer the keys and values of\n"
        "  every token, the last W prefill queries (default 32) and each step's query\n"
        "  (docs/calibration.md). --limit N: the first N prompts only.");
    return 0;
  }
  static const std::set<std::string> known = {"--model", "--prompts", "--steps",
                                              "--window", "--limit", "--out"};
  for (std::size_t i = 0; i < args.size(); i += 2) {
    require(known.count(args[i]) > 0 && i + 1 < args.size(), cmd, "argument", args[i],
            "one of --model --prompts --steps --window --limit --out, each with a value");
  }
  const std::string model_dir = resolve_path(option(args, "--model", ""));
  const std::string prompts = resolve_path(option(args, "--prompts", ""));
  const std::string out = option(args, "--out", "");
  require(!option(args, "--model", "").empty(), cmd, "--model", "missing", "a model directory");
  require(!prompts.empty(), cmd, "--prompts", "missing", "a JSONL file");
  require(!out.empty(), cmd, "--out", "missing", "an output .safetensors path");
  const int steps = int_option(cmd, "--steps", option(args, "--steps", "8"));
  const int window = int_option(cmd, "--window", option(args, "--window", "32"));
  const int limit = int_option(cmd, "--limit", option(args, "--limit", "0"));
  require(window >= 1, cmd, "--window", window, ">= 1");

  const auto model = ex::llama_model::load(model_dir);
  const auto fp = fingerprint_of(model, model_dir);
  auto items = ex::load_eval_jsonl(prompts);
  if (limit > 0 && static_cast<int>(items.size()) > limit) items.resize(limit);
  require(!items.empty(), cmd, "--prompts", prompts, "at least one prompt");
  io::tensor_map tensors;
  for (std::size_t p = 0; p < items.size(); ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = ex::byte_tokenize(items[p].prompt);
    const auto tr = record_prompt(model, ids, steps, window);
    add_trace(tensors, static_cast<int>(p), tr);
    std::fprintf(stderr, "trace: prompt %zu/%zu %s (n=%d, %d steps) %.2f s\n", p + 1,
                 items.size(), items[p].id.c_str(), tr.n, tr.steps,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  io::write_safetensors(out, tensors, trace_metadata(fp, static_cast<int>(items.size())));
  std::printf("wrote %s: %zu prompts, %d layers, %d KV heads\n", out.c_str(), items.size(),
              fp.layers, fp.kv_heads);
  return 0;
}

}  // namespace kvsift::cli
