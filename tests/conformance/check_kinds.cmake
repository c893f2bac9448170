# SPDX-License-Identifier: Apache-2.0
# cmake -DRUNNER=<runner> [-DBACKEND=thrust|cuda] -DEXPECTED=K1,K2,... -P check_kinds.cmake
# Fails unless `RUNNER --list-kinds --backend BACKEND` (thrust by default) prints exactly the kinds
# of EXPECTED (any order): the kinds ctest runs (kinds.cmake) are the ones the runner has
# handlers for.
if(NOT DEFINED BACKEND)
  set(BACKEND thrust)
endif()
execute_process(COMMAND ${RUNNER} --list-kinds --backend ${BACKEND}
                OUTPUT_VARIABLE listed ERROR_VARIABLE notes RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${RUNNER} --list-kinds --backend ${BACKEND} exited ${rc}: ${notes}")
endif()
string(STRIP "${listed}" listed)
string(REPLACE "\n" ";" listed "${listed}")
string(REPLACE "," ";" expected "${EXPECTED}")
list(SORT listed)
list(SORT expected)
message(STATUS "${BACKEND} kinds: ${listed}")
message(STATUS "${notes}")
if(NOT listed STREQUAL expected)
  message(FATAL_ERROR "the runner's ${BACKEND} kinds differ from KVSIFT_CONFORMANCE_THRUST_KINDS\n"
                      "  runner:     ${listed}\n  kinds.cmake: ${expected}")
endif()
