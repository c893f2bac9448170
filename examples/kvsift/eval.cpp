// SPDX-License-Identifier: Apache-2.0
// kvsift eval: placeholder until the example engine is wired in.
#include "commands.hpp"

#include <cstdio>

namespace kvsift::cli {
int eval(const std::vector<std::string>&) {
  std::fprintf(stderr, "kvsift eval: not available in this build\n");
  return 2;
}
}  // namespace kvsift::cli
