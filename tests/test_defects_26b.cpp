// SPDX-License-Identifier: Apache-2.0
// Regression tests for issue 26, items 9, 10, 11 (host side) and 14; item 11's Thrust side is in
// tests/thrust/test_thrust_defects_26b.cpp (CPP and OMP systems). Each failed before its fix.
//   9  the registry's integer options: a non-integral or out-of-range value is a kvsift::error
//      naming the option, never a silent truncation (16.5 -> 16) or a cast with undefined result;
//   10 a shape whose store size overflows is a kvsift::error naming the shape, at construction,
//      not a store built over a wrapped (too small) pool;
//   11 the host FlashInfer export checks the page lists' CSR offsets before reading them;
//   14 FreeKV's dense layers: the registry's factory and its resident-fraction hook agree (a
//      one-layer model: the hook sized a layer the factory built dense).

#include <kvsift/method/any_method.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/store/flashinfer.hpp>
#include <kvsift/store/paged.hpp>
#include <kvsift/store/tiered.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace {

using Catch::Matchers::ContainsSubstring;
using kvsift::model_shape;
using view = kvsift::kv_view<const float, kvsift::nhd>;

std::vector<float> wave(std::size_t n, float a, float b = 0.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(a * static_cast<float>(i) + b);
  return v;
}

// The message of the kvsift::error `f` throws ("" when it throws nothing; any other exception
// escapes and fails the test).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kvsift::error& e) {
    return e.what();
  }
  return "";
}

kvsift::method_config freekv_config(model_shape shape, int prompt) {
  kvsift::method_config c;
  c.shape = shape;
  c.capacity = prompt + 16;
  c.prompt_len = prompt;
  c.budget = 64;
  return c;
}

}  // namespace

// ---- 9. integer options -------------------------------------------------------------------

TEST_CASE("registry integer options: non-integral, negative or out-of-range values are errors",
          "[defects][registry][bad_input]") {
  const auto& reg = kvsift::default_method_registry<float>();
  const model_shape shape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 8};

  struct bad_case {
    std::string method, option;
    double value;
    std::string shown;  // the value as the message must show it
  };
  const std::vector<bad_case> cases{
      {"freekv", "page_size", 16.5, "16.5"},        // was truncated to 16
      {"freekv", "page_size", 1e20, "1e+20"},       // out of int: undefined behaviour before
      {"freekv", "page_size", -16.0, "-16"},        // a size is never negative
      {"freekv", "dense_layers", 0.5, "0.5"},       // was truncated to 0
      {"freekv", "dense_layers", -1.0, "-1"},
      {"lagkv", "lag", 31.9, "31.9"},               // was truncated to 31
      {"lagkv", "sink", 3e9, "3e+09"},              // out of int
      {"lagkv", "sink", std::nan(""), "nan"},
  };
  for (const auto& bc : cases) {
    CAPTURE(bc.method, bc.option, bc.value);
    auto c = freekv_config(shape, 64);
    c.options[bc.option] = bc.value;
    const std::string what = error_of([&] { (void)reg.make(bc.method, c); });
    CAPTURE(what);
    REQUIRE_THAT(what, ContainsSubstring("'options." + bc.option + "' = " + bc.shown));
    REQUIRE_THAT(what, ContainsSubstring("expected an integer in ["));
  }

  // the resident-fraction hooks read the same options through the same check
  for (const std::string method : {"freekv", "lagkv"}) {
    CAPTURE(method);
    auto c = freekv_config(shape, 64);
    c.options[method == "freekv" ? "page_size" : "sink"] = 8.25;
    const std::string what =
        error_of([&] { (void)reg.for_resident_fraction(method, c, 0.5); });
    REQUIRE_THAT(what, ContainsSubstring("= 8.25, expected an integer in ["));
  }

  // whole numbers given as doubles (how options arrive) still work
  auto ok = freekv_config(shape, 64);
  ok.options = {{"page_size", 8.0}, {"dense_layers", 1.0}};
  auto m = reg.make("freekv", ok);
  auto* erased = dynamic_cast<kvsift::any_method<kvsift::store::tiered<float>>*>(m.get());
  REQUIRE(erased != nullptr);
  REQUIRE(erased->store().page_size() == 8);
  auto lag = freekv_config(shape, 64);
  lag.options = {{"lag", 16.0}, {"sink", 4.0}};
  REQUIRE(reg.make("lagkv", lag) != nullptr);
}

// ---- 10. store sizes that overflow --------------------------------------------------------

