// SPDX-License-Identifier: Apache-2.0
#pragma once

// Head roles with Thrust: a follower head takes its leader's sets (SyncKV's followers their
// representative's static / dynamic sets, select::shared_by_cluster::share; HeteroCache's
// satellites their pivot's scores). Mirrors roles::clusters / roles::stars' sharing.
//   leader_gather   out segment i = in segment leader[i] (any element type)
//                                                           one thread per output entry
//   leader_offsets  (host) the CSR offsets of leader_gather's output: a shape
// No workspace.

#include <kvsift/thrust/common.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace kvsift::thrust {

namespace detail {

template <class V>
struct leader_gather_fn {
  const std::int32_t* in_offsets;
  const V* in;
  const std::int32_t* leader;
  const std::int32_t* out_offsets;
  int num_out_segments;
  V* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int i = segment_of(out_offsets, num_out_segments, t);
    out[t] = in[in_offsets[leader[i]] + (t - out_offsets[i])];
  }
};

}  // namespace detail

// Host: the output offsets of leader_gather, out[i + 1] = out[i] + sizes[leader[i]] (sizes: the
// host's counts of the input segments).
inline std::vector<std::int32_t> leader_offsets(const std::vector<std::int32_t>& sizes,
                                                const std::vector<std::int32_t>& leader) {
  std::vector<std::int32_t> out{0};
  for (const auto l : leader) {
    require(l >= 0 && static_cast<std::size_t>(l) < sizes.size(), "thrust::leader_offsets",
            "leader", l, "an input segment");
    out.push_back(out.back() + sizes[static_cast<std::size_t>(l)]);
  }
  return out;
}

// out[out_offsets[i] + j] = in[in_offsets[leader[i]] + j] for j < out_offsets[i + 1] -
// out_offsets[i] (= the leader's count: leader_offsets). num_out = out_offsets[R] (host).
template <class Policy, class V>
void leader_gather(const Policy& exec, const std::int32_t* in_offsets, const V* in,
                   const std::int32_t* leader, int num_out_segments,
                   const std::int32_t* out_offsets, std::int64_t num_out, V* out) {
  constexpr std::string_view where = "thrust::leader_gather";
  require(num_out_segments >= 0, where, "num_out_segments", num_out_segments, ">= 0");
  require(num_out >= 0, where, "num_out", num_out, ">= 0");
  if (num_out_segments == 0 || num_out == 0) {
    return;
  }
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_out,
                       detail::leader_gather_fn<V>{in_offsets, in, leader, out_offsets,
                                                   num_out_segments, out});
}

}  // namespace kvsift::thrust
