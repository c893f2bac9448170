# SPDX-License-Identifier: Apache-2.0
# The conformance kinds implemented so far (SPEC.md §5); ctest runs only these.
# Each issue appends one `list(APPEND ...)` line for its family's kinds, beside its
# tests/conformance/kinds_<family>.cpp.
set(KVSIFT_CONFORMANCE_KINDS)
list(APPEND KVSIFT_CONFORMANCE_KINDS attention.decode select.topk budget.fraction score.snapkv method.snapkv.prefill score.h2o_prefill method.h2o.prefill method.streaming_llm.prefill budget.pyramidkv method.pyramidkv.prefill score.quest_pages method.quest.select method.streaming_llm.decode method.h2o.decode method.quest.decode)
list(APPEND KVSIFT_CONFORMANCE_KINDS score.lagkv method.lagkv.prefill method.lagkv.decode)
list(APPEND KVSIFT_CONFORMANCE_KINDS budget.dynamickv method.dynamickv.prefill)
list(APPEND KVSIFT_CONFORMANCE_KINDS budget.synckv method.synckv.decode)
list(APPEND KVSIFT_CONFORMANCE_KINDS calibrate.topk_sets calibrate.overlap calibrate.stability calibrate.kmeans calibrate.star_cluster)
list(APPEND KVSIFT_CONFORMANCE_KINDS score.freekv_pages method.freekv.select trigger.query_cosine method.freekv.decode)
list(APPEND KVSIFT_CONFORMANCE_KINDS budget.heterocache method.heterocache.prefill method.heterocache.decode)

# The kinds with a Thrust path (tests/conformance/thrust/kinds_thrust*.cpp), run by ctest with
# `--backend thrust` under Thrust's CPP and OMP systems (label conformance;thrust). Every other
# kind reports "no thrust path" there. Must equal `kvsift-conformance-thrust-cpp --list-kinds
# --backend thrust` (test conformance.thrust.<sys>.kinds). The budget.* kinds other than
# budget.dynamickv are host arithmetic on every backend (tests/conformance/kinds_host.hpp).
set(KVSIFT_CONFORMANCE_THRUST_KINDS
    attention.decode select.topk score.snapkv method.snapkv.prefill method.pyramidkv.prefill
    score.h2o_prefill method.h2o.prefill method.streaming_llm.prefill
    score.quest_pages method.quest.select score.lagkv method.lagkv.prefill score.freekv_pages
    method.freekv.select trigger.query_cosine method.dynamickv.prefill budget.dynamickv
    budget.fraction budget.pyramidkv budget.synckv budget.heterocache)
list(APPEND KVSIFT_CONFORMANCE_THRUST_KINDS method.streaming_llm.decode method.h2o.decode method.quest.decode method.lagkv.decode)
list(APPEND KVSIFT_CONFORMANCE_THRUST_KINDS method.synckv.decode method.freekv.decode method.heterocache.prefill method.heterocache.decode)

# The methods' kinds (method.*: SnapKV, PyramidKV, H2O, StreamingLLM, Quest, LagKV, DynamicKV,
# SyncKV) have one handler body each (tests/conformance/method_kinds.hpp, two_tier_kinds.hpp), run
# on the host (CPU backend) and, through device::staged_method, on exec::sim_cpp / sim_omp (the
# Thrust runners) and exec::cuda (kvsift-conformance-cuda).