TEST_CASE("stores: a shape whose pool size overflows is an error naming the shape",
          "[defects][stores][bad_input]") {
  SECTION("store::tiered: the host pool product wraps to 0") {
    // pool = requests * layers * pages * kv_heads * 2 * page_size * head_dim
    //      = 1 * 1 * 1 * 2^16 * 2 * 2^30 * 2^17 = 2^64: 0 in std::size_t
    const model_shape huge{.layers = 1, .q_heads = 1 << 16, .kv_heads = 1 << 16,
                           .head_dim = 1 << 17};
    const std::string what =
        error_of([&] { kvsift::store::tiered<float> s(huge, 1, 1, 1 << 30); });
    CAPTURE(what);
    REQUIRE_THAT(what, ContainsSubstring("store::tiered"));
    REQUIRE_THAT(what, ContainsSubstring("argument 'shape' = requests 1, layers 1, kv_heads 65536, "
                                         "head_dim 131072, host_capacity 1, page_size 1073741824"));
    REQUIRE_THAT(what, ContainsSubstring("bytes"));
  }
  SECTION("store::dense: keys and values past any allocation") {
    // 2 sequences x 2^30 slots x (2^31 - 1) floats: past PTRDIFF_MAX bytes (a std::length_error
    // or std::bad_alloc before, not a kvsift::error)
    const model_shape wide{.layers = 2, .q_heads = 1, .kv_heads = 1,
                           .head_dim = std::numeric_limits<int>::max()};
    const std::string what = error_of([&] { kvsift::store::dense<float> s(wide, 1, 1 << 30); });
    CAPTURE(what);
    REQUIRE_THAT(what, ContainsSubstring("store::dense"));
    REQUIRE_THAT(what, ContainsSubstring("argument 'shape' = requests 1, layers 2, kv_heads 1, "
                                         "head_dim 2147483647, capacity 1073741824"));
  }
  SECTION("store::paged: a page pool past any allocation") {
    const model_shape wide{.layers = 1, .q_heads = 1, .kv_heads = 1,
                           .head_dim = std::numeric_limits<int>::max()};
    const std::string what =
        error_of([&] { kvsift::store::paged<float> s(wide, 1, 1 << 14, (1 << 17) - 1); });
    CAPTURE(what);
    REQUIRE_THAT(what, ContainsSubstring("store::paged"));
    REQUIRE_THAT(what, ContainsSubstring("argument 'shape' = requests 1, layers 1, kv_heads 1, "
                                         "head_dim 2147483647, page_size 16384, total_pages 131071"));
  }
  SECTION("basic_store: requests x layers x kv_heads head-sequences past any allocation") {
    const model_shape many{.layers = 1 << 17, .q_heads = 1 << 17, .kv_heads = 1 << 17,
                           .head_dim = 1};
    const int requests = 1 << 30;
    REQUIRE_THAT(error_of([&] { kvsift::store::dense<float> s(many, requests, 1); }),
                 ContainsSubstring("store::dense: argument 'shape' = requests 1073741824, layers "
                                   "131072, kv_heads 131072"));
    REQUIRE_THAT(error_of([&] { kvsift::store::paged<float> s(many, requests, 16, 1); }),
                 ContainsSubstring("store::paged: argument 'shape' = requests 1073741824"));
  }
  SECTION("shapes that fit still build") {
    const model_shape shape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
    kvsift::store::tiered<float> t(shape, 2, 100, 16);
    kvsift::store::dense<float> d(shape, 2, 100);
    kvsift::store::paged<float> p(shape, 2, 16, 40);
    REQUIRE(t.host_capacity() == 100);
    REQUIRE(d.capacity() == 100);
    REQUIRE(p.free_pages() == 40);
  }
}

// ---- 14. FreeKV's dense layers: factory and hook agree ------------------------------------

