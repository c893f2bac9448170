# SPDX-License-Identifier: Apache-2.0
# ctest `cmake.cccl_discovery` (label `cmake`): kvsift_find_cccl (cmake/kvsiftFindCCCL.cmake)
# finds the CUDA toolkit's CCCL with no -DCCCL_DIR on a toolkit root laid out like CUDA 13's:
# cccl-config.cmake only under targets/<arch>/lib/cmake/cccl, no lib64/ and no lib/ at the root.
#
# The fake root is made in the build tree from the real toolkit (CUDA_ROOT, /usr/local/cuda):
#   <fake>/targets/<arch>/lib     -> the real directory that holds cmake/cccl
#   <fake>/targets/<arch>/include -> the real include directory (the config finds its headers
#                                    relative to itself: <config>/../../../include[/cccl])
#   <fake>/bin/nvcc               a script that runs the real nvcc
# tests/cccl_discovery/CMakeLists.txt is then configured once per scenario, with find_package's
# default search paths off (ISOLATE) so only the hints can find CCCL:
#   control   find_package(CCCL HINTS <fake>), as the call sites did before: must NOT find it
#   path      <fake>/bin first on PATH              -> CCCL_DIR under <fake>, headers resolved
#   compiler  -DCMAKE_CUDA_COMPILER=<fake>/bin/nvcc -> likewise
#   env_*     CUDAToolkit_ROOT / CUDA_PATH / CUDA_HOME=<fake> in the environment -> likewise
#   toolkit   CUDAToolkit_FOUND with CUDAToolkit_LIBRARY_DIR=<fake>/targets/<arch>/lib, as
#             find_package(CUDAToolkit) leaves them (set by hand: FindCUDAToolkit asks nvcc
#             for its root, and the fake nvcc runs the real one) -> likewise
#   required  REQUIRED with an unsatisfiable version: configure fails and the message lists
#             the fake root, its targets/ directory, and the config it rejected
#   system    no isolation, no hints given: this machine's own environment finds CCCL
# Prints "kvsift-cccl-discovery: SKIP" (ctest SKIP_REGULAR_EXPRESSION) when CUDA_ROOT has no
# CCCL config.
#
#   cmake -DKVSIFT_SOURCE_DIR=<repo> -DWORK_DIR=<dir> [-DCUDA_ROOT=/usr/local/cuda] -P run.cmake
cmake_minimum_required(VERSION 3.25)

if(NOT CUDA_ROOT)
  set(CUDA_ROOT /usr/local/cuda)
endif()
set(module "${KVSIFT_SOURCE_DIR}/cmake/kvsiftFindCCCL.cmake")
set(project_dir "${KVSIFT_SOURCE_DIR}/tests/cccl_discovery")

# ---- the real toolkit's CCCL config ------------------------------------------------------------
file(GLOB real_configs "${CUDA_ROOT}/targets/*/lib/cmake/cccl/cccl-config.cmake")
foreach(d lib64 lib)
  if(EXISTS "${CUDA_ROOT}/${d}/cmake/cccl/cccl-config.cmake")
    list(APPEND real_configs "${CUDA_ROOT}/${d}/cmake/cccl/cccl-config.cmake")
  endif()
endforeach()
if(NOT real_configs)
  message("kvsift-cccl-discovery: SKIP: no cccl-config.cmake under ${CUDA_ROOT}")
  return()
endif()
list(GET real_configs 0 real_config)
get_filename_component(real_config_dir "${real_config}" DIRECTORY)
file(REAL_PATH "${real_config_dir}/../.." real_lib)
file(REAL_PATH "${real_config_dir}/../../../include" real_include)
file(STRINGS "${real_config_dir}/cccl-config-version.cmake" major_line REGEX "set\\(CCCL_VERSION_MAJOR [0-9]+\\)")
string(REGEX MATCH "[0-9]+" major "${major_line}")
if(NOT major OR NOT EXISTS "${real_include}")
  message("kvsift-cccl-discovery: SKIP: cannot read the CCCL version or include dir at ${real_config_dir}")
  return()
endif()
set(request "${major}.0")
message("real CCCL ${major}.x config: ${real_config_dir}; lib ${real_lib}; include ${real_include}")

# ---- the fake root -----------------------------------------------------------------------------
string(TOLOWER "${CMAKE_HOST_SYSTEM_PROCESSOR}" proc)
if(proc MATCHES "^(aarch64|arm64)$")
  set(arch sbsa-linux)
elseif(proc MATCHES "^(ppc64le|powerpc64le)$")
  set(arch ppc64le-linux)
else()
  set(arch x86_64-linux)
endif()
set(fake "${WORK_DIR}/fake-cuda")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${fake}/targets/${arch}" "${fake}/bin")
file(CREATE_LINK "${real_lib}" "${fake}/targets/${arch}/lib" SYMBOLIC)
file(CREATE_LINK "${real_include}" "${fake}/targets/${arch}/include" SYMBOLIC)
set(real_nvcc "")
if(EXISTS "${CUDA_ROOT}/bin/nvcc")
  file(REAL_PATH "${CUDA_ROOT}/bin/nvcc" real_nvcc)
  file(WRITE "${fake}/bin/nvcc" "#!/bin/sh\nexec \"${real_nvcc}\" \"$@\"\n")
