// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the eval prompts reader, kvsift::examples::load_eval_jsonl
// (examples/engine/eval_harness.hpp), on a file holding the input bytes. Any outcome but a
// list of items or a kvsift::error is a finding.

#include "fuzz_common.hpp"

#include "engine/eval_harness.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& path = kvsift::fuzz::scratch_file("eval_jsonl", data, size);
  kvsift::fuzz::expect_only_kvsift_error("fuzz_eval_jsonl", [&] {
    const auto items = kvsift::examples::load_eval_jsonl(path);
    for (const auto& it : items) {
      if (!it.raw.is_object()) std::abort();  // the reader promised an object per line
    }
  });
  return 0;
}
