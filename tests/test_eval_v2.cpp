// SPDX-License-Identifier: Apache-2.0
// Evaluation protocol v2 and the CLI inputs around it (issue 27; issue 26 items 12 and 13):
// a calibration trace whose metadata names an impossible model shape is rejected when it is
// opened (it divided by zero in profiling), `kvsift eval --roles FILE` refuses a file that does
// not parse or whose "method" is not a string instead of falling back to the shipped roles.

#include "../examples/engine/eval_harness.hpp"
#include "../examples/kvsift/calibration_profile.hpp"
#include "../examples/kvsift/calibration_trace.hpp"
#include "../examples/kvsift/roles_choice.hpp"

#include <kvsift/core/error.hpp>
#include <kvsift/io/safetensors.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::ContainsSubstring;

const fs::path source_dir = KVSIFT_SOURCE_DIR;

fs::path scratch(const std::string& name) {
  const auto dir = fs::temp_directory_path() / "kvsift-test-eval-v2";
  fs::create_directories(dir);
  return dir / name;
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::trunc);
  out << text;
}

const fs::path shared_dir = KVSIFT_SHARED_DIR;
namespace ex = kvsift::examples;

// The evaluation prompt files: the shipped ones and, where the shared folder is beside the
// repository, every file under shared/eval/ (v1 and v2, all prompts) but the calibration sets.
std::vector<fs::path> evaluation_files() {
  std::vector<fs::path> files{source_dir / "data/eval/passkey.jsonl",
                              source_dir / "data/eval/chain.jsonl",
                              source_dir / "data/eval/recall-8kv/passkey.jsonl",
                              source_dir / "data/eval/recall-8kv/chain.jsonl"};
  if (fs::is_directory(shared_dir / "eval")) {
    for (const auto& e : fs::recursive_directory_iterator(shared_dir / "eval")) {
      const auto name = e.path().filename().string();
      if (e.is_regular_file() && e.path().extension() == ".jsonl" &&
          name.rfind("calibration", 0) != 0) {
        files.push_back(e.path());
      }
    }
  }
  return files;
}

// "K7" of a chain prompt ending "Follow K7: " (v2) or "Follow K7:" (v1).
std::string chain_start(const std::string& prompt) {
  static const std::regex re("Follow ([A-Z][0-9]): ?$");
  std::smatch m;
  return std::regex_search(prompt, m, re) ? m[1].str() : std::string();
}

std::string trim(std::string s) {
  while (!s.empty() && s.front() == ' ') s.erase(s.begin());
  return s;
}

// A one-prompt calibration trace (n = 3 tokens, W = 2, T = 1) of a model with the given shape;
// the metadata's kv_heads may differ from the tensors' (what a corrupt or hand-made file holds).
void write_trace(const fs::path& p, int q_heads, int kv_heads_tensors,
                 const std::string& kv_heads_metadata) {
  kvsift::cli::prompt_trace t;
  t.shape = {1, q_heads, kv_heads_tensors, 2};
  t.n = 3;
  t.window = 2;
  t.steps = 1;
  t.ids = {1, 2, 3, 4};
  const auto kv = static_cast<std::size_t>(t.tokens()) * kv_heads_tensors * 2;
  t.keys.assign(kv, 0.25f);
  t.values.assign(kv, 0.5f);
  t.queries.assign(static_cast<std::size_t>(t.window + t.steps) * q_heads * 2, 1.0f);
  kvsift::io::tensor_map m;
  kvsift::cli::add_trace(m, 0, t);
  kvsift::calibrate::model_fingerprint fp{1, q_heads, kv_heads_tensors, 2, ""};
  auto md = kvsift::cli::trace_metadata(fp, 1);
  md["kv_heads"] = kv_heads_metadata;
  kvsift::io::write_safetensors(p.string(), m, md);
}

}  // namespace

TEST_CASE("calibration trace: kv_heads = 0 or not dividing q_heads is rejected on open",
          "[eval_v2][calibrate]") {
  SECTION("a valid trace opens and profiles") {
    const auto p = scratch("trace-ok.safetensors");
    write_trace(p, 2, 1, "1");
    const auto f = kvsift::cli::trace_file::open(p.string());
    REQUIRE(f.model.kv_heads == 1);
    kvsift::cli::accumulator acc;
    acc.init(f.model.layers, f.model.kv_heads);
    kvsift::cli::profile_prompt("synckv", f.prompt(0), acc, {}, {});
    REQUIRE(acc.prompts == 1);
  }
  SECTION("kv_heads = 0 (profiling divided q_heads by it)") {
    const auto p = scratch("trace-kv0.safetensors");
    write_trace(p, 2, 0, "0");
    REQUIRE_THROWS_AS(kvsift::cli::trace_file::open(p.string()), kvsift::error);
    REQUIRE_THROWS_WITH(kvsift::cli::trace_file::open(p.string()),
                        ContainsSubstring("'__metadata__.kv_heads' = 0") &&
                            ContainsSubstring(">= 1"));
  }
  SECTION("q_heads not a multiple of kv_heads") {
    const auto p = scratch("trace-kv3.safetensors");
    write_trace(p, 2, 3, "3");
    REQUIRE_THROWS_WITH(kvsift::cli::trace_file::open(p.string()),
                        ContainsSubstring("kv_heads") && ContainsSubstring("divides q_heads"));
  }
}

