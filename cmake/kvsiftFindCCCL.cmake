# SPDX-License-Identifier: Apache-2.0
# kvsift_find_cccl(<version> [REQUIRED] [QUIET]): find_package(CCCL <version> CONFIG) with hints
# derived from the CUDA toolkit, so that no -DCCCL_DIR is needed on the usual layouts.
#
# Used by cuda/CMakeLists.txt, tests/CMakeLists.txt (Thrust parity tests, built by the host
# compiler) and the installed kvsiftConfig.cmake (kvsift::cuda); installed next to it.
#
# Toolkit roots, in this order (duplicates dropped):
#   1. CUDAToolkit_LIBRARY_DIR, CUDAToolkit_TARGET_DIR, CUDAToolkit_LIBRARY_ROOT, CUDAToolkit_BIN_DIR/..
#      when find_package(CUDAToolkit) has run and succeeded;
#   2. CMAKE_CUDA_COMPILER, then $ENV{CUDACXX}: <root>/bin/nvcc -> <root> (also with symlinks resolved);
#   3. CUDAToolkit_ROOT (variable, then environment), $ENV{CUDA_PATH}, $ENV{CUDA_HOME};
#   4. nvcc on PATH, then /usr/local/cuda/bin/nvcc (also with symlinks resolved).
# For each root, the directories that hold cccl-config.cmake on the toolkit layouts:
#   <root>/targets/<arch>/lib/cmake/cccl   CUDA 12.x and 13.x runfile/deb/conda (<arch>: x86_64-linux,
#                                          sbsa-linux, aarch64-linux, ppc64le-linux; any other
#                                          existing targets/* entry after those)
#   <root>/lib64/cmake/cccl                CUDA 12.x/13.x where lib64 -> targets/<arch>/lib
#   <root>/lib/cmake/cccl                  pip-assembled toolkits, standalone CCCL installs
# CUDA 12.x toolkits ship CCCL 2.x (found there, then rejected by a 3.x version request); CUDA
# 13.x ships CCCL 3.x.
#
# The usual overrides still come first (find_package searches them before HINTS): -DCCCL_DIR=,
# CCCL_ROOT, CMAKE_PREFIX_PATH.
#
# Results, in the caller's scope: what find_package(CCCL) sets (CCCL_FOUND, CCCL_DIR,
# CCCL_VERSION, the CCCL:: targets); KVSIFT_CCCL_HINTS (the directories tried); and, when CCCL was
# not found, KVSIFT_CCCL_NOT_FOUND_MESSAGE (where it looked and what it considered). REQUIRED
# stops with that message; otherwise it is printed as STATUS unless QUIET.

include_guard(GLOBAL)

# _kvsift_cccl_add_root(<roots-var> <sources-var> <root> <source>): append a toolkit root once.
function(_kvsift_cccl_add_root roots_var sources_var root source)
  if(NOT root)
    return()
  endif()
  file(TO_CMAKE_PATH "${root}" root)
  string(REGEX REPLACE "/+$" "" root "${root}")
  if(root STREQUAL "")
    return()
  endif()
  set(roots ${${roots_var}})
  set(sources ${${sources_var}})
  if(NOT root IN_LIST roots)
    list(APPEND roots "${root}")
    list(APPEND sources "${source}")
  endif()
  set(${roots_var} ${roots} PARENT_SCOPE)
  set(${sources_var} ${sources} PARENT_SCOPE)
endfunction()

# _kvsift_cccl_add_nvcc(<roots-var> <sources-var> <nvcc> <source>): <root>/bin/nvcc -> <root>,
# as given and with symlinks resolved (e.g. /usr/bin/nvcc -> /opt/cuda-13.0/bin/nvcc).
function(_kvsift_cccl_add_nvcc roots_var sources_var nvcc source)
  if(NOT nvcc)
    return()
  endif()
  # CUDACXX may carry arguments after the path; keep the first word.
  if(NOT EXISTS "${nvcc}")
    separate_arguments(words NATIVE_COMMAND "${nvcc}")
    if(NOT words)
      return()
    endif()
    list(GET words 0 nvcc)
  endif()
  if(NOT IS_ABSOLUTE "${nvcc}")
    find_program(found_nvcc NAMES "${nvcc}" NO_CACHE PATHS ENV PATH NO_DEFAULT_PATH NO_CMAKE_FIND_ROOT_PATH)
    if(NOT found_nvcc)
      return()
    endif()
    set(nvcc "${found_nvcc}")
  endif()
  set(roots ${${roots_var}})
  set(sources ${${sources_var}})
  get_filename_component(bin "${nvcc}" DIRECTORY)
  get_filename_component(root "${bin}" DIRECTORY)
  _kvsift_cccl_add_root(roots sources "${root}" "${source}")
  if(EXISTS "${nvcc}")
    file(REAL_PATH "${nvcc}" real)
    get_filename_component(bin "${real}" DIRECTORY)
    get_filename_component(root "${bin}" DIRECTORY)
    _kvsift_cccl_add_root(roots sources "${root}" "${source}, symlinks resolved")
  endif()
  set(${roots_var} ${roots} PARENT_SCOPE)
  set(${sources_var} ${sources} PARENT_SCOPE)
