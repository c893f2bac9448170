# SPDX-License-Identifier: Apache-2.0
# ctest cli.eval_exec: `kvsift eval --exec EXEC` (a simulated device) against `--exec host` on the
# first passkey and chain prompt of tiny-recall at a resident share of 0.625 (SyncKV's
# representatives alone are half the KV, so 0.25 is infeasible for it): each one-tier method
# gives the same outputs, resident shares, per-layer budgets and parameters, and so do SyncKV
# (with the model's shipped roles) and FreeKV; HeteroCache (every head of tiny-recall is
# volatile, so 0.625 is infeasible for its roles) reports the same error on both; the JSON names
# the exec. Then --store paged: the one-tier methods over a paged device store
# (thrust::paged_store) give the host's outputs over store::paged.
# Run as: cmake -DKVSIFT=<kvsift binary> -DSRC=<source dir> -DWORK=<scratch dir> -DEXEC=thrust-omp
#         -P eval_exec_test.cmake
file(MAKE_DIRECTORY ${WORK})
set(methods snapkv,h2o,streaming_llm,quest,lagkv,dynamickv,synckv,freekv,heterocache)

foreach(exec host ${EXEC})
  execute_process(COMMAND ${KVSIFT} eval --model ${SRC}/data/tiny-recall --limit 1 --methods ${methods}
                          --budgets 0.625 --exec ${exec} --json-out ${WORK}/${exec}.json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvsift eval --exec ${exec} failed (${rc}):\n${out}\n${err}")
  endif()
  file(READ ${WORK}/${exec}.json json_${exec})
  string(JSON named GET "${json_${exec}}" exec)
  if(NOT named STREQUAL exec)
    message(FATAL_ERROR "--exec ${exec}: the JSON names exec '${named}'")
  endif()
endforeach()

set(h "${json_host}")
set(d "${json_${EXEC}}")
string(JSON runs LENGTH "${h}" runs)
string(JSON runs_d LENGTH "${d}" runs)
if(NOT runs EQUAL 9 OR NOT runs_d EQUAL 9)
  message(FATAL_ERROR "expected 9 runs on each exec, got ${runs} and ${runs_d}")
endif()
math(EXPR last "${runs} - 1")
set(compared 0)
foreach(i RANGE ${last})
  string(JSON method GET "${h}" runs ${i} method)
  string(JSON eh ERROR_VARIABLE host_ok GET "${h}" runs ${i} error)
  string(JSON ed ERROR_VARIABLE device_ok GET "${d}" runs ${i} error)
  if(NOT host_ok OR NOT device_ok)  # a run that did not run: the same error on both
    if(NOT method STREQUAL "heterocache")
      message(FATAL_ERROR "${method}: not run (host '${eh}', ${EXEC} '${ed}')")
    endif()
    if(NOT eh STREQUAL ed OR NOT eh MATCHES "infeasible")
      message(FATAL_ERROR "${method}: expected the same infeasibility on both, got host '${eh}', ${EXEC} '${ed}'")
    endif()
    math(EXPR compared "${compared} + 1")
    continue()
  endif()
  string(JSON items LENGTH "${h}" runs ${i} items)
  if(NOT items EQUAL 2)
    message(FATAL_ERROR "${method}: expected 2 prompts on the host, got ${items}")
  endif()
  math(EXPR last_item "${items} - 1")
  foreach(k RANGE ${last_item})
    foreach(field output resident_kv resident_kv_end layer_budgets params budget_tokens)
      string(JSON a GET "${h}" runs ${i} items ${k} ${field})
      string(JSON b GET "${d}" runs ${i} items ${k} ${field})
      if(NOT a STREQUAL b)
        message(FATAL_ERROR "${method}, prompt ${k}: ${field} differs: host '${a}', ${EXEC} '${b}'")
      endif()
      math(EXPR compared "${compared} + 1")
    endforeach()
  endforeach()
endforeach()
message(STATUS "kvsift eval --exec ${EXEC} equals --exec host: ${compared} fields compared")

# --store paged on the device exec (thrust::paged_store) against the host's store::paged: the
# one-tier methods give the same outputs; each run names the store and holds pages
set(paged_methods streaming_llm,h2o,snapkv,quest,lagkv)
foreach(exec host ${EXEC})
  execute_process(COMMAND ${KVSIFT} eval --model ${SRC}/data/tiny-recall --limit 1 --methods ${paged_methods}
                          --budgets 0.25 --match budget --store paged --page-size 8 --exec ${exec}
                          --json-out ${WORK}/paged-${exec}.json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvsift eval --store paged --exec ${exec} failed (${rc}):\n${out}\n${err}")
  endif()
  file(READ ${WORK}/paged-${exec}.json paged_${exec})
endforeach()
set(h "${paged_host}")
set(d "${paged_${EXEC}}")
string(JSON runs LENGTH "${h}" runs)
math(EXPR last "${runs} - 1")
foreach(i RANGE ${last})
  string(JSON method GET "${h}" runs ${i} method)
  string(JSON store GET "${d}" runs ${i} store)
  if(NOT store STREQUAL "paged")
    message(FATAL_ERROR "${method}: --store paged --exec ${EXEC} ran over '${store}'")
  endif()
  string(JSON items LENGTH "${h}" runs ${i} items)
  math(EXPR last_item "${items} - 1")
  foreach(k RANGE ${last_item})
    string(JSON a GET "${h}" runs ${i} items ${k} output)
    string(JSON b GET "${d}" runs ${i} items ${k} output)
    if(NOT a STREQUAL b)
      message(FATAL_ERROR "${method}, prompt ${k}: paged output differs: host '${a}', ${EXEC} '${b}'")
    endif()
    string(JSON peak GET "${d}" runs ${i} items ${k} peak_pages)
    string(JSON full GET "${d}" runs ${i} items ${k} full_pages)
    if(peak LESS_EQUAL 0 OR peak GREATER full)
      message(FATAL_ERROR "${method}, prompt ${k}: ${EXEC} peak_pages ${peak} of full_pages ${full}")
    endif()
  endforeach()
endforeach()
message(STATUS "kvsift eval --store paged --exec ${EXEC} equals --exec host on ${runs} methods")
