// SPDX-License-Identifier: Apache-2.0
#include <kvsift/cuda/memory.cuh>
#include <benchmark/benchmark.h>
int main(int argc, char** argv) { benchmark::Initialize(&argc, argv); return 0; }
