# SPDX-License-Identifier: Apache-2.0
# Warnings and sanitizers for the project's own targets (never added to kvsift::kvsift users).

set(KVSIFT_SANITIZE "" CACHE STRING "Sanitizers for the project's binaries, e.g. address,undefined")
# The tiered store's invariants checked at the end of every decode step (store::tiered::
# debug_verify); on by default in sanitizer builds.
if(KVSIFT_SANITIZE)
  set(_kvsift_check_default ON)
else()
  set(_kvsift_check_default OFF)
endif()
option(KVSIFT_CHECK_INVARIANTS "Check store invariants every decode step (debug)" ${_kvsift_check_default})

function(kvsift_project_target target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unknown-pragmas>)
  endif()
  if(KVSIFT_SANITIZE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${KVSIFT_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
    target_link_options(${target} PRIVATE -fsanitize=${KVSIFT_SANITIZE})
  endif()
  if(KVSIFT_CHECK_INVARIANTS)
    target_compile_definitions(${target} PRIVATE KVSIFT_CHECK_INVARIANTS)
  endif()
  if(KVSIFT_OPENMP_TARGET)
    target_link_libraries(${target} PRIVATE ${KVSIFT_OPENMP_TARGET})
  endif()
endfunction()
