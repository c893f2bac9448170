#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds kvsift_bench (Release) and runs it; writes bench.json (Google Benchmark JSON) and
# summary.md (Markdown tables made from the JSON by bench/summarize.py) into --out.
#
#   scripts/bench.sh [--quick] [--out DIR] [--build DIR] [--min-time SECONDS] [-- extra benchmark args]
#
#   --quick      the quick subset (under 3 minutes on 2 idle cores): one Llama-3.1-8B layer, 4K and
#                32K tokens, f32 and bf16, budget 1024, 1 request, plus a few batch (4 requests) and
#                head_dim 64 (Llama-3.2-1B) points; H2O (O(n^2 d) prefill) at 1K and 2K only.
#   --out DIR    output directory (default build/bench-results)
#   --build DIR  build directory (default: build/release if it is configured, else build/bench
#                configured with tests and examples off)
#   --loaded     the quick suite's decode rows, first on the quiet host (quiet.json), then on a busy
#                one (bench.json): one busy process per core runs for the second pass (started and
#                stopped here); both passes run the library's loops on the benchmark's thread
#                (--kvsift_threading=caller, cpu::scoped_threading); summary.md has each row's
#                loaded step_p99_ms against its quiet step_p50_ms, beside the host's own tail at
#                that step length (BM_scheduler_reference); each row runs 0.5 s (--min-time)
#                and is compared with the run's bandwidth reference (--kvsift_reference=run), not
#                with the passes a quiet --quick row interleaves with its steps
#   --nice N     with --loaded: the busy processes run at nice N (default 0, the benchmark's own
#                priority); N > 0 is a host whose background work yields to the engine's decode
#                thread, as an engine would set it
#   --threading pool|caller
#                with --loaded: how the library runs its loops (default caller)
#   --against F  with --loaded: compare with this quiet run's bench.json instead of a quiet pass
#                of its own (e.g. a --quick run, whose library threads are the pool's)
# Without --quick the full sweep runs (4K..128K, both models, budgets 1024/4096, 1 and 4
# requests): hours on 2 cores.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
quick=0
loaded=0
nice_level=0
threading=caller
against=""
out_given=0
out="${root}/build/bench-results"
build=""
min_time=""
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1 ;;
    --loaded) loaded=1; quick=1 ;;
    --nice) nice_level="$2"; shift ;;
    --threading) threading="$2"; shift ;;
    --against) against="$2"; shift ;;
    --out) out="$2"; out_given=1; shift ;;
    --build) build="$2"; shift ;;
    --min-time) min_time="$2"; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '3,27p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done

if [[ ${loaded} -eq 0 && ( ${nice_level} != 0 || ${threading} != caller || -n "${against}" ) ]]; then
  echo "bench.sh: --nice, --threading and --against go with --loaded" >&2; exit 2
fi
[[ "${nice_level}" =~ ^-?[0-9]+$ ]] || { echo "bench.sh: --nice wants an integer, not '${nice_level}'" >&2; exit 2; }
[[ "${threading}" == pool || "${threading}" == caller ]] || { echo "bench.sh: --threading is pool or caller" >&2; exit 2; }

py=/usr/bin/python3  # Debian's interpreter (stdlib only), not the python3 first on PATH
jobs="${KVSIFT_JOBS:-2}"

# Reuse a configured tree (build/release by default), else configure build/bench for the benchmark
# alone (no Catch2 or nlohmann-json needed). Benchmarks on, Release.
if [[ -z "${build}" ]]; then
  if [[ -f "${root}/build/release/CMakeCache.txt" ]]; then
    build="${root}/build/release"
  else
    build="${root}/build/bench"
  fi
fi
if [[ ! -f "${build}/CMakeCache.txt" ]]; then
  cmake -S "${root}" -B "${build}" -DCMAKE_BUILD_TYPE=Release -DKVSIFT_BUILD_BENCHMARKS=ON \
    -DKVSIFT_BUILD_TESTS=OFF -DKVSIFT_BUILD_EXAMPLES=OFF -DKVSIFT_ENABLE_THRUST=OFF
else
  cmake -S "${root}" -B "${build}" -DCMAKE_BUILD_TYPE=Release -DKVSIFT_BUILD_BENCHMARKS=ON >/dev/null
fi
cmake --build "${build}" --target kvsift_bench -j "${jobs}"
bin="${build}/bench/kvsift_bench"

