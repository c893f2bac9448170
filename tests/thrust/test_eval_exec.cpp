// SPDX-License-Identifier: Apache-2.0
// End to end on the shipped models: the example engine (examples/engine/llama.hpp) decoding
// through kvsift_cache gives the same answers, the same resident KV and the same attended tokens
// whether each of the eleven methods (SyncKV and HeteroCache with the model's shipped roles) runs
// on exec::host (the default registry) or over device memory on this build's simulated device
// (device::method_registry_on, what `kvsift eval --exec thrust-cpp|thrust-omp` runs). A few
// protocol-v2 prompts per model (the shortest of each task), budget 0.25 matched as the resident
// share, as `kvsift eval` does by default; SyncKV at 0.625 (above its representatives' share),
// FreeKV at 0.5 (its dense first layer keeps the whole prompt), HeteroCache at 0.8 on recall-8kv
// only (its volatile and pivot heads keep their whole KV: 22 of 32 heads there; every head of
// tiny-recall is volatile, so nothing is compressed and it is left out there). And under
// `--far attend`: the three two-tier methods on recall-8kv, the host's answers and far rows over
// device memory, nothing recalled on either exec.

#include "../../examples/engine/eval_harness.hpp"
#include "../../examples/engine/kvsift_cache.hpp"
#include "../../examples/engine/llama.hpp"
#include "../plan_reads.hpp"

#include <kvsift/calibrate/roles_file.hpp>
#include <kvsift/device/erased.hpp>
#include <kvsift/thrust/exec.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

