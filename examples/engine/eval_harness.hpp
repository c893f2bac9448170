// SPDX-License-Identifier: Apache-2.0
#pragma once

// Evaluation of a KV cache on tiny-recall's tasks (data/eval/*.jsonl, shared/eval/*.jsonl):
// each prompt is prefilled under full attention, then len(answer) bytes are decoded greedily
// through the cache under test and scored as the tiny-recall README says:
//   - exact match of the whole answer (passkey and chain);
//   - chain hop accuracy: hops right before the first wrong one, over the answer's hops (hop i is
//     the i-th space-separated name of " H3 G6 O2.", the final '.' ignored);
//   - time: prefill seconds and decode milliseconds per decoded token.
//
//   auto items = kvsift::examples::load_eval_jsonl("data/eval/chain.jsonl");
//   kvsift::examples::full_cache cache;
//   auto results = kvsift::examples::run_eval(model, items, cache);
//   std::cout << kvsift::examples::format_summary(kvsift::examples::summarize(results));

#include "llama.hpp"

#include <kvsift/core/error.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift::examples {

// One line of an eval JSONL file.
struct eval_item {
  std::string id;
  std::string task;    // "passkey" or "chain"
  std::string prompt;  // bytes = token ids
  std::string answer;  // expected continuation, e.g. " 48213." or " Q2 M9 Z4."
  int context_len = 0; // bytes of prompt + answer
  double depth = 0.0;  // relative depth of the needle / first hop
  nlohmann::json raw;  // the whole line (hop_depths, ...)
};

// Reads a JSONL file of eval items; throws kvsift::error naming the file and line for anything
// malformed.
[[nodiscard]] inline std::vector<eval_item> load_eval_jsonl(const std::string& path) {
  std::ifstream in(path);
  require(static_cast<bool>(in), "examples::load_eval_jsonl", "path", path, "a readable file");
  std::vector<eval_item> items;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      continue;
    }
    const std::string where = "examples::load_eval_jsonl of " + path;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw make_error(where, "line " + std::to_string(lineno), e.what(), "a JSON object");
    }
    const bool ok = j.is_object() && j.contains("id") && j["id"].is_string() &&
                    j.contains("task") && j["task"].is_string() && j.contains("prompt") &&
                    j["prompt"].is_string() && j.contains("answer") && j["answer"].is_string();
    require(ok, where, "line " + std::to_string(lineno), line.substr(0, 80),
            "an object with string fields id, task, prompt, answer");
    eval_item it;
    it.id = j["id"].get<std::string>();
    it.task = j["task"].get<std::string>();
    it.prompt = j["prompt"].get<std::string>();
    it.answer = j["answer"].get<std::string>();
    // Optional fields are checked before conversion: a string would throw nlohmann's type_error
    // and a float past INT_MAX would be undefined behaviour in the conversion (fuzz/regressions).
    const auto optional_ok = [&](const char* key, bool ok, const char* expected) {
      require(!j.contains(key) || ok, where, "line " + std::to_string(lineno) + " " + key,
              j.contains(key) ? j[key].dump() : std::string(), expected);
    };
    optional_ok("context_len",
                j.contains("context_len") && j["context_len"].is_number_integer() &&
                    j["context_len"].get<std::int64_t>() >= 0 &&
                    j["context_len"].get<std::int64_t>() <= std::numeric_limits<int>::max(),
                "a non-negative integer that fits int");
    optional_ok("depth", j.contains("depth") && j["depth"].is_number(), "a number");
    it.context_len = j.value("context_len", static_cast<int>(it.prompt.size() + it.answer.size()));
    it.depth = j.value("depth", 0.0);
    it.raw = std::move(j);
    items.push_back(std::move(it));
  }
  return items;
}

// The names of a chain answer: " H3 G6 O2." -> {"H3", "G6", "O2"}.
[[nodiscard]] inline std::vector<std::string> chain_hops(std::string_view text) {
  std::vector<std::string> hops;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') {
      ++i;
    }
    const std::size_t j = std::min(text.find(' ', i), text.size());
    if (j > i) {
      std::string w(text.substr(i, j - i));
      if (w.back() == '.') {
        w.pop_back();
      }
      hops.push_back(std::move(w));
    }
    i = j;
  }
  return hops;
}

// Hops of `output` equal to those of `answer` before the first wrong one. A trailing '.' is
// ignored, so only the names count.
[[nodiscard]] inline int hop_count(std::string_view answer, std::string_view output) {
  const auto want = chain_hops(answer);
  const auto got = chain_hops(output);
  int right = 0;
  while (right < static_cast<int>(want.size()) && right < static_cast<int>(got.size()) &&
         want[static_cast<std::size_t>(right)] == got[static_cast<std::size_t>(right)]) {
    ++right;
  }
  return right;
}

