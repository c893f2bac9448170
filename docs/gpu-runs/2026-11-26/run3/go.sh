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
timeout 300 cmake --build $B -j16 --target kvsift_cuda_bench kvsift-conformance-cuda >> $OUT/build.log 2>&1 \
  || { grep -E 'error' $OUT/build.log | head -30; tail -20 $OUT/build.log; exit 1; }
el conformance
KINDS=$(sed -n '/KVSIFT_CONFORMANCE_THRUST_KINDS/,/)/p' $ROOT/tests/conformance/kinds.cmake | grep -o '[a-z_]*\.[a-z_.0-9]*' | paste -sd, -)
timeout 90 $B/cuda/kvsift-conformance-cuda $ROOT/tests/conformance/vectors/cases --backend cuda --kinds "$KINDS" > $OUT/conformance-cuda.log 2>&1; echo "conformance exit $?"
grep -E "FAIL|passed" $OUT/conformance-cuda.log | tail -12
el memcheck
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 $B/cuda/kvsift-conformance-cuda $ROOT/tests/conformance/vectors/cases --backend cuda --kinds method.synckv.decode,method.freekv.decode,method.heterocache.decode,method.heterocache.prefill > $OUT/mc-tiered.log 2>&1
echo "memcheck exit $? : $(grep -E 'ERROR SUMMARY|passed' $OUT/mc-tiered.log | tr '\n' ' ')"
el bench
timeout 100 $B/cuda/kvsift_cuda_bench --benchmark_filter='ref/|topk|recall' --benchmark_out=$OUT/bench.json --benchmark_out_format=json 2>&1 | tee $OUT/bench.txt | grep -E "median|limits"
el torch
timeout 60 python3 $ROOT/cuda/torch_reference.py --only topk --reps 50 --json $OUT/torch.json 2>&1 | tee $OUT/torch.txt
el done
