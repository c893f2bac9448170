#!/usr/bin/env bash
# ../2026-11-29b/passes.cpp on the AVX2 kernels (one GQA group, 4 heads, head_dim 128, one
# thread: attend_group, its logits pass, its value pass), ELEM = float, bfloat16 or half:
#   bash passes-avx2.sh bfloat16 && ./passes-bfloat16 ROWS REPS   (GB/s of the bytes each reads)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sed -e 's/detail::avx512/detail::avx2/' -e 's/using T = bfloat16;/using T = ELEM;/' \
    -e 's/logits_block<4, T, true>/logits_block<4, T>/' \
    -e 's/accumulate_heads<4, T, true>(w.data(), m, inv.data(), d, m, value, out.data())/accumulate_heads<4, T>(w.data(), m, d, m, vr.data(), out.data())/' \
    "${here}/../2026-11-29b/passes.cpp" > "/tmp/passes-avx2.cpp"
g++ -std=c++20 -O3 -DNDEBUG -march=native -fopenmp -DELEM="$1" -I"${here}/../../../include" \
    /tmp/passes-avx2.cpp -o "passes-$1"
