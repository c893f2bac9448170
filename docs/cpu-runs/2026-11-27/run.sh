#!/bin/bash
F='^BM_bandwidth_reference|^BM_decode/h2o/llama31_8b/(f32|bf16)/n1024/B256/r1/|^BM_decode/h2o/llama31_8b/bf16/n2048/B256/r1/|^BM_decode/(full_kv|streaming_llm|snapkv|quest|lagkv|dynamickv)/llama31_8b/bf16/n4096/(B1024/)?r4/'
cd /work/main
for i in 1 2; do
  /tmp/bench_old --benchmark_filter="$F" --benchmark_min_time=0.1 --benchmark_out=/tmp/cmp_old$i.json --benchmark_out_format=json > /dev/null 2>&1
  build/release/bench/kvsift_bench --benchmark_filter="$F" --benchmark_min_time=0.1 --benchmark_out=/tmp/cmp_new$i.json --benchmark_out_format=json > /dev/null 2>&1
done
echo done
