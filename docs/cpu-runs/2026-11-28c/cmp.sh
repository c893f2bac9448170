#!/bin/bash
# NEW=bn|bq cmp.sh FILTER [extra flags]: bo (b06a7d1) and the new tree interleaved twice, p50 per row;
# bn = b5b3ef1 (cmp.txt), bq = HEAD with weighted_values_at (cmp-4k.txt); trees from git archive,
# built with -DKVSIFT_BUILD_TESTS=OFF -DKVSIFT_ENABLE_THRUST=OFF, target kvsift_bench
F="$1"; shift
for i in 1 2; do for b in bo ${NEW:-bq}; do
  /tmp/$b/build/bench/kvsift_bench --benchmark_filter="$F" --benchmark_min_time=0.3 "$@" 2>/dev/null | grep '^BM_' | sed -E 's/.*(BM_[^ ]*)\/real_time +([0-9.]+ [mu]s).*step_p50_ms=([0-9.]+).*/\1 mean \2 p50 \3 ms/' | sed "s/^/$b /"
done; done | sort -k2,2 -s