else()
  file(WRITE "${fake}/bin/nvcc" "#!/bin/sh\necho 'fake nvcc: no real nvcc to run' >&2\nexit 1\n")
endif()
file(CHMOD "${fake}/bin/nvcc" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
foreach(absent lib64 lib lib64/cmake lib/cmake)
  if(EXISTS "${fake}/${absent}")
    message(FATAL_ERROR "fake root has ${absent}/")
  endif()
endforeach()
if(NOT EXISTS "${fake}/targets/${arch}/lib/cmake/cccl/cccl-config.cmake")
  message(FATAL_ERROR "fake root: ${fake}/targets/${arch}/lib/cmake/cccl/cccl-config.cmake missing")
endif()

# ---- scenarios -----------------------------------------------------------------------------------
set(failures "")
# Variables that would point the search elsewhere; every scenario runs without them.
set(clean_env --unset=CUDA_PATH --unset=CUDA_HOME --unset=CUDAToolkit_ROOT --unset=CUDACXX
              --unset=CCCL_DIR --unset=CCCL_ROOT --unset=CMAKE_PREFIX_PATH)

# configure(<name> <expect: found|not-found|fail> ENV <k=v>... ARGS <-D...>...)
function(configure name expect)
  cmake_parse_arguments(c "" "" "ENV;ARGS" ${ARGN})
  set(bin "${WORK_DIR}/${name}")
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env ${clean_env} ${c_ENV}
            ${CMAKE_COMMAND} -S "${project_dir}" -B "${bin}" -DKVSIFT_FIND_CCCL=${module}
            -DFAKE_ROOT=${fake} ${c_ARGS}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(all "${out}${err}")
  set(ok TRUE)
  set(why "")
  if(expect STREQUAL "fail")
    if(rc EQUAL 0)
      set(ok FALSE)
      set(why "configure succeeded; expected it to fail")
    endif()
  elseif(NOT rc EQUAL 0)
    set(ok FALSE)
    set(why "configure failed (rc ${rc})")
  else()
    string(REGEX MATCH "kvsift-cccl-discovery: CCCL_FOUND=([^ ]*) CCCL_DIR=([^ ]*) THRUST_HEADERS=([a-z]*)" line "${all}")
    set(found "${CMAKE_MATCH_1}")
    set(dir "${CMAKE_MATCH_2}")
    set(headers "${CMAKE_MATCH_3}")
    if(NOT line)
      set(ok FALSE)
      set(why "no result line")
    elseif(expect STREQUAL "not-found")
      if(found)
        set(ok FALSE)
        set(why "CCCL found at ${dir}; expected not found")
      endif()
    else()
      if(NOT found)
        set(ok FALSE)
        set(why "CCCL not found")
      elseif(NOT headers STREQUAL "yes")
        set(ok FALSE)
        set(why "CCCL found at ${dir} but its targets carry no include dir with thrust/version.h")
      elseif(expect STREQUAL "found-fake" AND NOT dir MATCHES "^${fake}/targets/${arch}/lib/cmake/cccl/?$")
        set(ok FALSE)
        set(why "CCCL found at ${dir}; expected ${fake}/targets/${arch}/lib/cmake/cccl")
      endif()
    endif()
  endif()
  set(result_text "${all}" PARENT_SCOPE)
  if(ok AND expect STREQUAL "fail")
    message("PASS ${name}: configure failed, as expected")
  elseif(ok)
    message("PASS ${name}: CCCL_DIR=${dir}")
  else()
    message("FAIL ${name}: ${why}\n---- output ----\n${all}\n----------------")
    set(failures ${failures} ${name} PARENT_SCOPE)
  endif()
endfunction()

set(iso -DISOLATE=ON -DCCCL_REQUEST=${request})
configure(control not-found ARGS ${iso} -DMODE=control)
configure(path found-fake ENV "PATH=${fake}/bin:$ENV{PATH}" ARGS ${iso})
configure(compiler found-fake ARGS ${iso} -DCMAKE_CUDA_COMPILER=${fake}/bin/nvcc)
foreach(var CUDAToolkit_ROOT CUDA_PATH CUDA_HOME)
  configure(env_${var} found-fake ENV "${var}=${fake}" ARGS ${iso})
endforeach()
configure(toolkit found-fake ARGS ${iso} -DCUDAToolkit_FOUND=TRUE
          -DCUDAToolkit_LIBRARY_DIR=${fake}/targets/${arch}/lib)

configure(required fail ARGS ${iso} -DMODE=required -DCCCL_REQUEST=99.0 -DCMAKE_CUDA_COMPILER=${fake}/bin/nvcc)
foreach(needle "CCCL 99.0 (cccl-config.cmake) not found"
               "${fake}  (CMAKE_CUDA_COMPILER)"
               "${fake}/targets/${arch}/lib/cmake/cccl  (has cccl-config.cmake)"
               "Considered but not accepted")
  string(FIND "${result_text}" "${needle}" at)
  if(at EQUAL -1)
    message("FAIL required: the message does not contain \"${needle}\"\n---- output ----\n${result_text}\n----------------")
    list(APPEND failures required-message)
  endif()
endforeach()

configure(system found ARGS -DCCCL_REQUEST=${request})

if(failures)
  message(FATAL_ERROR "kvsift-cccl-discovery: failed: ${failures}")
endif()
message("kvsift-cccl-discovery: all scenarios passed")
