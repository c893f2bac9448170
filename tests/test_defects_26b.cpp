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

}  // namespace

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
