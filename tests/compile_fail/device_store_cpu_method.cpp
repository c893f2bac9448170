// SPDX-License-Identifier: Apache-2.0
// A store whose memory lives on the device cannot run the CPU lifecycle: the method says the
// store's memory must be the Exec's (exec::host runs over host-accessible stores).
// expect-error: the Store.s memory must be the Exec.s \(exec::host runs over host-accessible stores\)
#include <kvsift/kvsift.hpp>

#include <cstdint>

struct device_store {  // a KvStore whose keys and values live in GPU memory
  using kvsift_role = kvsift::store_tag;
  using element_type = kvsift::half;
  using memory_space = kvsift::device_space;
  kvsift::model_shape shape() const { return {}; }
  int length(std::int64_t) const { return 0; }
  std::int32_t position(std::int64_t, int) const { return 0; }
  const kvsift::half* key(std::int64_t, int) const { return nullptr; }
  const kvsift::half* value(std::int64_t, int) const { return nullptr; }
  std::int64_t resident_bytes() const { return 0; }
  void retain(int, int, const kvsift::index_sets&) {}
};
static_assert(kvsift::KvStore<device_store>);

using bad = kvsift::snapkv<device_store>;

int main() {
  bad::params p{};
  (void)p;
}