args=()
if [[ ${quick} -eq 1 ]]; then
  m='llama31_8b/[a-z0-9]+'
  parts=(
    '^BM_bandwidth_reference'
    '^BM_arithmetic_reference'
    "^BM_(score/(window_attention|last_query_attention|key_norm|recency|page_minmax|lag)|probe/[a-z_]+|attention/attend_plan|select/[a-z_]+|budget/[a-z_]+|transfer/[a-z_]+|store/(dense|paged)_(append|retain_roll|gather))/${m}/n(4096|32768)/(B[0-9]+/)?r1/"
    "^BM_store/(dense|paged)_retain_compress/${m}/n4096/B1024/r1/"
    "^BM_score/cumulative_attention/${m}/n1024/r1/"
    "^BM_(prefill|decode)/(full_kv|lagkv|streaming_llm|snapkv|pyramidkv|quest|dynamickv)/${m}/n(4096|32768)/(B1024/)?r1/"
    '^BM_(prefill|decode)/h2o/llama31_8b/(f32|bf16)/n1024/B256/r1/'
    '^BM_(prefill|decode)/h2o/llama31_8b/bf16/n2048/B256/r1/'
    '^BM_(score/(key_norm|page_minmax|lag)|attention/attend_plan|decode/(full_kv|streaming_llm|snapkv|quest|lagkv|dynamickv))/llama31_8b/bf16/n4096/(B1024/)?r4/'
    '^BM_(score/key_norm|decode/(full_kv|quest))/llama32_1b/bf16/n32768/(B1024/)?r1/'
  )
  if [[ ${loaded} -eq 1 ]]; then  # the references and the decode rows only
    parts=(
      '^BM_bandwidth_reference'
      '^BM_arithmetic_reference'
      '^BM_scheduler_reference'  # the host's own tail at each step length, beside the rows
      "^BM_decode/(full_kv|lagkv|streaming_llm|snapkv|pyramidkv|quest|dynamickv)/${m}/n(4096|32768)/(B1024/)?r1/"
      '^BM_decode/h2o/llama31_8b/(f32|bf16)/n1024/B256/r1/'
      '^BM_decode/h2o/llama31_8b/bf16/n2048/B256/r1/'
      '^BM_decode/(full_kv|streaming_llm|snapkv|quest|lagkv|dynamickv)/llama31_8b/bf16/n4096/(B1024/)?r4/'
      '^BM_decode/(full_kv|quest)/llama32_1b/bf16/n32768/(B1024/)?r1/'
    )
    # the run's reference (passes beside each row would only read a busy host's rate), and each
    # row long enough (0.5 s: hundreds of steps for the slowest) for its p99 to be a tail, not a max
    args+=("--kvsift_threading=${threading}" "--kvsift_reference=run")
    min_time="${min_time:-0.5}"
    [[ ${out_given} -eq 1 ]] || out="${root}/build/bench-results-loaded"
  fi
  filter="$(IFS='|'; echo "${parts[*]}")"
  args+=("--benchmark_filter=${filter}")
  min_time="${min_time:-0.05}"
fi
[[ -n "${min_time}" ]] && args+=("--benchmark_min_time=${min_time}")  # plain seconds (1.7.1)

mkdir -p "${out}"
quiet=()  # the quiet run a loaded one is compared with
if [[ ${loaded} -eq 1 ]]; then
  if [[ -n "${against}" ]]; then
    [[ "$(realpath -m "${against}")" != "$(realpath -m "${out}/bench.json")" ]] ||
      { echo "bench.sh: --against ${against} is this run's own output" >&2; exit 2; }
  else
    # the same rows, the same threading, before any busy process starts
    against="${out}/quiet.json"
    echo "bench.sh: quiet pass (threading ${threading}) -> ${against}"
    "${bin}" "${args[@]}" --benchmark_out="${against}" --benchmark_out_format=json \
      --benchmark_counters_tabular=false "${extra[@]}" > /dev/null
  fi
  quiet=(--quiet "${against}")
fi
busy=()
if [[ ${loaded} -eq 1 ]]; then
  # one busy process per core for the run's duration; stopped on any exit
  for _ in $(seq "$(nproc)"); do
    nice -n "${nice_level}" bash -c 'while :; do :; done' &
    busy+=($!)
  done
  trap 'kill "${busy[@]}" 2>/dev/null || true' EXIT
  echo "bench.sh: ${#busy[@]} busy processes started at nice ${nice_level} (pids ${busy[*]}), kvsift threading ${threading}"
fi
start=$(date +%s)
"${bin}" "${args[@]}" --benchmark_out="${out}/bench.json" --benchmark_out_format=json \
  --benchmark_counters_tabular=false "${extra[@]}"
echo "bench.sh: benchmarks took $(( $(date +%s) - start )) s"
"${py}" "${root}/bench/summarize.py" "${out}/bench.json" "${quiet[@]}" > "${out}/summary.md"
echo "bench.sh: wrote ${out}/bench.json and ${out}/summary.md"
