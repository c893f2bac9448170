// SPDX-License-Identifier: Apache-2.0
// kvsift eval --exec (exec_choice.hpp): the device registries, compiled under Thrust (CCCL), or
// host only where CCCL was not found (KVSIFT_CLI_THRUST undefined).

#include "../exec_choice.hpp"

#include <kvsift/core/error.hpp>

#if defined(KVSIFT_CLI_THRUST)
#include <kvsift/device/erased.hpp>
#include <kvsift/thrust/exec.hpp>
#endif

namespace kvsift::cli {

std::vector<std::string> exec_names() {
  std::vector<std::string> names{"host"};
#if defined(KVSIFT_CLI_THRUST)
  names.emplace_back("thrust-cpp");
#if defined(_OPENMP)
  names.emplace_back("thrust-omp");
#endif
#endif
  return names;
}

std::shared_ptr<const method_registry<float>> registry_on_exec(
    const std::string& name, std::shared_ptr<const method_registry<float>> host, int page_size) {
  if (name == "host") return host;
#if defined(KVSIFT_CLI_THRUST)
  if (name == "thrust-cpp") {
    return std::make_shared<const method_registry<float>>(
        device::method_registry_on<float, exec::sim_cpp>(*host, page_size));
  }
#if defined(_OPENMP)
  if (name == "thrust-omp") {
    return std::make_shared<const method_registry<float>>(
        device::method_registry_on<float, exec::sim_omp>(*host, page_size));
  }
#endif
#endif
  std::string known;
  for (const auto& n : exec_names()) known += (known.empty() ? "" : ", ") + n;
  throw make_error("kvsift eval", "--exec", name, "one of " + known + " (this build)");
}

}  // namespace kvsift::cli
