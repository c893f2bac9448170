#!/usr/bin/env bash
# The exact exp (core/exp.hpp, cpu/exact_softmax.hpp) against the commit before it, interleaved:
# old / new / old / new. OLD and NEW are kvsift_bench binaries of two bench-only trees
# (Release, tests, examples and Thrust off), built from 97cd0e9 and from this change.
set -euo pipefail
OLD=${OLD:-/tmp/expO/build/bench/kvsift_bench}
NEW=${NEW:-/tmp/expN/build/bench/kvsift_bench}
out=${1:-.}
F='^BM_bandwidth_reference|^BM_(prefill|decode)/h2o/llama31_8b/(f32|bf16)/n1024/B256/r1/|^BM_(prefill|decode)/h2o/llama31_8b/bf16/n2048/B256/r1/|^BM_prefill/(snapkv|pyramidkv)/llama31_8b/(f32|bf16)/n(4096|32768)/B1024/r1/|^BM_score/window_attention/llama31_8b/(f32|bf16)/n(4096|32768)/r1/'
for i in 1 2; do
  for v in old new; do
    bin=$OLD; [[ $v == new ]] && bin=$NEW
    "$bin" --benchmark_filter="$F" --benchmark_min_time=0.2 \
      --benchmark_out="$out/exp-$v-$i.json" --benchmark_out_format=json > /dev/null 2>&1
    echo "== $v run $i"
    /usr/bin/python3 - "$out/exp-$v-$i.json" <<'PY'
import json, sys
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if b.get("run_type") == "aggregate": continue
    print(f"{b['name'].replace('/real_time', ''):60s} {b['real_time']:10.3f} {b['time_unit']}")
PY
  done
done
