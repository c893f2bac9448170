// SPDX-License-Identifier: Apache-2.0
#pragma once

// Host-side transfers. CUDA ones (async on a stream, double-buffered recall) live in kvsift/cuda/.

#include <kvsift/concepts.hpp>

#include <cstdint>
#include <cstring>

namespace kvsift::transfer {

// No transfer: everything a method keeps stays where it is.
struct none {
  using kvsift_role = transfer_tag;
  struct params {};
  [[nodiscard]] std::int64_t bytes_moved() const { return 0; }
  void wait() {}
};
static_assert(Transfer<none>);

// Synchronous copy between host-accessible spaces (e.g. host pool -> pinned staging). Complete
// when copy() returns. Counts the bytes it moved.
struct sync_copy {
  using kvsift_role = transfer_tag;
  struct params {};
  template <HostAccessible To, HostAccessible From>
  void copy(void* to, const void* from, std::size_t bytes) {
    std::memcpy(to, from, bytes);
    bytes_ += static_cast<std::int64_t>(bytes);
  }
  [[nodiscard]] std::int64_t bytes_moved() const { return bytes_; }
  void wait() {}

 private:
  std::int64_t bytes_ = 0;
};
static_assert(Transfer<sync_copy>);

}  // namespace kvsift::transfer
