// SPDX-License-Identifier: Apache-2.0
// Compile check: the named methods (include/kvsift/method/*.hpp, whose decode path runs on the
// host) compiled by nvcc next to the CUDA backend. Each method's whole lifecycle (construct,
// prefill, decode, attend, after_attention, stats) is instantiated over dense and paged host
// stores in f32/f16/bf16. Nothing here runs; the function below only forces instantiation.

#include <kvsift/kvsift.hpp>

#include <kvsift/cuda/all.cuh>

#include <vector>

namespace {

template <class M, class Store>
void exercise(Store& store) {
  using T = typename M::element_type;
  M m(store, typename M::params{});
  const kvsift::prefill_chunk<T> chunk{};
  m.prefill(0, chunk);
  const kvsift::decode_token<T> token{};
  (void)m.decode(0, token);
  std::vector<float> out;
  m.attend(0, std::span<const kvsift::decode_token<T>>(&token, 1), out.data());
  m.after_attention(0, token);
  (void)m.stats();
}

template <class Store>
void exercise_all(Store& store) {
  exercise<kvsift::full_kv<Store>>(store);
  exercise<kvsift::streaming_llm<Store>>(store);
  exercise<kvsift::h2o<Store>>(store);
  exercise<kvsift::snapkv<Store>>(store);
  exercise<kvsift::pyramidkv<Store>>(store);
  exercise<kvsift::quest<Store>>(store);
  exercise<kvsift::lagkv<Store>>(store);
  exercise<kvsift::dynamickv<Store>>(store);
}

}  // namespace

// Never called: referencing every composition here makes nvcc compile all of them.
void kvsift_cuda_methods_compile_check(kvsift::store::dense<float>& a,
                                       kvsift::store::dense<kvsift::half>& b,
                                       kvsift::store::dense<kvsift::bfloat16>& c,
                                       kvsift::store::paged<float>& d,
                                       kvsift::store::paged<kvsift::bfloat16>& e) {
  exercise_all(a);
  exercise_all(b);
  exercise_all(c);
  exercise_all(d);
  exercise_all(e);
}
