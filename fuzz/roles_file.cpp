// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the head-roles file readers (include/kvsift/calibrate/roles_file.hpp),
// read_synckv_roles and read_heterocache_roles on a file holding the input bytes, once without
// and once with an expected model. A roles file read back must validate and round-trip
// through to_json. Any outcome but a validated roles object or a kvsift::error is a finding.

#include "fuzz_common.hpp"

#include <kvsift/calibrate/roles_file.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace cal = kvsift::calibrate;
  const auto& path = kvsift::fuzz::scratch_file("roles_file", data, size);
  const cal::model_fingerprint expected{2, 4, 2, 8, ""};
  for (const auto& model : {cal::model_fingerprint{}, expected}) {
    kvsift::fuzz::expect_only_kvsift_error("fuzz_roles_file", [&] {
      const auto r = cal::read_synckv_roles(path, model);
      const auto back = cal::synckv_roles_from_json(cal::to_json(r));
      if (back.layers.size() != r.layers.size()) std::abort();
    });
    kvsift::fuzz::expect_only_kvsift_error("fuzz_roles_file", [&] {
      const auto r = cal::read_heterocache_roles(path, model);
      const auto back = cal::heterocache_roles_from_json(cal::to_json(r));
      if (back.layers.size() != r.layers.size()) std::abort();
    });
  }
  return 0;
}
