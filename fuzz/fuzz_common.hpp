// SPDX-License-Identifier: Apache-2.0
#pragma once

// Shared by the fuzz targets (fuzz/*.cpp, LLVMFuzzerTestOneInput): the contract every reader
// promises is "valid input is read, anything else is a kvsift::error". `expect_only_kvsift_error`
// runs one read and turns any other outcome (another exception type; crashes and sanitizer
// reports end the process by themselves) into an abort that libFuzzer records as a finding.
// `scratch_file` gives the readers that only take a path a file of this process to read.

#include <kvsift/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <typeinfo>
#include <unistd.h>

namespace kvsift::fuzz {

template <class F>
void expect_only_kvsift_error(const char* target, F&& read) {
  try {
    read();
  } catch (const kvsift::error&) {
    // the documented outcome for bad input
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: FINDING: exception other than kvsift::error: %s: %s\n", target,
                 typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "%s: FINDING: non-std exception\n", target);
    std::abort();
  }
}

// Writes `data` to a file private to this process and returns its path (rewritten each call).
inline const std::string& scratch_file(const char* target, const std::uint8_t* data,
                                       std::size_t size) {
  static const std::string path = [&] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/kvsift-fuzz-" + target + "-" +
           std::to_string(static_cast<long>(::getpid()));
  }();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "%s: cannot write scratch file %s\n", target, path.c_str());
    std::abort();
  }
  return path;
}

}  // namespace kvsift::fuzz
