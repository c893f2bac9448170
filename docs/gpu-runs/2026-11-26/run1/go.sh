#!/bin/bash
# One device call: build the CUDA targets (sm_90), run the GPU tests, the benchmarks with their
# references, the PyTorch reference, and compute-sanitizer. Each stage is time-boxed.
set -o pipefail
ROOT=$PWD; B=/tmp/kvsift-gpu/build; D=/tmp/kvsift-gpu/deps
RES=${OUT:-/tmp/out}; OUT=/tmp/logs; mkdir -p "$RES" "$OUT" "$B" "$D"
LIB=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$LIB:$LD_LIBRARY_PATH
T0=$(date +%s); el() { tar czf $RES/logs.tgz -C /tmp logs 2>/dev/null; echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
el info
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  nvcc --version | tail -2; cmake --version | head -1; g++ --version | head -1; date -u; } 2>&1 | tee $OUT/info.log
for f in $ROOT/.device/*.deb; do dpkg -x "$f" $D; done
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
el configure
cmake -S $ROOT -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSIFT_ENABLE_CUDA=ON \
  -DKVSIFT_BUILD_TESTS=OFF -DKVSIFT_BUILD_BENCHMARKS=OFF -DKVSIFT_BUILD_EXAMPLES=OFF -DKVSIFT_ENABLE_THRUST=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=$NVCC \
  -DCatch2_DIR=$LIB/cmake/Catch2 -Dbenchmark_DIR=$LIB/cmake/benchmark \
  -DCMAKE_PREFIX_PATH=$D/usr > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
el build
timeout 330 cmake --build $B -j16 --target kvsift_cuda_tests kvsift_cuda_bench kvsift_cuda_mixed kvsift-conformance-cuda >> $OUT/build.log 2>&1 \
  || { grep -E 'error' $OUT/build.log | head -30; tail -20 $OUT/build.log; exit 1; }
el tests
timeout 150 $B/cuda/kvsift_cuda_tests --reporter console --durations yes > $OUT/tests.log 2>&1; echo "tests exit $?"
grep -E "test cases|assertions|FAILED|failed|SKIPPED" $OUT/tests.log | head -40
timeout 30 $B/cuda/kvsift_cuda_mixed 2>&1 | tail -3
el conformance
KINDS=$(sed -n '/KVSIFT_CONFORMANCE_THRUST_KINDS/,/)/p' $ROOT/tests/conformance/kinds.cmake | grep -o '[a-z_]*\.[a-z_.0-9]*' | paste -sd, -)
timeout 150 $B/cuda/kvsift-conformance-cuda $ROOT/tests/conformance/vectors/cases --backend cuda --kinds "$KINDS" > $OUT/conformance-cuda.log 2>&1; echo "conformance exit $?"
tail -8 $OUT/conformance-cuda.log
el bench
timeout 200 $B/cuda/kvsift_cuda_bench --benchmark_out=$OUT/bench.json --benchmark_out_format=json 2>&1 | tee $OUT/bench.txt | grep -v "_mean\|_stddev\|_cv" 
el torch
timeout 120 python3 $ROOT/cuda/torch_reference.py --reps 50 --json $OUT/torch.json 2>&1 | tee $OUT/torch.txt
el sanitize
for tool in memcheck racecheck synccheck initcheck; do
  timeout ${SAN_T:-40} compute-sanitizer --tool $tool --error-exitcode 9 $B/cuda/kvsift_cuda_tests "[attention],[transfer],[graph],[topk]" > $OUT/san-$tool.log 2>&1
  echo "$tool exit $? : $(grep -E 'ERROR SUMMARY|test cases' $OUT/san-$tool.log | tr '\n' ' ')"
done
el done
