// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the safetensors reader (include/kvsift/io/safetensors.hpp). Parses the bytes with
// safetensors_file::from_bytes (the path `open` takes after reading the file), then reads every
// tensor it lists through each accessor. Any outcome but success or kvsift::error is a finding.

#include "fuzz_common.hpp"

#include <kvsift/io/safetensors.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace io = kvsift::io;
  kvsift::fuzz::expect_only_kvsift_error("fuzz_safetensors", [&] {
    std::vector<std::byte> buf(reinterpret_cast<const std::byte*>(data),
                               reinterpret_cast<const std::byte*>(data) + size);
    const auto f = io::safetensors_file::from_bytes(std::move(buf), "<fuzz>");
    (void)f.metadata();
    for (const auto& name : f.names()) {
      kvsift::fuzz::expect_only_kvsift_error("fuzz_safetensors", [&] {
        const auto& t = f.info(name);
        const auto bytes = f.raw(name);
        if (bytes.size() != t.nbytes) std::abort();
        (void)t.numel();
        f.require_shape(name, t.shape);
        const auto values = f.to_float(name, t.shape);
        if (values.size() != static_cast<std::size_t>(t.numel())) std::abort();
        (void)f.to_int32(name);
      });
    }
    (void)f.info("no such tensor");
  });
  kvsift::fuzz::expect_only_kvsift_error("fuzz_safetensors", [&] {
    std::vector<std::byte> buf(reinterpret_cast<const std::byte*>(data),
                               reinterpret_cast<const std::byte*>(data) + size);
    (void)io::safetensors_file::from_bytes(std::move(buf)).tensors();
  });
  return 0;
}
