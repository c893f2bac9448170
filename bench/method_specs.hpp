// SPDX-License-Identifier: Apache-2.0
#pragma once

// The named methods the benchmarks run, each with its paper defaults for a budget in tokens.
//   name             benchmark name component
//   type<Store>      the method alias
//   params<Store>(B) its params for a budget of B tokens per head-sequence
//   budgeted         false: one benchmark per context, the budget is not in the name
//   max_prefill_n / max_decode_n   largest context registered (H2O's prefill is O(n^2 d))

#include <kvsift/kvsift.hpp>

#include <climits>

#if __has_include(<kvsift/method/lagkv.hpp>) && !defined(KVBENCH_NO_LAGKV)
#include <kvsift/method/lagkv.hpp>
#define KVBENCH_HAS_LAGKV 1
#else
#define KVBENCH_HAS_LAGKV 0
#endif
#if __has_include(<kvsift/method/dynamickv.hpp>) && !defined(KVBENCH_NO_DYNAMICKV)
#include <kvsift/method/dynamickv.hpp>
#define KVBENCH_HAS_DYNAMICKV 1
#else
#define KVBENCH_HAS_DYNAMICKV 0
#endif

namespace kvbench {

struct spec_base {
  static constexpr bool budgeted = true;
  static constexpr int max_prefill_n = INT_MAX;
  static constexpr int max_decode_n = INT_MAX;
};

struct spec_full_kv : spec_base {
  static constexpr const char* name = "full_kv";
  static constexpr bool budgeted = false;
  template <class S>
  using type = kvsift::full_kv<S>;
  template <class S>
  static auto params(int) {
    return kvsift::full_kv_params<S>();
  }
};

struct spec_streaming_llm : spec_base {
  static constexpr const char* name = "streaming_llm";
  template <class S>
  using type = kvsift::streaming_llm<S>;
  template <class S>
  static auto params(int b) {
    return kvsift::streaming_llm_params<S>(b);
  }
};

struct spec_h2o : spec_base {
  static constexpr const char* name = "h2o";
  static constexpr int max_prefill_n = 4096;
  template <class S>
  using type = kvsift::h2o<S>;
  template <class S>
  static auto params(int b) {
    return kvsift::h2o_params<S>(b);
  }
};

struct spec_snapkv : spec_base {
  static constexpr const char* name = "snapkv";
  template <class S>
  using type = kvsift::snapkv<S>;
  template <class S>
  static auto params(int b) {
    return kvsift::snapkv_params<S>(b);
  }
};

struct spec_pyramidkv : spec_base {
  static constexpr const char* name = "pyramidkv";
  template <class S>
  using type = kvsift::pyramidkv<S>;
  template <class S>
  static auto params(int b) {
    return kvsift::pyramidkv_params<S>(b);
  }
};

struct spec_quest : spec_base {
  static constexpr const char* name = "quest";
  template <class S>
  using type = kvsift::quest<S>;
  template <class S>
  static auto params(int b) {
    return kvsift::quest_params<S>(b);
  }
};

#if KVBENCH_HAS_LAGKV
struct spec_lagkv : spec_base {
  static constexpr const char* name = "lagkv";
  static constexpr bool budgeted = false;  // LagKV keeps floor(r L) per partition, no budget
  template <class S>
  using type = kvsift::lagkv<S>;
  template <class S>
  static auto params(int) {
    return kvsift::lagkv_params<S>();
  }
};
#define KVBENCH_LAGKV_SPEC , spec_lagkv
#else
#define KVBENCH_LAGKV_SPEC
#endif

#if KVBENCH_HAS_DYNAMICKV
struct spec_dynamickv : spec_base {
  static constexpr const char* name = "dynamickv";
  template <class S>
  using type = kvsift::dynamickv<S>;
  template <class S>
  static auto params(int b) {
    return kvsift::dynamickv_params<S>(b);
  }
};
#define KVBENCH_DYNAMICKV_SPEC , spec_dynamickv
#else
#define KVBENCH_DYNAMICKV_SPEC
#endif

}  // namespace kvbench

#define KVBENCH_BUDGET_FREE_SPECS spec_full_kv KVBENCH_LAGKV_SPEC
#define KVBENCH_BUDGETED_SPECS \
  spec_streaming_llm, spec_h2o, spec_snapkv, spec_pyramidkv, spec_quest KVBENCH_DYNAMICKV_SPEC
