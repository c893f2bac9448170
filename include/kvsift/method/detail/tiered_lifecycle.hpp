// SPDX-License-Identifier: Apache-2.0
#pragma once
// Transitional: moved to method/schedule/two_tier.hpp (removed with the hand-written classes).
#include <kvsift/method/schedule/two_tier.hpp>
