// SPDX-License-Identifier: Apache-2.0
#pragma once

// `kvsift eval --exec NAME`: where the methods run. `host` is the library's CPU path (the default
// registry as given). The others run every built-in method over device memory on a
// simulated device (kvsift::device::method_registry_on, include/kvsift/device/erased.hpp):
//   thrust-cpp  Thrust's CPP system      built where CCCL 3.x was found
//   thrust-omp  Thrust's OMP system      the same, in an OpenMP build
// They are compiled in exec_choice.cpp under Thrust (examples/kvsift/thrust/), the only CLI
// sources that include CCCL.

#include <kvsift/method/any_method.hpp>

#include <memory>
#include <string>
#include <vector>

namespace kvsift::cli {

// The --exec names this build has, "host" first.
std::vector<std::string> exec_names();

// `host` with every built-in entry running on exec `name` (one of exec_names(); "host" returns
// `host` as it is), the one-tier ones over a paged device store of pages of `page_size` tokens
// when it is > 0 (a dense one otherwise). Throws kvsift::error naming the option and the names
// this build has.
std::shared_ptr<const method_registry<float>> registry_on_exec(
    const std::string& name, std::shared_ptr<const method_registry<float>> host, int page_size = 0);

}  // namespace kvsift::cli
