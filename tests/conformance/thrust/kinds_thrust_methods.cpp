// SPDX-License-Identifier: Apache-2.0
// The methods' kinds on `--backend thrust`: the one-tier method.snapkv.prefill,
// method.pyramidkv.prefill, method.h2o.prefill, method.streaming_llm.prefill,
// method.streaming_llm.decode, method.h2o.decode, method.quest.decode, method.lagkv.prefill,
// method.lagkv.decode, method.dynamickv.prefill (method.quest.select: kinds_thrust.cpp, whose
// per-query-head form is the Thrust components'), and the two-tier method.synckv.decode. Each is
// the CPU backend's very handler body (../method_kinds.hpp, ../two_tier_kinds.hpp) instantiated
// on the device backend (device_backend.hpp): the library's method<thrust::dense_store<float, E>
// (thrust::tiered_store<float, E>), Recipe, E> on the runner's simulated device (exec::sim_cpp or
// sim_omp; exec::cuda under nvcc), driven through device::staged_method.

#include "device_backend.hpp"
#include "helpers.hpp"

namespace {
using namespace kvsift::conformance::thrust_kinds;  // kc, handlers_backend
namespace mk = kvsift::conformance::method_kinds;
using mk::device;

const kc::registrar method_snapkv_prefill{handlers_backend, "method.snapkv.prefill",
                                          mk::snapkv_prefill<device>};
const kc::registrar method_pyramidkv_prefill{handlers_backend, "method.pyramidkv.prefill",
                                             mk::pyramidkv_prefill<device>};
const kc::registrar method_h2o_prefill{handlers_backend, "method.h2o.prefill",
                                       mk::h2o_prefill<device>};
const kc::registrar method_streaming_llm_prefill{handlers_backend, "method.streaming_llm.prefill",
                                                 mk::streaming_llm_prefill<device>};
const kc::registrar method_streaming_llm_decode{handlers_backend, "method.streaming_llm.decode",
                                                mk::streaming_llm_decode<device>};
const kc::registrar method_h2o_decode{handlers_backend, "method.h2o.decode",
                                      mk::h2o_decode<device>};
const kc::registrar method_quest_decode{handlers_backend, "method.quest.decode",
                                        mk::quest_decode<device>};
const kc::registrar method_lagkv_prefill{handlers_backend, "method.lagkv.prefill",
                                         mk::lagkv_prefill<device>};
const kc::registrar method_lagkv_decode{handlers_backend, "method.lagkv.decode",
                                        mk::lagkv_decode<device>};
const kc::registrar method_dynamickv_prefill{handlers_backend, "method.dynamickv.prefill",
                                             mk::dynamickv_prefill<device>};

// The two-tier methods' kinds (../two_tier_kinds.hpp) over a thrust::tiered_store<float, E>.
const kc::registrar method_synckv_decode{handlers_backend, "method.synckv.decode",
                                         kvsift::conformance::two_tier_kinds::synckv_decode<device>};

}  // namespace
