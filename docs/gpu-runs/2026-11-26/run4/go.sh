#!/bin/bash
set -o pipefail
ROOT=$PWD; B=/tmp/kvsift-gpu/build; D=/tmp/kvsift-gpu/deps
RES=${OUT:-/tmp/out}; OUT=/tmp/logs; mkdir -p "$RES" "$OUT" "$B" "$D"
LIB=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$LIB:$LD_LIBRARY_PATH
T0=$(date +%s); el() { tar czf $RES/logs.tgz -C /tmp logs 2>/dev/null; echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
for f in $ROOT/.device/*.deb; do dpkg -x "$f" $D; done
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cmake -S $ROOT -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSIFT_ENABLE_CUDA=ON \
  -DKVSIFT_BUILD_TESTS=OFF -DKVSIFT_BUILD_BENCHMARKS=OFF -DKVSIFT_BUILD_EXAMPLES=OFF -DKVSIFT_ENABLE_THRUST=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=$NVCC \
  -DCatch2_DIR=$LIB/cmake/Catch2 -Dbenchmark_DIR=$LIB/cmake/benchmark \
  -DCMAKE_PREFIX_PATH=$D/usr > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
el build
timeout 200 cmake --build $B -j16 --target kvsift_cuda_bench kvsift_cuda_tests >> $OUT/build.log 2>&1 \
  || { grep -E 'error' $OUT/build.log | head -30; tail -20 $OUT/build.log; exit 1; }
el tests
timeout 60 $B/cuda/kvsift_cuda_tests > $OUT/tests.log 2>&1; echo "tests exit $?"; grep -E "test cases|assertions|FAILED" -A4 $OUT/tests.log | head -30
el bench
timeout 80 $B/cuda/kvsift_cuda_bench --benchmark_filter='ref/hbm|topk|sparse_attention/bf16' --benchmark_out=$OUT/bench.json --benchmark_out_format=json 2>&1 | tee $OUT/bench.txt | grep -E "median|limits"
el torch
timeout 40 python3 $ROOT/cuda/torch_reference.py --only topk --reps 50 --json $OUT/torch.json 2>&1 | tee $OUT/torch.txt
el sanitize
for tool in memcheck racecheck; do
  timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 $B/cuda/kvsift_cuda_tests "[topk]" > $OUT/san-$tool.log 2>&1
  echo "$tool exit $? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test cases' $OUT/san-$tool.log | tr '\n' ' ')"
done
el done