struct eval_result {
  std::string id;
  std::string task;
  int context_len = 0;
  int prompt_len = 0;
  std::string answer;
  std::string output;  // the greedy continuation, len(answer) bytes
  bool exact = false;
  int hops_right = 0;  // chains only
  int hops_total = 0;  // chains only
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  int decode_steps = 0;  // len(answer) - 1: the first byte comes from the prefill
};

// Runs one item: prefill under full attention, then greedy decoding through `cache`.
[[nodiscard]] inline eval_result run_item(const llama_model& model, const eval_item& item,
                                          kv_cache& cache) {
  generation_stats st;
  const auto ids = byte_tokenize(item.prompt);
  const auto out = model.generate_greedy(ids, static_cast<int>(item.answer.size()), cache, &st);
  eval_result r;
  r.id = item.id;
  r.task = item.task;
  r.context_len = item.context_len;
  r.prompt_len = static_cast<int>(ids.size());
  r.answer = item.answer;
  r.output = byte_detokenize(out);
  r.exact = r.output == r.answer;
  if (item.task == "chain") {
    r.hops_total = static_cast<int>(chain_hops(item.answer).size());
    r.hops_right = hop_count(item.answer, r.output);
  }
  r.prefill_seconds = st.prefill_seconds;
  r.decode_seconds = st.decode_seconds;
  r.decode_steps = std::max(0, static_cast<int>(item.answer.size()) - 1);
  return r;
}

// Runs every item through the same cache object (cache.start resets it per prompt).
// `progress`, if given, is called after each item.
[[nodiscard]] inline std::vector<eval_result> run_eval(
    const llama_model& model, const std::vector<eval_item>& items, kv_cache& cache,
    const std::function<void(const eval_result&, std::size_t done)>& progress = {}) {
  std::vector<eval_result> results;
  results.reserve(items.size());
  for (const auto& it : items) {
    results.push_back(run_item(model, it, cache));
    if (progress) {
      progress(results.back(), results.size());
    }
  }
  return results;
}

// Accuracy and time of a group of results (one task, one context length or all = 0).
struct eval_summary {
  std::string task;
  int context_len = 0;  // 0: all lengths
  int n = 0;
  double exact = 0.0;         // share of exact answers
  double hop_accuracy = 0.0;  // chains: mean over prompts of hops_right / hops_total
  double mean_prefill_seconds = 0.0;
  double decode_ms_per_token = 0.0;  // decode time / decode steps
  double mean_prompt_len = 0.0;
};

[[nodiscard]] inline std::vector<eval_summary> summarize(const std::vector<eval_result>& results) {
  std::map<std::pair<std::string, int>, std::vector<const eval_result*>> groups;
  for (const auto& r : results) {
    groups[{r.task, r.context_len}].push_back(&r);
    groups[{r.task, 0}].push_back(&r);
  }
  std::vector<eval_summary> out;
  for (const auto& [key, rs] : groups) {
    eval_summary s;
    s.task = key.first;
    s.context_len = key.second;
    s.n = static_cast<int>(rs.size());
    double decode_s = 0.0;
    long steps = 0;
    for (const auto* r : rs) {
      s.exact += r->exact ? 1.0 : 0.0;
      s.hop_accuracy += r->hops_total ? static_cast<double>(r->hops_right) / r->hops_total : 0.0;
      s.mean_prefill_seconds += r->prefill_seconds;
      s.mean_prompt_len += r->prompt_len;
      decode_s += r->decode_seconds;
      steps += r->decode_steps;
    }
    s.exact /= s.n;
    s.hop_accuracy /= s.n;
    s.mean_prefill_seconds /= s.n;
    s.mean_prompt_len /= s.n;
    s.decode_ms_per_token = steps ? 1e3 * decode_s / static_cast<double>(steps) : 0.0;
    out.push_back(s);
  }
  // per task: context lengths ascending, then "all"
  std::stable_sort(out.begin(), out.end(), [](const eval_summary& a, const eval_summary& b) {
    if (a.task != b.task) {
      return a.task > b.task;  // passkey before chain
    }
    const int ka = a.context_len == 0 ? INT32_MAX : a.context_len;
    const int kb = b.context_len == 0 ? INT32_MAX : b.context_len;
    return ka < kb;
  });
  return out;
}

// A plain-text table of summaries.
[[nodiscard]] inline std::string format_summary(const std::vector<eval_summary>& rows) {
  std::string s = "task     context    n   exact   hops  prefill_s  decode_ms/tok\n";
  char buf[160];
  for (const auto& r : rows) {
    const std::string ctx = r.context_len ? std::to_string(r.context_len) : "all";
    const std::string hops =
        r.task == "chain" ? std::to_string(static_cast<int>(r.hop_accuracy * 100 + 0.5)) + "%"
                          : "-";
    std::snprintf(buf, sizeof buf, "%-8s %7s %4d %6.0f%% %6s %10.3f %14.3f\n", r.task.c_str(),
                  ctx.c_str(), r.n, r.exact * 100, hops.c_str(), r.mean_prefill_seconds,
                  r.decode_ms_per_token);
    s += buf;
  }
  return s;
}

}  // namespace kvsift::examples