namespace {

namespace ex = kvsift::examples;
namespace fs = std::filesystem;
const fs::path source_dir = KVSIFT_SOURCE_DIR;

#if defined(_OPENMP)
using device_execs = std::tuple<kvsift::exec::sim_cpp, kvsift::exec::sim_omp>;
#else
using device_execs = std::tuple<kvsift::exec::sim_cpp>;
#endif

// The shortest prompt of each task in `files`.
std::vector<ex::eval_item> shortest_prompts(const std::vector<fs::path>& files) {
  std::vector<ex::eval_item> out;
  for (const auto& f : files) {
    auto items = ex::load_eval_jsonl(f.string());
    REQUIRE(!items.empty());
    out.push_back(*std::min_element(items.begin(), items.end(), [](const auto& a, const auto& b) {
      return a.prompt.size() < b.prompt.size();
    }));
  }
  return out;
}

// The model's shipped head roles, as `kvsift eval` gives them to SyncKV and HeteroCache.
struct shipped_roles {
  std::vector<kvsift::select::cluster_roles> synckv;
  std::vector<kvsift::method_config::heterocache_layer> heterocache;
  void apply(kvsift::method_config& c) const {
    c.synckv_roles = synckv;
    c.heterocache_roles = heterocache;
  }
  static shipped_roles of(const fs::path& model_dir, const ex::llama_model& model) {
    const auto& cfg = model.config();
    const kvsift::calibrate::model_fingerprint fp{
        .layers = cfg.num_layers, .q_heads = cfg.num_q_heads, .kv_heads = cfg.num_kv_heads,
        .head_dim = cfg.head_dim, .config_hash = ""};
    return {kvsift::synckv_roles_of(
                kvsift::calibrate::read_synckv_roles((model_dir / "roles-synckv.json").string(), fp)),
            kvsift::heterocache_roles_of(kvsift::calibrate::read_heterocache_roles(
                (model_dir / "roles-heterocache.json").string(), fp))};
  }
};

// `base` with SyncKV's and HeteroCache's entries given `roles`.
kvsift::method_registry<float> with_roles(const kvsift::method_registry<float>& base,
                                          const shipped_roles& roles) {
  kvsift::method_registry<float> out;
  for (const auto& name : base.names()) {
    auto e = base.at(name);
    if (name == "synckv" || name == "heterocache") {
      e.make = [make = e.make, roles](kvsift::method_config c) {
        roles.apply(c);
        return make(c);
      };
      e.for_resident_fraction = [hook = e.for_resident_fraction, roles](kvsift::method_config c, double f) {
        roles.apply(c);
        return hook(std::move(c), f);
      };
    }
    out.add(std::move(e));
  }
  return out;
}

// The resident share each method is compared at (see the file comment).
double fraction_of(const std::string& name) {
  if (name == "synckv") return 0.625;
  if (name == "freekv") return 0.5;
  if (name == "heterocache") return 0.8;
  return 0.25;
}

template <class E>
void same_answers(const fs::path& model_dir, const std::vector<fs::path>& prompt_files,
                  bool with_heterocache) {
  const auto model = ex::llama_model::load(model_dir.string());
  const auto items = shortest_prompts(prompt_files);
  const auto roles = shipped_roles::of(model_dir, model);
  const auto host = with_roles(kvsift::default_method_registry<float>(), roles);
  const auto device = with_roles(
      kvsift::device::method_registry_on<float, E>(kvsift::default_method_registry<float>()), roles);
  auto names = kvsift::method_names();
  names.insert(names.end(), {"synckv", "freekv"});
  if (with_heterocache) names.emplace_back("heterocache");
  REQUIRE(names.size() == (with_heterocache ? 11u : 10u));
  for (const auto& name : names) {
    const auto options = [&](const kvsift::method_registry<float>& r) {
      return ex::cache_options{.keep_fraction = std::nullopt, .roles_file = {},
                               .match_resident = true, .registry = &r};
    };
    const double fraction = fraction_of(name);
    ex::kvsift_cache on_host(name, fraction, options(host));
    ex::kvsift_cache on_device(name, fraction, options(device));
    for (const auto& item : items) {
      INFO(model_dir.filename().string() << " " << name << " " << item.id << " on " << E::name);
      const auto h = ex::run_item(model, item, on_host);
      const auto d = ex::run_item(model, item, on_device);
      CHECK(d.output == h.output);
      CHECK(d.output.size() == item.answer.size());
      CHECK(on_device.prompt_resident_bytes() == on_host.prompt_resident_bytes());
      CHECK(on_device.stats().resident_bytes == on_host.stats().resident_bytes);
      CHECK(on_device.stats().layer_budgets == on_host.stats().layer_budgets);
      // eval's bytes_recalled: the rows recalls installed, counted alike on every exec
      CHECK(on_device.stats().bytes_transferred == on_host.stats().bytes_transferred);
      CHECK(on_device.stats().refreshes == on_host.stats().refreshes);
      CHECK(on_device.attended_tokens() == on_host.attended_tokens());
      CHECK(on_device.parameter_note() == on_host.parameter_note());
      // the last step's plan: the same positions; a tiered store's slots are its residents in
      // position order on both (the device's physical tier slots stay inside the store)
      REQUIRE(on_host.last_plan() != nullptr);
      REQUIRE(on_device.last_plan() != nullptr);
      CHECK(on_device.last_plan()->positions.values == on_host.last_plan()->positions.values);
      CHECK(on_device.last_plan()->positions.offsets == on_host.last_plan()->positions.offsets);
      if (name == "synckv" || name == "heterocache" || name == "freekv") {
        CHECK(on_device.last_plan()->slots.values == on_host.last_plan()->slots.values);
      }
      if (name == "freekv" || name == "quest") {
        CHECK(on_device.last_plan()->pages.values == on_host.last_plan()->pages.values);
        CHECK(on_device.last_plan()->pages.offsets == on_host.last_plan()->pages.offsets);
      }
      for (int l = 0; l < model.config().num_layers; ++l) {
        for (int kv = 0; kv < model.config().num_kv_heads; ++kv) {
          CHECK(on_device.kept_tokens(l, kv) == on_host.kept_tokens(l, kv));
        }
      }
      // the host path must not be trivially satisfied: a compressing method keeps less
      if (name != "full_kv" && name != "quest") {
        CHECK(on_host.prompt_resident_bytes() <
              static_cast<std::int64_t>(h.prompt_len) * model.config().num_layers *
                  model.config().num_kv_heads * model.config().head_dim * 2 *
                  static_cast<std::int64_t>(sizeof(float)));
      }
    }
  }
}

// `kvsift eval --far attend --exec thrust-*`: the two-tier methods under far_tier::attend give the
// host's answers over device memory, recall nothing on either exec, count the same far rows and
// resident bytes, and read the same rows at the last step (the device plan lists the far rows
// the host keeps apart).
template <class E>
void same_answers_far(const fs::path& model_dir, const std::vector<fs::path>& prompt_files) {
  const auto model = ex::llama_model::load(model_dir.string());
  const auto items = shortest_prompts(prompt_files);
  const auto roles = shipped_roles::of(model_dir, model);
  constexpr auto attend = kvsift::far_tier::attend;
  const auto host = kvsift::method_registry_far<float>(
      with_roles(kvsift::default_method_registry<float>(), roles), attend);
  const auto device = kvsift::method_registry_far<float>(
      with_roles(kvsift::device::method_registry_on<float, E>(kvsift::default_method_registry<float>()),
                 roles),
      attend);
  std::int64_t far_rows = 0;
  for (const std::string name : {"synckv", "heterocache", "freekv"}) {
    const auto options = [&](const kvsift::method_registry<float>& r) {
      return ex::cache_options{.keep_fraction = std::nullopt, .roles_file = {},
                               .match_resident = true, .registry = &r};
    };
    ex::kvsift_cache on_host(name, fraction_of(name), options(host));
    ex::kvsift_cache on_device(name, fraction_of(name), options(device));
    for (const auto& item : items) {
      INFO(model_dir.filename().string() << " " << name << " " << item.id << " on " << E::name);
      const auto h = ex::run_item(model, item, on_host);
      const auto d = ex::run_item(model, item, on_device);
      CHECK(d.output == h.output);
      CHECK(on_host.stats().bytes_transferred == 0);
      CHECK(on_device.stats().bytes_transferred == 0);
      CHECK(on_device.stats().far_rows == on_host.stats().far_rows);
      CHECK(on_device.stats().refreshes == on_host.stats().refreshes);
      CHECK(on_device.attended_tokens() == on_host.attended_tokens());
      // resident as the host counts it: a far row's tier slot holds no bytes
      CHECK(on_device.prompt_resident_bytes() == on_host.prompt_resident_bytes());
      CHECK(on_device.stats().resident_bytes == on_host.stats().resident_bytes);
      far_rows += on_host.stats().far_rows;
      REQUIRE(on_host.last_plan() != nullptr);
      REQUIRE(on_device.last_plan() != nullptr);
      const auto want = kvsift_test::reads_of(*on_host.last_plan());
      CHECK(on_device.last_plan()->positions.values == want.positions);
      CHECK(on_device.last_plan()->positions.offsets == want.offsets);
      // the working set as the host holds it, far rows left out (eval's kept_tokens reads it):
      // every head's length, and the last layer's positions
      const auto sh = on_host.method().shape();
      for (int l = 0; l < sh.layers; ++l) {
        for (int h = 0; h < sh.kv_heads; ++h) {
          const auto seq = sh.sequence(0, l, h);
          const int n = on_host.method().length(seq);
          REQUIRE(on_device.method().length(seq) == n);
          CHECK(on_device.kept_tokens(l, h) == on_host.kept_tokens(l, h));
          if (l + 1 < sh.layers) continue;
          for (int i = 0; i < n; ++i) {
            CHECK(on_device.method().position(seq, i) == on_host.method().position(seq, i));
          }
        }
      }
    }
  }
  CHECK(far_rows > 0);  // the case reads rows where they lie
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("eval --exec: tiny-recall answers on the simulated device equal the host's",
                        "[thrust][device][eval]", device_execs) {
  same_answers<TestType>(source_dir / "data/tiny-recall",
                         {source_dir / "data/eval/passkey.jsonl", source_dir / "data/eval/chain.jsonl"},
                         /*with_heterocache=*/false);
}

TEMPLATE_LIST_TEST_CASE("eval --exec: recall-8kv answers on the simulated device equal the host's",
                        "[thrust][device][eval]", device_execs) {
  same_answers<TestType>(source_dir / "data/recall-8kv",
                         {source_dir / "data/eval/recall-8kv/passkey.jsonl",
                          source_dir / "data/eval/recall-8kv/chain.jsonl"},
                         /*with_heterocache=*/true);
}

TEMPLATE_LIST_TEST_CASE("eval --far attend --exec: recall-8kv's two-tier answers on the simulated device "
                        "equal the host's",
                        "[thrust][device][eval][far_tier]", device_execs) {
  same_answers_far<TestType>(source_dir / "data/recall-8kv",
                             {source_dir / "data/eval/recall-8kv/passkey.jsonl",
                              source_dir / "data/eval/recall-8kv/chain.jsonl"});
}

TEMPLATE_LIST_TEST_CASE("eval --exec: the device registry builds every built-in method and refuses others",
                        "[thrust][device][eval]", device_execs) {
  auto host = kvsift::default_method_registry<float>();
  host.add({"mine", [](const kvsift::method_config& c) {
              return kvsift::default_method_registry<float>().make("snapkv", c);
            }, {}});
  const auto device = kvsift::device::method_registry_on<float, TestType>(host);
  REQUIRE(device.names() == host.names());
  kvsift::method_config c;
  c.shape = {.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 16};
  c.capacity = 128;
  c.prompt_len = 64;
  c.budget = 48;                          // above PyramidKV's and SnapKV's window of 32
  c.options["memory_fraction"] = 0.75;  // SyncKV: above its representatives' share (2 of 4)
  c.synckv_roles.assign(2, kvsift::select::cluster_roles{{0, 0}, {0}});
  c.heterocache_roles.assign(2, kvsift::method_config::heterocache_layer{
                                    {kvsift::calibrate::head_role::pivot,
                                     kvsift::calibrate::head_role::satellite},
                                    {0, 0}, {1.0f, 1.0f}});
  for (const auto& name : host.names()) {
    if (name == "mine") continue;
    INFO(name);
    const auto m = device.make(name, c);
    REQUIRE(m != nullptr);
    CHECK(m->name() == name);
    CHECK_FALSE(m->contiguous_rows(0));  // device memory: read through attend()
  }
  REQUIRE_THROWS_WITH(device.make("mine", c),
                      Catch::Matchers::ContainsSubstring("'name' = mine") &&
                          Catch::Matchers::ContainsSubstring("no device composition"));
}
