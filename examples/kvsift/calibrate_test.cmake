# SPDX-License-Identifier: Apache-2.0
# ctest cli.calibrate: `kvsift calibrate` on the first two calibration prompts of recall-8kv for
# both methods, `--verify` re-reading each roles file against the model, and `kvsift trace` +
# `kvsift calibrate --traces` giving the same roles as calibrating from the model directly.
# Run as: cmake -DKVSIFT=<kvsift binary> -DSRC=<source dir> -DWORK=<scratch dir> -P calibrate_test.cmake
set(model ${SRC}/data/recall-8kv)
set(prompts ${SRC}/data/eval/recall-8kv/calibration.jsonl)
file(MAKE_DIRECTORY ${WORK})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

run(${KVSIFT} trace --model ${model} --prompts ${prompts} --limit 2 --steps 4 --out ${WORK}/trace.safetensors)
foreach(method synckv heterocache)
  run(${KVSIFT} calibrate --method ${method} --model ${model} --prompts ${prompts} --limit 2
      --steps 4 --out ${WORK}/roles-${method}.json)
  run(${KVSIFT} calibrate --verify ${WORK}/roles-${method}.json --model ${model})
  run(${KVSIFT} calibrate --method ${method} --traces ${WORK}/trace.safetensors --model ${model}
      --out ${WORK}/roles-${method}-from-trace.json)
  file(READ ${WORK}/roles-${method}.json direct)
  file(READ ${WORK}/roles-${method}-from-trace.json traced)
  string(JSON a GET "${direct}" layers)
  string(JSON b GET "${traced}" layers)
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "${method}: roles from the trace differ from roles from the model")
  endif()
endforeach()