endfunction()

# kvsift_cccl_hints(<hints-var> [<description-var>]): the cccl-config.cmake directories to try,
# and a multi-line description (one line per toolkit root: the root, where the root came from).
function(kvsift_cccl_hints hints_var)
  set(roots "")
  set(sources "")
  set(hints "")

  if(CUDAToolkit_FOUND)
    # The library directory itself is where the toolkit keeps cmake/cccl on every CUDA 12/13 layout.
    if(CUDAToolkit_LIBRARY_DIR)
      list(APPEND hints "${CUDAToolkit_LIBRARY_DIR}/cmake/cccl")
    endif()
    if(CUDAToolkit_TARGET_DIR)
      list(APPEND hints "${CUDAToolkit_TARGET_DIR}/lib/cmake/cccl" "${CUDAToolkit_TARGET_DIR}/lib64/cmake/cccl")
    endif()
    _kvsift_cccl_add_root(roots sources "${CUDAToolkit_LIBRARY_ROOT}" "CUDAToolkit_LIBRARY_ROOT")
    if(CUDAToolkit_BIN_DIR)
      get_filename_component(root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
      _kvsift_cccl_add_root(roots sources "${root}" "CUDAToolkit_BIN_DIR/..")
    endif()
  endif()

  _kvsift_cccl_add_nvcc(roots sources "${CMAKE_CUDA_COMPILER}" "CMAKE_CUDA_COMPILER")
  _kvsift_cccl_add_nvcc(roots sources "$ENV{CUDACXX}" "environment CUDACXX")
  _kvsift_cccl_add_root(roots sources "${CUDAToolkit_ROOT}" "CUDAToolkit_ROOT")
  _kvsift_cccl_add_root(roots sources "$ENV{CUDAToolkit_ROOT}" "environment CUDAToolkit_ROOT")
  _kvsift_cccl_add_root(roots sources "$ENV{CUDA_PATH}" "environment CUDA_PATH")
  _kvsift_cccl_add_root(roots sources "$ENV{CUDA_HOME}" "environment CUDA_HOME")
  # PATH only (an explicit PATHS ENV PATH, so CMAKE_FIND_USE_* settings do not turn it off).
  find_program(path_nvcc NAMES nvcc NO_CACHE PATHS ENV PATH NO_DEFAULT_PATH NO_CMAKE_FIND_ROOT_PATH)
  _kvsift_cccl_add_nvcc(roots sources "${path_nvcc}" "nvcc on PATH")
  _kvsift_cccl_add_nvcc(roots sources "/usr/local/cuda/bin/nvcc" "default /usr/local/cuda")
  _kvsift_cccl_add_root(roots sources "/usr/local/cuda" "default /usr/local/cuda")

  # targets/<arch> names of the CUDA toolkit for the target processor, most likely first.
  string(TOLOWER "${CMAKE_SYSTEM_PROCESSOR}" proc)
  if(proc STREQUAL "")
    string(TOLOWER "${CMAKE_HOST_SYSTEM_PROCESSOR}" proc)
  endif()
  if(proc MATCHES "^(aarch64|arm64)$")
    set(arches sbsa-linux aarch64-linux)
  elseif(proc MATCHES "^(ppc64le|powerpc64le)$")
    set(arches ppc64le-linux)
  else()
    set(arches x86_64-linux)
  endif()

  set(description "")
  foreach(root source IN ZIP_LISTS roots sources)
    foreach(arch IN LISTS arches)
      list(APPEND hints "${root}/targets/${arch}/lib/cmake/cccl")
    endforeach()
    file(GLOB other_targets LIST_DIRECTORIES true "${root}/targets/*/lib/cmake/cccl")
    list(SORT other_targets)
    list(APPEND hints ${other_targets} "${root}/lib64/cmake/cccl" "${root}/lib/cmake/cccl")
    string(APPEND description "\n    ${root}  (${source})")
  endforeach()
  list(REMOVE_DUPLICATES hints)

  set(${hints_var} ${hints} PARENT_SCOPE)
  if(ARGC GREATER 1)
    set(${ARGV1} "${description}" PARENT_SCOPE)
  endif()
endfunction()

# A macro, not a function: find_package(CCCL) must set its variables in the caller's scope.
macro(kvsift_find_cccl _kvsift_cccl_version)
  cmake_parse_arguments(_kvsift_cccl "REQUIRED;QUIET" "" "" ${ARGN})
  if(_kvsift_cccl_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "kvsift_find_cccl: unexpected arguments ${_kvsift_cccl_UNPARSED_ARGUMENTS}")
  endif()
  kvsift_cccl_hints(KVSIFT_CCCL_HINTS _kvsift_cccl_roots)
  # QUIET here: a failure is reported below, with the list of places tried.
  find_package(CCCL ${_kvsift_cccl_version} CONFIG QUIET HINTS ${KVSIFT_CCCL_HINTS})
  unset(KVSIFT_CCCL_NOT_FOUND_MESSAGE)
  if(NOT CCCL_FOUND)
    set(KVSIFT_CCCL_NOT_FOUND_MESSAGE
        "kvsift: CCCL ${_kvsift_cccl_version} (cccl-config.cmake) not found. Toolkit roots tried:${_kvsift_cccl_roots}\n  Directories tried:")
    foreach(_kvsift_cccl_dir IN LISTS KVSIFT_CCCL_HINTS)
      if(EXISTS "${_kvsift_cccl_dir}/cccl-config.cmake")
        string(APPEND KVSIFT_CCCL_NOT_FOUND_MESSAGE "\n    ${_kvsift_cccl_dir}  (has cccl-config.cmake)")
      else()
        string(APPEND KVSIFT_CCCL_NOT_FOUND_MESSAGE "\n    ${_kvsift_cccl_dir}")
      endif()
    endforeach()
    if(CCCL_CONSIDERED_CONFIGS)
      string(APPEND KVSIFT_CCCL_NOT_FOUND_MESSAGE "\n  Considered but not accepted:")
      foreach(_kvsift_cccl_dir _kvsift_cccl_v IN ZIP_LISTS CCCL_CONSIDERED_CONFIGS CCCL_CONSIDERED_VERSIONS)
        string(APPEND KVSIFT_CCCL_NOT_FOUND_MESSAGE "\n    ${_kvsift_cccl_dir} (version ${_kvsift_cccl_v})")
      endforeach()
      string(APPEND KVSIFT_CCCL_NOT_FOUND_MESSAGE
             "\n  CCCL accepts a request for ${_kvsift_cccl_version} only from the same major version, no older. CUDA 12.x toolkits ship CCCL 2.x, CUDA 13.x ships 3.x; a standalone CCCL release also works.")
    endif()
    string(APPEND KVSIFT_CCCL_NOT_FOUND_MESSAGE
           "\n  Point -DCCCL_DIR=<dir with cccl-config.cmake> (or CMAKE_PREFIX_PATH, or CUDAToolkit_ROOT) at another CCCL.")
    if(_kvsift_cccl_REQUIRED)
      message(FATAL_ERROR "${KVSIFT_CCCL_NOT_FOUND_MESSAGE}")
    elseif(NOT _kvsift_cccl_QUIET)
      message(STATUS "${KVSIFT_CCCL_NOT_FOUND_MESSAGE}")
    endif()
  elseif(NOT _kvsift_cccl_QUIET)
    message(STATUS "kvsift: CCCL ${CCCL_VERSION} from ${CCCL_DIR}")
  endif()
  unset(_kvsift_cccl_roots)
  unset(_kvsift_cccl_dir)
  unset(_kvsift_cccl_v)
  unset(_kvsift_cccl_REQUIRED)
  unset(_kvsift_cccl_QUIET)
  unset(_kvsift_cccl_UNPARSED_ARGUMENTS)
endmacro()
