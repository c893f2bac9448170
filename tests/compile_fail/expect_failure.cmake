# SPDX-License-Identifier: Apache-2.0
# Compile-fail check: cmake -DCXX=<compiler> -DSRC=<file.cpp> -DINCLUDE=<include dir>
#                      [-DSYSTEM_INCLUDES=<dir>|<dir>...] [-DDEFINES=<NAME=VALUE>|...]
#                      -P expect_failure.cmake
# (SYSTEM_INCLUDES and DEFINES, `|`-separated, for the files that need the CCCL headers and a
# THRUST_DEVICE_SYSTEM, compile_fail/thrust/*.cpp.)
# SRC must FAIL to compile (-std=c++20 -fsyntax-only), and the compiler output must match the
# regex given in SRC by a `// expect-error: <regex>` comment.
foreach(var CXX SRC INCLUDE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "expect_failure.cmake: -D${var}=... is required")
  endif()
endforeach()

file(STRINGS "${SRC}" expect_lines REGEX "//[ ]*expect-error:")
if(NOT expect_lines)
  message(FATAL_ERROR "${SRC}: no `// expect-error: <regex>` comment")
endif()
list(GET expect_lines 0 expect_line)
string(REGEX REPLACE "^.*//[ ]*expect-error:[ ]*" "" expect_regex "${expect_line}")
string(STRIP "${expect_regex}" expect_regex)
if(expect_regex STREQUAL "")
  message(FATAL_ERROR "${SRC}: empty expect-error regex")
endif()

set(extra_flags "")
if(DEFINED SYSTEM_INCLUDES AND NOT SYSTEM_INCLUDES STREQUAL "")
  string(REPLACE "|" ";" dirs "${SYSTEM_INCLUDES}")
  foreach(dir ${dirs})
    list(APPEND extra_flags -isystem "${dir}")
  endforeach()
endif()
if(DEFINED DEFINES AND NOT DEFINES STREQUAL "")
  string(REPLACE "|" ";" defs "${DEFINES}")
  foreach(def ${defs})
    list(APPEND extra_flags "-D${def}")
  endforeach()
endif()

execute_process(
  COMMAND "${CXX}" -std=c++20 -fsyntax-only "-I${INCLUDE}" ${extra_flags} "${SRC}"
  RESULT_VARIABLE result
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err)
set(all "${out}${err}")

if(result EQUAL 0)
  message(FATAL_ERROR "${SRC} compiled, but it must fail to compile")
endif()
if(NOT all MATCHES "${expect_regex}")
  message(FATAL_ERROR "${SRC} failed to compile, but the diagnostics do not match "
                      "'${expect_regex}':\n${all}")
endif()
message(STATUS "${SRC}: fails to compile as expected (matched '${expect_regex}')")
