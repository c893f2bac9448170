#!/usr/bin/env bash
# The runs behind docs/performance.md, "Latest changes (2026-11-27 late)", the row map walked by
# page runs. HEAD and RUNS are kvsift_bench binaries (Release, -DKVSIFT_ENABLE_THRUST=OFF) built
# from 6676915 and from the commit that added the page runs; run on a quiet machine.
#   bash run_runs.sh HEAD RUNS > runs.txt
set -euo pipefail
head=$1 runs=$2
echo "== one thread (--kvsift_threading=caller), head / runs / head / runs"
for b in "$head" "$runs" "$head" "$runs"; do
  echo "-- $b"
  "$b" --benchmark_filter='^BM_decode/(streaming_llm|h2o)/llama31_8b/bf16/n(4096|1024)/B(1024|256)/r1/' \
    --benchmark_min_time=0.5 --kvsift_threading=caller 2>/dev/null | grep '^BM'
done
echo "== two threads (pool), head / runs / head / runs"
for b in "$head" "$runs" "$head" "$runs"; do
  echo "-- $b"
  "$b" --benchmark_filter='^BM_(bandwidth_reference|decode/streaming_llm/llama31_8b/bf16/n(4096|32768)/B1024/r(1|4)/)' \
    --benchmark_min_time=0.3 2>/dev/null | grep '^BM'
done
