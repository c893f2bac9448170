#!/bin/bash
# 2026-11-27 run 1: build (sm_90), GPU tests, benchmarks (attention pipelines / merge / chunking
# variants, top-k block sizes) beside HBM and PyTorch references, compute-sanitizer over the
# attention and top-k tests. Each stage time-boxed; logs straight into $OUT.
set -o pipefail
ROOT=$PWD; B=/tmp/kvsift-gpu/build; D=/tmp/kvsift-gpu/deps
RES=${OUT:-/tmp/out}; mkdir -p "$RES" "$B" "$D"
LIB=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$LIB:$LD_LIBRARY_PATH
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
el info
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  nvcc --version | tail -2; cmake --version | head -1; g++ --version | head -1; date -u
  python3 -c 'import torch; print("torch", torch.__version__)'; } > $RES/info.log 2>&1; cat $RES/info.log
for f in $ROOT/.device/*.deb; do dpkg -x "$f" $D; done
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cmake -S $ROOT -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSIFT_ENABLE_CUDA=ON \
  -DKVSIFT_BUILD_TESTS=OFF -DKVSIFT_BUILD_BENCHMARKS=OFF -DKVSIFT_BUILD_EXAMPLES=OFF -DKVSIFT_ENABLE_THRUST=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=$NVCC \
  -DCatch2_DIR=$LIB/cmake/Catch2 -Dbenchmark_DIR=$LIB/cmake/benchmark \
  -DCMAKE_PREFIX_PATH=$D/usr > $RES/build.log 2>&1 || { tail -30 $RES/build.log; exit 1; }
el build
timeout 200 cmake --build $B -j16 --target kvsift_cuda_tests kvsift_cuda_bench >> $RES/build.log 2>&1 \
  || { grep -E 'error' $RES/build.log | head -30; tail -20 $RES/build.log; exit 1; }
el tests
timeout 100 $B/cuda/kvsift_cuda_tests --durations yes > $RES/tests.log 2>&1; echo "tests exit $?"
grep -E "test cases|assertions|FAILED|failed" -A3 $RES/tests.log | head -40
el bench
timeout ${BENCH_T:-200} $B/cuda/kvsift_cuda_bench --benchmark_filter="${BENCH_F:-ref/hbm|topk|sparse_attention/bf16|attention_variant}" \
  --benchmark_out=$RES/bench.json --benchmark_out_format=json > $RES/bench.txt 2>&1; echo "bench exit $?"
grep -E "limits|ERROR" $RES/bench.txt | head; grep -E "_median" $RES/bench.txt | sed -E 's/iterations:100\/repeats:5\/manual_time_median//; s/ +[0-9.]+ us +[0-9]+ //' | awk '{print $1, $2, $3}' | head -120
el torch
timeout 90 python3 $ROOT/cuda/torch_reference.py --reps 50 --json $RES/torch.json > $RES/torch.txt 2>&1; cat $RES/torch.txt
el sanitize
for tool in memcheck racecheck synccheck initcheck; do
  timeout 45 compute-sanitizer --tool $tool --error-exitcode 9 $B/cuda/kvsift_cuda_tests "[attention],[topk]" > $RES/san-$tool.log 2>&1
  echo "$tool exit $? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test cases' $RES/san-$tool.log | tr '\n' ' ')"
done
el done
