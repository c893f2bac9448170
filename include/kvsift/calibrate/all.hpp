// SPDX-License-Identifier: Apache-2.0
#pragma once

// Offline head calibration for SyncKV and HeteroCache: profiling top-k sets, overlaps and
// stability, k-means and star clustering, and the head-roles file (docs/calibration.md).

#include <kvsift/calibrate/kmeans.hpp>
#include <kvsift/calibrate/overlap.hpp>
#include <kvsift/calibrate/profile.hpp>
#include <kvsift/calibrate/roles_file.hpp>
#include <kvsift/calibrate/star_cluster.hpp>
#include <kvsift/calibrate/topk_sets.hpp>
