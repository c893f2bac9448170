#!/bin/bash
set -o pipefail
ROOT=$PWD; B=/tmp/kvsift-gpu/build; D=/tmp/kvsift-gpu/deps
RES=${OUT:-/tmp/out}; OUT=/tmp/logs; mkdir -p "$RES" "$OUT" "$B" "$D"
LIB=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$LIB:$LD_LIBRARY_PATH
T0=$(date +%s); el() { tar czf $RES/logs.tgz -C /tmp logs 2>/dev/null; echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
for f in $ROOT/.device/*.deb; do dpkg -x "$f" $D; done
cmake -S $ROOT -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSIFT_ENABLE_CUDA=ON \
  -DKVSIFT_BUILD_TESTS=OFF -DKVSIFT_BUILD_BENCHMARKS=OFF -DKVSIFT_BUILD_EXAMPLES=OFF -DKVSIFT_ENABLE_THRUST=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCatch2_DIR=$LIB/cmake/Catch2 -DCMAKE_PREFIX_PATH=$D/usr > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
el build
timeout 100 cmake --build $B -j16 --target kvsift_cuda_tests >> $OUT/build.log 2>&1 || { grep error $OUT/build.log | head; exit 1; }
el sanitize
for tool in memcheck racecheck synccheck initcheck; do
  timeout 22 compute-sanitizer --tool $tool --error-exitcode 9 $B/cuda/kvsift_cuda_tests "[attention],[transfer]" > $OUT/san-$tool.log 2>&1
  echo "$tool exit $? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test cases' $OUT/san-$tool.log | tr '\n' ' ')"
done
el done
