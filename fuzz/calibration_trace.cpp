// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the calibration trace reader, kvsift::cli::trace_file
// (examples/kvsift/calibration_trace.hpp), and what `kvsift calibrate --traces` does with each
// prompt it reads (examples/kvsift/calibration_profile.hpp): open a file holding the input bytes,
// read every prompt the metadata announces (at most 4) and profile each as SyncKV and as
// HeteroCache calibration does (top-k sets of the last query at every step, the similarity and
// stability sums; the GQA group is q_heads / kv_heads, which divided by zero on a trace with
// kv_heads = 0: fuzz/regressions/calibration_trace/kv-heads-zero.safetensors). Any outcome but a
// prompt_trace whose sizes match its shape, profiled without a crash, or a kvsift::error is a
// finding.

#include "fuzz_common.hpp"

#include "kvsift/calibration_profile.hpp"
#include "kvsift/calibration_trace.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

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
        // what kvsift calibrate --traces does next, for both methods (heterocache needs a step)
        for (const char* method : {"synckv", "heterocache"}) {
          if (std::string(method) == "heterocache" && t.steps < 1) continue;
          kvsift::cli::accumulator acc;
          acc.init(f.model.layers, f.model.kv_heads);
          kvsift::cli::profile_prompt(method, t, acc, {}, {});
          if (acc.prompts != 1) std::abort();
        }
      });
    }
  });
  return 0;
}
