#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite, as CI runs it on a fresh Debian bookworm machine:
#   1. setup (scripts/setup.sh)
#   2. release build: unit/law tests, conformance vectors, Thrust parity (CPP + OMP), compile-fail
#   3. sanitizer build (clang++ -O0, the longest-running tests -O1; ASan + UBSan): the same tests;
#      fuzz targets (clang libFuzzer, fuzz/)
#   4. installed package: `cmake --install`, then tests/consumer builds against find_package(kvsift)
#   5. CUDA build with nvcc for sm_80 and sm_90 (when /usr/local/cuda exists); GPU tests run and
#      report skipped without a device
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
# Each step's wall time, so a slow CI run says where its minutes went.
step_start=$SECONDS
step() {
  echo "== [$((SECONDS - step_start)) s] $*"
  step_start=$SECONDS
}

bash scripts/setup.sh

step "setup done; release build and tests"
cmake --preset release
cmake --build --preset release -j "$JOBS"
step "release built; its tests"
ctest --preset release -j "$JOBS"

step "release done; sanitizer build (clang++, ASan + UBSan) and tests"
cmake --preset sanitize
cmake --build --preset sanitize -j "$JOBS"
step "sanitizer build done; its tests"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --preset sanitize -j "$JOBS" -LE compile_fail

step "sanitizer done; fuzzing (clang libFuzzer + ASan + UBSan, KVSIFT_FUZZ_SECONDS=${KVSIFT_FUZZ_SECONDS:-60} s per target)"
cmake --preset fuzz -DKVSIFT_FUZZ_SECONDS="${KVSIFT_FUZZ_SECONDS:-60}"
cmake --build --preset fuzz -j "$JOBS"
# The fuzzers are single-threaded, each with its own corpus folder: one per core.
ctest --test-dir build/fuzz -L fuzz --output-on-failure -j "$JOBS"

step "fuzzing done; installed package consumer"
rm -rf build/install build/consumer
cmake --install build/release --prefix build/install
cmake -S tests/consumer -B build/consumer -DCMAKE_PREFIX_PATH="$PWD/build/install"
cmake --build build/consumer -j "$JOBS"
./build/consumer/kvsift_consumer

if [ -x /usr/local/cuda/bin/nvcc ]; then
  step "consumer done; CUDA backend (nvcc, sm_80 + sm_90)"
  cmake --preset cuda
  cmake --build --preset cuda -j "$JOBS"
  step "CUDA built; its tests"
  ctest --test-dir build/cuda -L cuda --output-on-failure
else
  echo "== CUDA backend skipped: no nvcc at /usr/local/cuda/bin/nvcc"
fi
step "all tests passed (${SECONDS} s in all)"
