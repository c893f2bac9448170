// SPDX-License-Identifier: Apache-2.0
// kvsift::synckv<T, E> names the method over the default two-tier store in E's memory. For a
// device exec that store is thrust::tiered_store, declared by <kvsift/device/all.hpp>; without it
// the alias says which header to include instead of falling back to a host store.
// expect-error: no two-tier store in this exec's memory is declared
#include <kvsift/method/synckv.hpp>
#include <kvsift/thrust/exec.hpp>

using m = kvsift::synckv<float, kvsift::exec::sim_cpp>;

int main() { return sizeof(m) > 0 ? 0 : 1; }
