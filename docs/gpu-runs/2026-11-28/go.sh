#!/bin/bash
# 2026-11-28 run 1 (H100): binaries built on the CPU machine for sm_90 (nvcc 13.0.88, g++ 12,
# Release, --fmad=false except the benchmark), carried as .device/bin.tar.xz. Stages:
#   tests   kvsift_cuda_tests: every test case, among them the methods over exec::cuda (never run
#           on a GPU before) and the graph test
#   conf    kvsift-conformance-cuda --backend cuda over every Thrust kind (the method kinds through
#           staged_method over exec::cuda: never run on a GPU before)
#   san     compute-sanitizer: memcheck and synccheck over [topk] (the new split path),
#           racecheck + initcheck over [topk],[attention] (cut short on 2026-11-27)
#   probe   each method's decode step captured in a CUDA graph (cuda/gpu_capture_probe.cu)
#   bench   the GPU benchmark's rows beside their references, then the PyTorch reference
# Logs in $OUT/logs.tgz (rewritten after every stage).
set -o pipefail
ROOT=$PWD; BIN=/tmp/kvsift-bin
RES=${OUT:-/tmp/out}; L=/tmp/logs; mkdir -p "$RES" "$L"
export LD_LIBRARY_PATH=$BIN:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
mkdir -p $BIN && tar xJf $ROOT/.device/bin.tar.xz -C $BIN && chmod +x $BIN/*
T0=$(date +%s); el() { tar czf $RES/logs.tgz -C /tmp logs 2>/dev/null; echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  nvcc --version 2>/dev/null | tail -2; date -u; uname -a; } > $L/info.log 2>&1; cat $L/info.log
ldd $BIN/kvsift_cuda_tests | grep -E "not found" && { echo "missing libraries"; }
for stage in "$@"; do case $stage in
tests)
  el tests
  timeout ${T_TESTS:-150} $BIN/kvsift_cuda_tests ${TESTS_SPEC:-} --durations yes > $L/tests.log 2>&1; echo "tests exit $?"
  grep -E "test cases|assertions|FAILED|REQUIRE|CHECK\(|with expansion" -A3 $L/tests.log | head -40
  grep -E "^[0-9.]+ s: " $L/tests.log | sort -rn | head -8 ;;
conf)
  el conf
  KINDS=$(cat $ROOT/.device/kinds.txt)
  timeout ${T_CONF:-120} $BIN/kvsift-conformance-cuda $ROOT/tests/conformance/vectors/cases --backend cuda \
    --kinds "$KINDS" > $L/conformance.log 2>&1; echo "conformance exit $?"
  grep -vE "^PASS" $L/conformance.log | tail -25 ;;
san)
  IFS=';' read -ra SPECS <<< "${SAN_SPECS:-memcheck|[topk];racecheck|[topk],[attention];initcheck|[topk],[attention];synccheck|[topk]}"
  for spec in "${SPECS[@]}"; do
    tool=${spec%%|*}; filt=${spec#*|}; f=$L/san-$tool-$(echo "$filt" | tr -dc 'a-z' | cut -c1-24).log
    el "sanitizer $tool $filt"
    timeout ${T_SAN:-75} compute-sanitizer --tool $tool --error-exitcode 9 $BIN/kvsift_cuda_tests "$filt" > $f 2>&1
    echo "$tool $filt exit $? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test cases' $f | tr '\n' ' ')"
  done ;;
bench)
  el bench
  timeout ${T_BENCH:-120} $BIN/kvsift_cuda_bench --benchmark_filter="${BENCH_FILTER:-ref/|segmented_topk|topk_block/(256|1024)/|sparse_attention/bf16|recall}" \
    --benchmark_out=$L/bench.json --benchmark_out_format=json > $L/bench.txt 2>&1; echo "bench exit $?"
  grep -E "limits|ERROR" $L/bench.txt | head; grep -E "_median" $L/bench.txt | sed -E 's/iterations:[0-9]+\/repeats:[0-9]+\/manual_time_median//' | awk '{print $1, $2, $3, $NF}'
  el torch
  timeout ${T_TORCH:-45} python3 $ROOT/cuda/torch_reference.py --reps 50 --json $L/torch.json > $L/torch.txt 2>&1; cat $L/torch.txt ;;
probe)
  el probe
  timeout ${T_PROBE:-120} $BIN/kvsift_cuda_tests "[capture]" > $L/probe.log 2>&1; echo "probe exit $?"
  grep -E "capture probe|test cases|assertions|FAILED|REQUIRE|with expansion" -A2 $L/probe.log | head -60 ;;
mixed)
  $BIN/kvsift_cuda_mixed 2>&1 | tail -3 ;;
*) echo "unknown stage $stage" ;;
esac; done
el done
