// SPDX-License-Identifier: Apache-2.0
#pragma once

// Memory-space tags. Every view and store is tagged with the space its memory lives in; an
// operation that mixes spaces does not compile (the tags are distinct types, never converted).

#include <string_view>
#include <type_traits>

namespace kvsift {

struct host_space {  // pageable host memory
  static constexpr std::string_view name = "host";
  static constexpr bool host_accessible = true;
};
struct pinned_host_space {  // page-locked host memory: the source/target of async copies
  static constexpr std::string_view name = "pinned_host";
  static constexpr bool host_accessible = true;
};
struct device_space {  // GPU memory
  static constexpr std::string_view name = "device";
  static constexpr bool host_accessible = false;
};

template <class S>
concept MemorySpace = std::is_same_v<S, host_space> || std::is_same_v<S, pinned_host_space> ||
                      std::is_same_v<S, device_space>;

template <class S>
concept HostAccessible = MemorySpace<S> && S::host_accessible;

}  // namespace kvsift
