#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The fused decode attention compiled by an includer at -O2 and -O3 (g++) and -O2 (clang++),
# on the AVX-512 path and pinned to AVX2; run from the repository root:
#   bash docs/cpu-runs/2026-11-27-night/run_o2.sh [include dir, default include]
set -euo pipefail
inc="${1:-include}"
src="$(dirname "$0")/attend_group.cpp"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
g++ -std=gnu++20 -O2 -fopenmp -I"$inc" "$src" -o "$tmp/gcc_o2"
g++ -std=gnu++20 -O3 -fopenmp -I"$inc" "$src" -o "$tmp/gcc_o3"
clang++ -std=gnu++20 -O2 -fopenmp -I"$inc" "$src" -o "$tmp/clang_o2"
for simd in avx512 avx2; do
  for b in gcc_o2 gcc_o3 clang_o2; do
    printf '%-7s %-9s ' "$simd" "$b"
    if [ "$simd" = avx2 ]; then KVSIFT_SIMD=avx2 "$tmp/$b" 1024 2000; else "$tmp/$b" 1024 2000; fi
  done
done
