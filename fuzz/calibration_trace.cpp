// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the calibration trace reader, kvsift::cli::trace_file
// (examples/kvsift/calibration_trace.hpp, what `kvsift calibrate --traces` reads), on a file
// holding the input bytes: open, then every prompt the metadata announces (at most 4). Any
// outcome but a prompt_trace whose sizes match its shape or a kvsift::error is a finding.

#include "fuzz_common.hpp"

#include "kvsift/calibration_trace.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& path = kvsift::fuzz::scratch_file("calibration_trace", data, size);
  kvsift::fuzz::expect_only_kvsift_error("fuzz_calibration_trace", [&] {
    const auto f = kvsift::cli::trace_file::open(path);
    for (int p = 0; p < std::min(f.prompts, 4); ++p) {
      kvsift::fuzz::expect_only_kvsift_error("fuzz_calibration_trace", [&] {
        const auto t = f.prompt(p);
        const auto& s = t.shape;
        const auto kv = static_cast<std::size_t>(s.layers) * static_cast<std::size_t>(t.tokens()) *
                        static_cast<std::size_t>(s.kv_heads) * static_cast<std::size_t>(s.head_dim);
        if (t.keys.size() != kv || t.values.size() != kv) std::abort();
      });
    }
  });
  return 0;
}
