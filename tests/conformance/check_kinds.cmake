# SPDX-License-Identifier: Apache-2.0
# cmake -DRUNNER=<kvsift-conformance-thrust-*> -DEXPECTED=K1,K2,... -P check_kinds.cmake
# Fails unless `RUNNER --list-kinds --backend thrust` prints exactly the kinds of EXPECTED (any
# order): the Thrust kinds ctest runs (kinds.cmake) are the ones the runner has handlers for.
execute_process(COMMAND ${RUNNER} --list-kinds --backend thrust
                OUTPUT_VARIABLE listed ERROR_VARIABLE notes RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${RUNNER} --list-kinds --backend thrust exited ${rc}: ${notes}")
endif()
string(STRIP "${listed}" listed)
string(REPLACE "\n" ";" listed "${listed}")
string(REPLACE "," ";" expected "${EXPECTED}")
list(SORT listed)
list(SORT expected)
message(STATUS "thrust kinds: ${listed}")
message(STATUS "${notes}")
if(NOT listed STREQUAL expected)
  message(FATAL_ERROR "the runner's Thrust kinds differ from KVSIFT_CONFORMANCE_THRUST_KINDS\n"
                      "  runner:     ${listed}\n  kinds.cmake: ${expected}")
endif()
