# SPDX-License-Identifier: Apache-2.0
# ctest cli.eval_far: `kvsift eval --far attend` against `--far recall` on the first passkey and
# chain prompt of recall-8kv (SyncKV, HeteroCache, FreeKV at a resident share of 0.75): the same outputs;
# every item recalls nothing under attend and reads its host-pool rows where they lie (far_rows)
# exactly where recall moved bytes; the JSON names the policy of the call and of each run; over
# device memory (--exec thrust-cpp) attend gives the host's outputs, far rows and resident
# shares, 0 bytes recalled, and its far partials ran as a host task beside the device part
# (far_overlaps > 0 in every item; 0 on the host); a bad --far, and attend with the engine's kernel, are refused naming
# --far.
# Run as: cmake -DKVSIFT=<kvsift binary> -DSRC=<source dir> -DWORK=<scratch dir> -P eval_far_test.cmake
file(MAKE_DIRECTORY ${WORK})
set(methods synckv,heterocache,freekv)

foreach(far recall attend)
  execute_process(COMMAND ${KVSIFT} eval --model ${SRC}/data/recall-8kv --limit 1 --methods ${methods}
                          --budgets 0.75 --far ${far} --json-out ${WORK}/${far}.json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvsift eval --far ${far} failed (${rc}):\n${out}\n${err}")
  endif()
  file(READ ${WORK}/${far}.json json_${far})
  string(JSON named GET "${json_${far}}" far)
  if(NOT named STREQUAL far)
    message(FATAL_ERROR "--far ${far}: the JSON names far '${named}'")
  endif()
endforeach()

foreach(bad "--far;sideways" "--far;attend;--kernel;engine")
  execute_process(COMMAND ${KVSIFT} eval --model ${SRC}/data/recall-8kv --limit 1 ${bad}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT err MATCHES "--far")
    message(FATAL_ERROR "${bad}: expected an error naming --far, got (${rc}) ${err}")
  endif()
endforeach()

execute_process(COMMAND ${KVSIFT} eval --model ${SRC}/data/recall-8kv --limit 1 --methods ${methods}
                        --budgets 0.75 --far attend --exec thrust-cpp --json-out ${WORK}/device.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvsift eval --far attend --exec thrust-cpp failed (${rc}):\n${out}\n${err}")
endif()
file(READ ${WORK}/device.json json_device)

set(r "${json_recall}")
set(a "${json_attend}")
set(dv "${json_device}")
string(JSON runs LENGTH "${r}" runs)
math(EXPR last "${runs} - 1")
set(moved 0)
foreach(i RANGE ${last})
  string(JSON method GET "${r}" runs ${i} method)
  string(JSON fr GET "${r}" runs ${i} far)
  string(JSON fa GET "${a}" runs ${i} far)
  if(NOT fr STREQUAL "recall" OR NOT fa STREQUAL "attend")
    message(FATAL_ERROR "${method}: runs name far '${fr}' / '${fa}'")
  endif()
  string(JSON items LENGTH "${r}" runs ${i} items)
  math(EXPR last_item "${items} - 1")
  foreach(k RANGE ${last_item})
    string(JSON out_r GET "${r}" runs ${i} items ${k} output)
    string(JSON out_a GET "${a}" runs ${i} items ${k} output)
    if(NOT out_r STREQUAL out_a)
      message(FATAL_ERROR "${method} item ${k}: output '${out_r}' under recall, '${out_a}' under attend")
    endif()
    string(JSON bytes_r GET "${r}" runs ${i} items ${k} bytes_recalled)
    string(JSON bytes_a GET "${a}" runs ${i} items ${k} bytes_recalled)
    string(JSON rows_r GET "${r}" runs ${i} items ${k} far_rows)
    string(JSON rows_a GET "${a}" runs ${i} items ${k} far_rows)
    if(NOT bytes_a EQUAL 0 OR NOT rows_r EQUAL 0)
      message(FATAL_ERROR "${method} item ${k}: attend recalled ${bytes_a} bytes; recall attended ${rows_r} far rows")
    endif()
    if((bytes_r GREATER 0) AND NOT (rows_a GREATER 0))
      message(FATAL_ERROR "${method} item ${k}: recall moved ${bytes_r} bytes, attend read no far row")
    endif()
    if(bytes_r GREATER 0)
      math(EXPR moved "${moved} + 1")
    endif()
    string(JSON out_d GET "${dv}" runs ${i} items ${k} output)
    string(JSON bytes_d GET "${dv}" runs ${i} items ${k} bytes_recalled)
    string(JSON rows_d GET "${dv}" runs ${i} items ${k} far_rows)
    if(NOT out_d STREQUAL out_a OR NOT bytes_d EQUAL 0 OR NOT rows_d EQUAL rows_a)
      message(FATAL_ERROR "${method} item ${k} over device memory: output '${out_d}', ${bytes_d} "
                          "bytes recalled, ${rows_d} far rows; on the host '${out_a}', 0, ${rows_a}")
    endif()
    string(JSON overlaps_a GET "${a}" runs ${i} items ${k} far_overlaps)
    string(JSON overlaps_d GET "${dv}" runs ${i} items ${k} far_overlaps)
    if(NOT overlaps_a EQUAL 0 OR NOT overlaps_d GREATER 0)
      message(FATAL_ERROR "${method} item ${k}: far_overlaps ${overlaps_d} over device memory "
                          "(expected > 0: the host part beside the device part), ${overlaps_a} on "
                          "the host (expected 0)")
    endif()
    foreach(share resident_kv resident_kv_end)  # a far row's tier slot is not resident
      string(JSON share_a GET "${a}" runs ${i} items ${k} ${share})
      string(JSON share_d GET "${dv}" runs ${i} items ${k} ${share})
      if(NOT share_d STREQUAL share_a)
        message(FATAL_ERROR "${method} item ${k}: ${share} ${share_d} over device memory, "
                            "${share_a} on the host")
      endif()
    endforeach()
  endforeach()
endforeach()
if(moved EQUAL 0)
  message(FATAL_ERROR "no item recalled anything: the comparison says nothing")
endif()
message(STATUS "${moved} items recalled under recall; the same outputs under attend with nothing recalled")
