#!/bin/bash
# Second device call: per-kind CUDA conformance (memcheck on failures), attention bench + torch,
# racecheck on the graph test and the attention test.
set -o pipefail
ROOT=$PWD; B=/tmp/kvsift-gpu/build; D=/tmp/kvsift-gpu/deps
RES=${OUT:-/tmp/out}; OUT=/tmp/logs; mkdir -p "$RES" "$OUT" "$B" "$D"
LIB=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$LIB:$LD_LIBRARY_PATH
T0=$(date +%s); el() { tar czf $RES/logs.tgz -C /tmp logs 2>/dev/null; echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
for f in $ROOT/.device/*.deb; do dpkg -x "$f" $D; done
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
el configure
cmake -S $ROOT -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSIFT_ENABLE_CUDA=ON \
  -DKVSIFT_BUILD_TESTS=OFF -DKVSIFT_BUILD_BENCHMARKS=OFF -DKVSIFT_BUILD_EXAMPLES=OFF -DKVSIFT_ENABLE_THRUST=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=$NVCC \
  -DCatch2_DIR=$LIB/cmake/Catch2 -Dbenchmark_DIR=$LIB/cmake/benchmark \
  -DCMAKE_PREFIX_PATH=$D/usr > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
el build
timeout 300 cmake --build $B -j16 --target kvsift_cuda_tests kvsift_cuda_bench kvsift-conformance-cuda >> $OUT/build.log 2>&1 \
  || { grep -E 'error' $OUT/build.log | head -30; tail -20 $OUT/build.log; exit 1; }
el tests
timeout 100 $B/cuda/kvsift_cuda_tests > $OUT/tests.log 2>&1; echo "tests exit $?"; grep -E "test cases|assertions|FAILED" $OUT/tests.log | head -20
el conformance
KINDS=$(sed -n '/KVSIFT_CONFORMANCE_THRUST_KINDS/,/)/p' $ROOT/tests/conformance/kinds.cmake | grep -o '[a-z_]*\.[a-z_.0-9]*')
bad=""
for k in $KINDS; do
  timeout 30 $B/cuda/kvsift-conformance-cuda $ROOT/tests/conformance/vectors/cases --backend cuda --kinds $k > $OUT/conf-$k.log 2>&1; rc=$?
  echo "$k rc=$rc $(tail -1 $OUT/conf-$k.log | cut -c1-150)"
  [ $rc -ne 0 ] && bad="$bad $k"
done
n=0
for k in $bad; do
  n=$((n+1)); [ $n -gt ${MAXBAD:-4} ] && break
  echo "== memcheck $k"
  timeout 60 compute-sanitizer --tool memcheck --show-backtrace device --print-limit 3 $B/cuda/kvsift-conformance-cuda $ROOT/tests/conformance/vectors/cases --backend cuda --kinds $k > $OUT/mc-$k.log 2>&1
  grep -E "Invalid|at .*0x|by thread|Address|in .*thrust|kvsift" $OUT/mc-$k.log | head -14 | cut -c1-400
done
el bench
timeout 120 $B/cuda/kvsift_cuda_bench --benchmark_filter='ref/hbm|sparse_attention' --benchmark_out=$OUT/bench.json --benchmark_out_format=json 2>&1 | tee $OUT/bench.txt | grep -E "median|limits"
el torch
timeout 90 python3 $ROOT/cuda/torch_reference.py --only attention --reps 50 --json $OUT/torch.json 2>&1 | tee $OUT/torch.txt
el racecheck
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 $B/cuda/kvsift_cuda_tests "[graph]" > $OUT/san-racecheck.log 2>&1
echo "racecheck exit $? : $(grep -E 'ERROR SUMMARY|test cases|RACECHECK SUMMARY' $OUT/san-racecheck.log | tr '\n' ' ')"
el done
