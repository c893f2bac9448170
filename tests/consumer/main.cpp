// SPDX-License-Identifier: Apache-2.0
// Uses kvsift as an installed package: compresses one layer with SnapKV, checks the result, and
// writes and reads back a safetensors file (io/safetensors.hpp: nlohmann_json comes with the
// package).
#include <kvsift/io/safetensors.hpp>
#include <kvsift/kvsift.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using namespace kvsift;
  const model_shape shape{1, 4, 2, 16};
  const int n = 200;
  std::vector<float> k(n * 2 * 16), v(k.size()), q(n * 4 * 16);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::sin(0.37f * i), v[i] = std::cos(0.11f * i);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.13f * i);
  store::dense<float> store(shape, 1, 256);
  snapkv<store::dense<float>> method(store, snapkv_params<store::dense<float>>(64));
  method.prefill(0, prefill_chunk<float>{0, kv_view<const float>::contiguous(k.data(), n, 2, 16),
                                         kv_view<const float>::contiguous(v.data(), n, 2, 16),
                                         kv_view<const float>::contiguous(q.data(), n, 4, 16), 0,
                                         true});
  const auto s = method.stats();
  std::printf("kvsift consumer: %lld tokens resident (expected 128)\n",
              static_cast<long long>(s.resident_tokens));

  // The kept keys of head 0, through a safetensors image and back.
  std::vector<float> kept;
  for (int i = 0; i < store.length(0); ++i) kept.insert(kept.end(), store.key(0, i), store.key(0, i) + 16);
  io::tensor_map tensors;
  tensors.emplace("kept_keys", io::make_tensor(kept, {store.length(0), 16}));
  const auto file = io::safetensors_file::from_bytes(io::encode_safetensors(tensors));
  const bool round_trip = file.to_float("kept_keys") == kept;
  std::printf("kvsift consumer: safetensors round trip %s\n", round_trip ? "ok" : "FAILED");
  return s.resident_tokens == 128 && round_trip ? 0 : 1;
}