TEST_CASE("registry freekv: the resident-fraction hook sizes the layers the factory builds",
          "[defects][registry][freekv]") {
  const auto& reg = kvsift::default_method_registry<float>();
  const int n = 512;
  for (const int layers : {1, 2, 4}) {
    for (const double fraction : {0.6, 0.75}) {
      CAPTURE(layers, fraction);
      const model_shape shape{.layers = layers, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
      const auto c = reg.for_resident_fraction("freekv", freekv_config(shape, n), fraction);
      REQUIRE(c.has_value());
      auto m = reg.make("freekv", *c);
      // the layers the factory built sparse carry the hook's budget; a one-layer model has no
      // dense layer (METHODS.md's dense layers [0, 1) leave at least one layer to retrieve)
      const auto budgets = m->stats().layer_budgets;
      REQUIRE(static_cast<int>(budgets.size()) == layers);
      const int dense = layers == 1 ? 0 : 1;
      for (int l = 0; l < layers; ++l) {
        CAPTURE(l);
        REQUIRE(budgets[l] == (l < dense ? -1 : c->budget));
      }
      // and the resident KV right after the prompt is the fraction asked for (within 2%)
      const auto k = wave(static_cast<std::size_t>(n) * 2 * 8, 0.37f);
      const auto v = wave(static_cast<std::size_t>(n) * 2 * 8, 0.23f, 1.0f);
      const auto q = wave(4 * 8, 0.71f, 2.0f);
      for (int l = 0; l < layers; ++l) {
        const kvsift::prefill_chunk<float> chunk{.request = 0,
                                                 .keys = view::contiguous(k.data(), n, 2, 8),
                                                 .values = view::contiguous(v.data(), n, 2, 8),
                                                 .queries = view::contiguous(q.data(), 1, 4, 8),
                                                 .first_position = 0,
                                                 .last = true};
        m->prefill(l, std::span(&chunk, 1));
      }
      const double full = static_cast<double>(layers) * 2 * n * 2 * 8 * sizeof(float);
      CHECK(std::abs(static_cast<double>(m->resident_bytes()) / full - fraction) <= 0.02);
    }
  }
}

TEST_CASE("registry freekv: dense_layers leaves at least one sparse layer",
          "[defects][registry][freekv][bad_input]") {
  const auto& reg = kvsift::default_method_registry<float>();
  const model_shape shape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
  auto c = freekv_config(shape, 64);
  c.options["dense_layers"] = 2;  // every layer dense: nothing to retrieve
  for (const bool hook : {false, true}) {
    CAPTURE(hook);
    const std::string what = error_of([&] {
      if (hook) {
        (void)reg.for_resident_fraction("freekv", c, 0.5);
      } else {
        (void)reg.make("freekv", c);
      }
    });
    CAPTURE(what);
    REQUIRE_THAT(what, ContainsSubstring("'options.dense_layers' = 2, expected an integer in [0, 1]"));
  }
  c.options["dense_layers"] = 0;  // every layer sparse
  const auto sized = reg.for_resident_fraction("freekv", c, 0.5);
  REQUIRE(sized.has_value());
  const auto budgets = reg.make("freekv", *sized)->stats().layer_budgets;
  REQUIRE(budgets == std::vector<int>{sized->budget, sized->budget});
}

// ---- 11 (host side). The FlashInfer export checks the page lists' CSR offsets ----------------

TEST_CASE("flashinfer export: head_pages.pages offsets are checked, nothing exported",
          "[defects][flashinfer][bad_input]") {
  // two entries of a store with pages of 4: entry 0 holds 5 tokens (2 pages), entry 1 3 (1 page)
  kvsift::head_pages hp;
  hp.page_size = 4;
  hp.pages.push_back(std::vector<std::int32_t>{7, 1});
  hp.pages.push_back(std::vector<std::int32_t>{4});
  hp.lengths = {5, 3};
  kvsift::index_sets slots;
  slots.push_back(std::vector<std::int32_t>{0, 4});
  slots.push_back(std::vector<std::int32_t>{2});
  kvsift::index_sets pages;
  pages.push_back(std::vector<std::int32_t>{1});
  pages.push_back(std::vector<std::int32_t>{0});
  REQUIRE(kvsift::flashinfer_tokens(hp, slots).indices == std::vector<std::int32_t>{28, 4, 18});

  struct bad_case {
    std::string what;
    std::vector<std::int32_t> offsets, values;
    std::string message;
  };
  const std::vector<bad_case> cases{
      // entry 0's pages start at 1: the page counts match the lengths, the ids are shifted
      {"offsets[0]", {1, 3, 4}, {0, 7, 1, 4}, "argument 'head_pages.pages.offsets[0]' = 1, expected 0"},
      // offsets end past the page ids: entry 1 read past them before
      {"offsets end", {0, 2, 3}, {7, 1}, "argument 'head_pages.pages.offsets[2]' = 3, expected "
                                         "head_pages.pages.values.size() (2)"},
      {"decreasing", {0, 3, 2}, {7, 1, 4}, "argument 'head_pages.pages.offsets[2]' = 2, expected "
                                           ">= head_pages.pages.offsets[1] (3)"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    auto bad = hp;
    bad.pages.offsets = c.offsets;
    bad.pages.values = c.values;
    REQUIRE_THAT(error_of([&] { (void)kvsift::flashinfer_tokens(bad, slots); }),
                 ContainsSubstring("flashinfer.tokens") && ContainsSubstring(c.message));
    REQUIRE_THAT(error_of([&] { (void)kvsift::flashinfer_pages(bad, pages, 4); }),
                 ContainsSubstring("flashinfer.pages") && ContainsSubstring(c.message));
  }
}
