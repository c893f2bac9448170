#!/bin/bash
# 2026-11-27 run 3: the fixed kernels (every lane shuffles) with the measured defaults: GPU tests,
# benchmarks beside the HBM/rows-read references, PyTorch reference, then memcheck over the bf16
# attention test as far as time allows. Logs into $OUT/logs.tgz after each stage.
set -o pipefail
ROOT=$PWD; B=/tmp/kvsift-gpu/build; D=/tmp/kvsift-gpu/deps
RES=${OUT:-/tmp/out}; L=/tmp/logs; mkdir -p "$RES" "$B" "$D" "$L"
LIB=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$LIB:$LD_LIBRARY_PATH
T0=$(date +%s); el() { tar czf $RES/logs.tgz -C /tmp logs 2>/dev/null; echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  nvcc --version | tail -2; date -u; } > $L/info.log 2>&1; cat $L/info.log
[ -d $D/usr ] || for f in $ROOT/.device/*.deb; do dpkg -x "$f" $D; done
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cmake -S $ROOT -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSIFT_ENABLE_CUDA=ON \
  -DKVSIFT_BUILD_TESTS=OFF -DKVSIFT_BUILD_BENCHMARKS=OFF -DKVSIFT_BUILD_EXAMPLES=OFF -DKVSIFT_ENABLE_THRUST=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=$NVCC \
  -DCatch2_DIR=$LIB/cmake/Catch2 -Dbenchmark_DIR=$LIB/cmake/benchmark \
  -DCMAKE_PREFIX_PATH=$D/usr > $L/build.log 2>&1 || { tail -30 $L/build.log; exit 1; }
el build
timeout 150 cmake --build $B -j16 --target kvsift_cuda_tests kvsift_cuda_bench >> $L/build.log 2>&1 \
  || { grep -E 'error' $L/build.log | head -30; tail -20 $L/build.log; el fail; exit 1; }
el tests
timeout 90 $B/cuda/kvsift_cuda_tests --durations yes > $L/tests.log 2>&1; echo "tests exit $?"
grep -E "test cases|assertions|FAILED" -A3 $L/tests.log | head -30; grep -E "^[0-9.]+ s: " $L/tests.log | sort -rn | head -4
el bench
timeout 110 $B/cuda/kvsift_cuda_bench --benchmark_filter="ref/hbm|topk|sparse_attention/bf16|attention_variant" \
  --benchmark_out=$L/bench.json --benchmark_out_format=json > $L/bench.txt 2>&1; echo "bench exit $?"
grep -E "limits|ERROR" $L/bench.txt | head; grep -E "_median" $L/bench.txt | sed -E 's/iterations:100\/repeats:5\/manual_time_median//' | awk '{print $1, $2, $3}'
el torch
timeout 40 python3 $ROOT/cuda/torch_reference.py --reps 50 --json $L/torch.json > $L/torch.txt 2>&1; cat $L/torch.txt
el memcheck
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $B/cuda/kvsift_cuda_tests "sparse decode attention matches the CPU reference - kvsift::bfloat16" > $L/san-memcheck.log 2>&1
echo "memcheck exit $? : $(grep -E 'ERROR SUMMARY|test cases' $L/san-memcheck.log | tr '\n' ' ')"
el done
