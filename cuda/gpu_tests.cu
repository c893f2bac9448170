// SPDX-License-Identifier: Apache-2.0
#include <kvsift/cuda/memory.cuh>
#include <catch2/catch_test_macros.hpp>
TEST_CASE("x", "[cuda]") { if (kvsift::cuda::device_count() == 0) { SKIP("no CUDA device"); } }
