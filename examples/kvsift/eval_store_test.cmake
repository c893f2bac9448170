# SPDX-License-Identifier: Apache-2.0
# ctest cli.eval_store: `kvsift eval --store paged` against `--store dense` on the first passkey
# and chain prompt of tiny-recall at a kept share of 0.25 (--match budget): every one-tier method
# gives the same outputs over store::paged as over store::dense; the JSON names the store of the
# call and of each run (FreeKV: tiered, whatever --store says); each paged run reports, per prompt
# and summed, the most pages held at once (peak_pages) and a full cache's pages (full_pages), with
# full_kv and Quest holding exactly a full cache's pages, no method more, and the methods whose
# round follows each layer's prefill (StreamingLLM, H2O, SnapKV, PyramidKV) fewer. --store tiered
# is refused with a one-tier method and names the store of a FreeKV call.
# Run as: cmake -DKVSIFT=<kvsift binary> -DSRC=<source dir> -DWORK=<scratch dir> -P eval_store_test.cmake
file(MAKE_DIRECTORY ${WORK})
set(methods full_kv,streaming_llm,h2o,snapkv,pyramidkv,quest,lagkv,dynamickv,freekv)

foreach(store dense paged)
  execute_process(COMMAND ${KVSIFT} eval --model ${SRC}/data/tiny-recall --limit 1 --methods ${methods}
                          --budgets 0.25 --match budget --store ${store} --page-size 8
                          --json-out ${WORK}/${store}.json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvsift eval --store ${store} failed (${rc}):\n${out}\n${err}")
  endif()
  file(READ ${WORK}/${store}.json json_${store})
  string(JSON named GET "${json_${store}}" store)
  if(NOT named STREQUAL store)
    message(FATAL_ERROR "--store ${store}: the JSON names store '${named}'")
  endif()
endforeach()
if(NOT out MATCHES "peak pages")
  message(FATAL_ERROR "--store paged printed no pages table:\n${out}")
endif()

# a bad --store and a paged store on a device exec are refused, naming the option
execute_process(COMMAND ${KVSIFT} eval --model ${SRC}/data/tiny-recall --limit 1 --store ring
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--store")
  message(FATAL_ERROR "--store ring: expected an error naming --store, got (${rc}) ${err}")
endif()

# --store tiered names the two-tier methods' store: refused with a one-tier method among
# --methods, naming the option and the method; FreeKV over it answers as in the dense call
execute_process(COMMAND ${KVSIFT} eval --model ${SRC}/data/tiny-recall --limit 1 --store tiered
                        --methods freekv,h2o
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--store" OR NOT err MATCHES "h2o is a one-tier method")
  message(FATAL_ERROR "--store tiered with h2o: expected an error naming --store and h2o, got (${rc}) ${err}")
endif()
execute_process(COMMAND ${KVSIFT} eval --model ${SRC}/data/tiny-recall --limit 1 --methods freekv
                        --budgets 0.25 --match budget --store tiered --json-out ${WORK}/tiered.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvsift eval --store tiered failed (${rc}):\n${out}\n${err}")
endif()
file(READ ${WORK}/tiered.json json_tiered)
string(JSON named GET "${json_tiered}" store)
string(JSON run_store GET "${json_tiered}" runs 0 store)
if(NOT named STREQUAL "tiered" OR NOT run_store STREQUAL "tiered")
  message(FATAL_ERROR "--store tiered: the JSON names store '${named}', its run '${run_store}'")
endif()

set(d "${json_dense}")
set(p "${json_paged}")
string(JSON runs LENGTH "${d}" runs)
math(EXPR last "${runs} - 1")
foreach(i RANGE ${last})
  string(JSON method GET "${d}" runs ${i} method)
  string(JSON sd GET "${d}" runs ${i} store)
  string(JSON sp GET "${p}" runs ${i} store)
  if(method STREQUAL "freekv")
    string(JSON items LENGTH "${json_tiered}" runs 0 items)
    math(EXPR last_item "${items} - 1")
    foreach(k RANGE ${last_item})
      string(JSON a GET "${d}" runs ${i} items ${k} output)
      string(JSON t GET "${json_tiered}" runs 0 items ${k} output)
      if(NOT a STREQUAL t)
        message(FATAL_ERROR "freekv item ${k}: output '${a}' with --store dense, '${t}' with tiered")
      endif()
    endforeach()
    set(expect_d tiered)
    set(expect_p tiered)
  else()
    set(expect_d dense)
    set(expect_p paged)
  endif()
  if(NOT sd STREQUAL expect_d OR NOT sp STREQUAL expect_p)
    message(FATAL_ERROR "${method}: stores '${sd}' / '${sp}', expected '${expect_d}' / '${expect_p}'")
  endif()
  string(JSON items LENGTH "${d}" runs ${i} items)
  math(EXPR last_item "${items} - 1")
  foreach(k RANGE ${last_item})
    string(JSON a GET "${d}" runs ${i} items ${k} output)
    string(JSON b GET "${p}" runs ${i} items ${k} output)
    if(NOT a STREQUAL b)
      message(FATAL_ERROR "${method} item ${k}: output '${a}' over dense, '${b}' over paged")
    endif()
    if(expect_p STREQUAL "paged")
      string(JSON peak GET "${p}" runs ${i} items ${k} peak_pages)
      string(JSON full GET "${p}" runs ${i} items ${k} full_pages)
      if(peak LESS_EQUAL 0 OR full LESS_EQUAL 0)
        message(FATAL_ERROR "${method} item ${k}: peak_pages ${peak}, full_pages ${full}")
      endif()
      if(method STREQUAL "full_kv" OR method STREQUAL "quest")  # keep the whole cache
        if(NOT peak EQUAL full)
          message(FATAL_ERROR "${method} item ${k}: peak_pages ${peak} != full_pages ${full}")
        endif()
      elseif(peak GREATER full)
        message(FATAL_ERROR "${method} item ${k}: peak_pages ${peak} above full_pages ${full}")
      elseif(method MATCHES "^(streaming_llm|h2o|snapkv|pyramidkv)$" AND NOT peak LESS full)
        # each layer's round frees its pages before the next layer is prefilled (DynamicKV holds
        # its layers whole until its progressive update, so its peak may be a full cache's)
        message(FATAL_ERROR "${method} item ${k}: peak_pages ${peak} not below full_pages ${full}")
      endif()
    else()
      string(JSON none ERROR_VARIABLE missing GET "${p}" runs ${i} items ${k} peak_pages)
      if(NOT missing)
        message(FATAL_ERROR "${method}: a tiered run reports peak_pages ${none}")
      endif()
    endif()
  endforeach()
  if(expect_p STREQUAL "paged")
    string(JSON peak GET "${p}" runs ${i} peak_pages)
    string(JSON full GET "${p}" runs ${i} full_pages)
    message(STATUS "${method}: peak ${peak} of ${full} pages")
  endif()
endforeach()