TEST_CASE("kvsift eval --roles: a file that does not parse is an error, not a fallback",
          "[eval_v2]") {
  const std::string model = (source_dir / "data" / "recall-8kv").string();
  SECTION("not JSON: no silent fallback to the model's shipped roles") {
    const auto p = scratch("roles-broken.json");
    write_text(p, "{\"method\": \"synckv\", \"layers\": [");
    REQUIRE_THROWS_AS(kvsift::cli::roles_path(model, p.string(), "synckv"), kvsift::error);
    REQUIRE_THROWS_WITH(kvsift::cli::roles_path(model, p.string(), "heterocache"),
                        ContainsSubstring("--roles") && ContainsSubstring(p.string()) &&
                            ContainsSubstring("JSON"));
  }
  SECTION("\"method\" that is not a string: a clear message, not a JSON type error") {
    const auto p = scratch("roles-method-number.json");
    write_text(p, "{\"method\": 5, \"layers\": []}");
    REQUIRE_THROWS_AS(kvsift::cli::roles_path(model, p.string(), "synckv"), kvsift::error);
    REQUIRE_THROWS_WITH(kvsift::cli::roles_path(model, p.string(), "synckv"),
                        ContainsSubstring("method") && ContainsSubstring("5") &&
                            ContainsSubstring("\"synckv\" or \"heterocache\""));
  }
  SECTION("a valid file is taken for its method; the other method keeps the shipped roles") {
    const auto p = scratch("roles-ok.json");
    write_text(p, "{\"method\": \"heterocache\", \"layers\": []}");
    REQUIRE(kvsift::cli::roles_path(model, p.string(), "heterocache") == p.string());
    REQUIRE(kvsift::cli::roles_path(model, p.string(), "synckv") ==
            (fs::path(model) / "roles-synckv.json").string());
  }
}

TEST_CASE("data/ ships only protocol-v2 prompts: the separator space ends the prompt",
          "[eval_v2]") {
  for (const char* f : {"data/eval/passkey.jsonl", "data/eval/chain.jsonl",
                        "data/eval/calibration.jsonl", "data/eval/recall-8kv/passkey.jsonl",
                        "data/eval/recall-8kv/chain.jsonl", "data/eval/recall-8kv/calibration.jsonl"}) {
    const auto items = ex::load_eval_jsonl((source_dir / f).string());
    REQUIRE(!items.empty());
    for (const auto& it : items) {
      CAPTURE(f, it.id);
      REQUIRE(!it.prompt.empty());
      REQUIRE(!it.answer.empty());
      CHECK(it.prompt.back() == ' ');
      CHECK(it.answer.front() != ' ');
      CHECK(static_cast<int>(it.prompt.size() + it.answer.size()) == it.context_len);
      if (it.task == "passkey") {
        CHECK(it.prompt.ends_with(" What is the pass key? The pass key is "));
        CHECK(it.prompt.find("The pass key is " + it.answer.substr(0, it.answer.size() - 1) +
                             ". Remember it. ") != std::string::npos);
      } else {
        REQUIRE(it.task == "chain");
        CHECK(!chain_start(it.prompt).empty());
      }
    }
  }
}

TEST_CASE("tiny-recall's calibration prompts are disjoint from every evaluation prompt",
          "[eval_v2][calibrate]") {
  const auto cal = ex::load_eval_jsonl((source_dir / "data/eval/calibration.jsonl").string());
  REQUIRE(cal.size() == 24);
  std::set<std::string> ids;
  int passkeys = 0;
  for (const auto& c : cal) {
    ids.insert(c.id);
    passkeys += c.task == "passkey" ? 1 : 0;
    CHECK(c.prompt.find('\x02') == std::string::npos);  // tiny-recall has no BOS byte
  }
  CHECK(ids.size() == cal.size());
  CHECK(passkeys == 12);
  // what the evaluation prompts use: ids, prompts, passkeys, chain targets, 64-byte windows
  constexpr std::size_t window = 64;
  std::vector<ex::eval_item> eval;
  for (const auto& f : evaluation_files()) {
    auto part = ex::load_eval_jsonl(f.string());
    eval.insert(eval.end(), part.begin(), part.end());
  }
  REQUIRE(eval.size() >= 96);
  std::set<std::string> eval_ids, eval_prompts, eval_keys, eval_targets;
  std::unordered_set<std::string_view> eval_windows;
  for (const auto& e : eval) {
    eval_ids.insert(e.id);
    eval_prompts.insert(e.prompt);
    if (e.task == "passkey") eval_keys.insert(trim(e.answer));
    if (e.task == "chain") eval_targets.insert(chain_start(e.prompt) + " " + trim(e.answer));
    for (std::size_t i = 0; i + window <= e.prompt.size(); ++i) {
      eval_windows.insert(std::string_view(e.prompt).substr(i, window));
    }
  }
  for (const auto& c : cal) {
    CAPTURE(c.id);
    CHECK(eval_ids.count(c.id) == 0);
    CHECK(eval_prompts.count(c.prompt) == 0);
    if (c.task == "passkey") CHECK(eval_keys.count(trim(c.answer)) == 0);
    if (c.task == "chain") CHECK(eval_targets.count(chain_start(c.prompt) + " " + trim(c.answer)) == 0);
    std::size_t shared_windows = 0;
    for (std::size_t i = 0; i + window <= c.prompt.size(); ++i) {
      shared_windows += eval_windows.count(std::string_view(c.prompt).substr(i, window));
    }
    CHECK(shared_windows == 0);
  }
  // and the check can fail: an evaluation prompt is not disjoint from itself
  std::size_t self = 0;
  for (std::size_t i = 0; i + window <= eval.front().prompt.size(); ++i) {
    self += eval_windows.count(std::string_view(eval.front().prompt).substr(i, window));
  }
  CHECK(self > 0);
}
