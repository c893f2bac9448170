// SPDX-License-Identifier: Apache-2.0
#include <kvsift/cuda/memory.cuh>
