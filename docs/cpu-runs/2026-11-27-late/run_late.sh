#!/usr/bin/env bash
# The runs behind docs/performance.md, "Latest changes (2026-11-27 late)". OLD and NEW are two
# kvsift_bench binaries (Release, -DKVSIFT_ENABLE_THRUST=OFF) built from 86ecb7a and from the
# commit that added cpu::softmax_rows; run on a quiet machine.
#   bash run_late.sh OLD NEW > late.txt
set -euo pipefail
old=$1 new=$2
h2o='^BM_(decode|prefill)/h2o/llama31_8b/(bf16|f32)/n1024/B256/r1/'
echo "== H2O, one thread (--kvsift_threading=caller), old / new / old / new"
for b in "$old" "$new" "$old" "$new"; do
  echo "-- $b"
  "$b" --benchmark_filter="$h2o" --benchmark_min_time=0.5 --kvsift_threading=caller 2>/dev/null | grep '^BM'
done
echo "== the fused attention alone (attend_plan over the same 1K of a 4K prompt) beside StreamingLLM's step"
for t in pool caller; do
  echo "-- threading $t"
  "$new" --benchmark_filter='^BM_(bandwidth_reference|attention/attend_plan/llama31_8b/bf16/n4096/B1024/r1/|decode/streaming_llm/llama31_8b/bf16/n4096/B1024/r1/)' \
    --benchmark_min_time=0.3 --kvsift_threading=$t 2>/dev/null | grep '^BM'
done
