#!/bin/bash
# cmp.sh FILTER [extra flags]: b0 / b1 interleaved twice, p50 per row
F="$1"; shift
for i in 1 2; do for b in b0 b1; do
  /tmp/$b/build/bench/kvsift_bench --benchmark_filter="$F" --benchmark_min_time=0.3 "$@" 2>/dev/null | grep '^BM_' | sed -E 's/.*(BM_[^ ]*)\/real_time +([0-9.]+ [mu]s).*step_p50_ms=([0-9.]+).*/\1 mean \2 p50 \3 ms/' | sed "s/^/$b /"
done; done | sort -k2,2 -s
