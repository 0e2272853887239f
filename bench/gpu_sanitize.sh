#!/usr/bin/env bash
# The GPU test suite under compute-sanitizer: memcheck, racecheck, initcheck and synccheck,
# each over every bundled test executable with CUDA required, the tools side by side (one
# process each; the GPU and 16 cores take it). The deliberate out-of-memory tests are left
# out of those runs and run alone under memcheck afterwards, where their only findings must
# be the out-of-memory API errors they provoke. Prints one line per (tool, executable) and a
# summary; logs under $OUT/sanitize/.
#   (here) ../shared/tools/gpu-bundle --bins --data /usr/share/datasets/fashion-mnist
#          git rev-parse --short HEAD > .gpucarry/COMMIT; tar -cf - .gpu | xz -T2 -3 > .gpucarry/gpu.tar.xz
#   (device tool) carry [".gpucarry"], command:
#          bash bench/gpu_sanitize.sh [TOOLS [EXECUTABLES]]
#   TOOLS: comma list (default memcheck,racecheck,initcheck,synccheck); EXECUTABLES: comma
#   list of names in .gpu/tests (default all). SANITIZE_TIMEOUT: seconds per executable
#   (default 240), SANITIZE_OOM=0 leaves out the out-of-memory runs, SANITIZE_LOGS sets the log
#   folder (default /tmp/sanitize), SANITIZE_JOBS executables at a time per tool (default 3); one cut off by it is reported as such, with what was found so far.
#   SANITIZE_PER_TEST=1 runs every test of the chosen executables as a process of its own (the
#   heavy executables do not finish whole under racecheck within a call; their tests side by
#   side do), reported as `executable::test`. SANITIZE_TESTS=exe::test,exe::test runs exactly
#   those tests, one process each (EXECUTABLES is then ignored).
set -uo pipefail
tools=${1:-memcheck,racecheck,initcheck,synccheck}
only=${2:-}
OUT=${OUT:-/tmp/out}; log_dir=${SANITIZE_LOGS:-/tmp/sanitize}; rm -rf "$log_dir"; mkdir -p "$log_dir" "$OUT"
[ -d .gpu ] || xz -dc .gpucarry/gpu.tar.xz | tar -xf -
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_DATA=$PWD/.gpu/data KILN_REQUIRE_CUDA=1
# threads-test: 8 iterations per thread instead of 60 (the same kernels; racecheck makes a launch ~0.1 s).
export KILN_THREADS_ITERS=${KILN_THREADS_ITERS:-8}
cudnn_lib=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${cudnn_lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
limit=${SANITIZE_TIMEOUT:-240}

# Kernels compile once, outside the sanitizer (NVRTC under it is slow and not what is checked).
.gpu/bin/kiln info > /dev/null 2>&1
timeout 300 .gpu/tests/cuda-test every_kernel_source > /dev/null 2>&1

tests=()
for spec in ${SANITIZE_TESTS//,/ }; do tests+=(".gpu/tests/$spec"); done
[ -n "${SANITIZE_TESTS:-}" ] || for t in .gpu/tests/*; do
  name=$(basename "$t")
  if [ -z "$only" ] || [[ ",$only," == *",$name,"* ]]; then
    if [ "${SANITIZE_PER_TEST:-0}" = 1 ]; then
      while read -r case; do tests+=("$t::$case"); done < <("$t" --list 2>/dev/null | sed -n 's/: test$//p' | grep -vE 'out_of_memory|soak')
    else
      tests+=("$t")
    fi
  fi
done

# Report lines that are findings (not the banner, nor "made no CUDA call").
finding_re='^========= (Invalid|Race|Uninitialized|Barrier|Program hit|Host API|Error: Race|Warning|Internal)'
# The findings in one log: the error count of its summary, or (cut off) the reports so far.
findings() {
  local f=$1 n
  if grep -q "terminated before first instrumented API call" "$f"; then echo "0 (no CUDA call)"; return; fi
  # racecheck ends with "RACECHECK SUMMARY: N hazards displayed", the others "ERROR SUMMARY: N errors".
  n=$(grep -oE "(ERROR|RACECHECK) SUMMARY: [0-9]+" "$f" | awk '{s+=$3} END {print s+0}')
  if grep -qE "(ERROR|RACECHECK) SUMMARY" "$f"; then echo "$n"; else
    echo "$(grep -cE "$finding_re" "$f") (cut off)"
  fi
}

# SANITIZE_KILN_ONLY=1 checks kiln's own kernels alone (extern "C" names): C++-mangled
# library kernels (cuDNN, cuSPARSE) and cuBLAS's unmangled GEMM kernels are skipped, which
# makes racecheck fast enough for the heavy executables.
excl=()
if [ "${SANITIZE_KILN_ONLY:-0}" = 1 ]; then
  excl=(--kernel-name-exclude regex=^_Z)
  for k in xmma cutlass gemm gemv nvjet cudnn cublas cusparse; do excl+=(--kernel-name-exclude "kns=$k"); done
fi

one_run() {
  local tool=$1 t=$2 rc args=(--skip out_of_memory --skip soak) t0=$(date +%s)
  if [[ "$t" == *::* ]]; then args=(--exact "${t#*::}"); t=${t%%::*}; fi
  local name=$(basename "$t")
  [ "${args[0]}" = --exact ] && name=$name::${args[1]}
  timeout "$limit" compute-sanitizer --tool "$tool" "${excl[@]}" --target-processes all --print-limit 200 \
    --log-file "$log_dir/$tool-$name.log" "$t" "${args[@]}" \
    > "$log_dir/$tool-$name.out" 2>&1
  rc=$?
  echo "$tool $name exit $rc findings $(findings "$log_dir/$tool-$name.log") ($(( $(date +%s) - t0 )) s)" >> "$log_dir/summary-$tool.txt"
}

# SANITIZE_JOBS executables at a time per tool (default 3).
run_tool() {
  local tool=$1 t
  for t in "${tests[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "${SANITIZE_JOBS:-3}" ]; do wait -n; done
    one_run "$tool" "$t" &
  done
  wait
}

t0=$(date +%s)
for tool in ${tools//,/ }; do
  : > "$log_dir/summary-$tool.txt"
  run_tool "$tool" &
done
wait
echo "sanitizer runs took $(( $(date +%s) - t0 )) s"

# The deliberate out-of-memory tests alone: every finding must be an out-of-memory error.
if [[ ",$tools," == *",memcheck,"* ]] && [ "${SANITIZE_OOM:-1}" = 1 ]; then
  for spec in "cuda-test out_of_memory_is_a_recoverable_error" \
              "long_runs-test out_of_memory_mid_step_is_an_error_and_the_device_recovers"; do
    set -- $spec
    [ -x ".gpu/tests/$1" ] || continue
    timeout "$limit" compute-sanitizer --tool memcheck --log-file "$log_dir/oom-$1.log" \
      ".gpu/tests/$1" --exact "$2" > "$log_dir/oom-$1.out" 2>&1
    rc=$?
    hits=$(grep -cE '^========= Program hit' "$log_dir/oom-$1.log")
    oom=$(grep -cE '^========= Program hit .*OUT_OF_MEMORY' "$log_dir/oom-$1.log")
    other=$(grep -cE '^========= (Invalid|Uninitialized|Race|Barrier)' "$log_dir/oom-$1.log")
    echo "oom $1 $2 exit $rc: $hits API errors ($oom out-of-memory), $other other findings; $(grep -oE 'ERROR SUMMARY.*' "$log_dir/oom-$1.log" | head -1)" >> "$log_dir/summary-oom.txt"
  done
fi
# The findings of each log, grouped by the kernel or API call they name (kiln's kernels
# are `extern "C"` names; library kernels carry C++ namespaces such as cusparse::).
{
  for f in "$log_dir"/*.log; do
    if grep -qE "$finding_re" "$f"; then
      echo "--- $(basename "$f")"
      grep -E "$finding_re|^=========     (and|Uninitialized|at) " "$f" | sed -E 's/0x[0-9a-f]+/0x_/g' | sort | uniq -c | sort -rn | head -8
    fi
  done
} > "$OUT/sanitize-findings.txt"
# Whose kernels the findings name: kiln's (extern "C" names) or a library's (C++-mangled
# names, cuBLAS/cuDNN/cuSPARSE kernel families); reports naming no kernel are the tool's
# own or API errors.
lib_re='^_Z|xmma|cutlass|gemm|gemv|nvjet|cudnn|cublas|cusparse|csrmv'
kernels=$(mktemp)
{
  echo "=== findings by origin (log: kiln kernels, library kernels, no kernel named)"
  for f in "$log_dir"/*.log; do
    grep -qE "$finding_re" "$f" || continue
    grep -E "$finding_re" "$f" | sed -nE 's/.* at ([A-Za-z_][A-Za-z0-9_]*)\+0x.*/\1/p' > "$kernels"
    k=$(grep -cvE "$lib_re" "$kernels"); l=$(grep -cE "$lib_re" "$kernels")
    none=$(( $(grep -cE "$finding_re" "$f") - k - l ))
    libs=$(grep -E "$lib_re" "$kernels" | sort -u | head -3 | tr '\n' ' ')
    echo "$(basename "$f"): kiln $k, library $l ${libs:+($libs)}, none $none"
  done
} >> "$OUT/sanitize-findings.txt"
tail -c 6000 "$OUT/sanitize-findings.txt"
tar -cf - -C "$log_dir" . | xz -T4 > "$OUT/sanitize-logs.tar.xz"
echo "=== summary (tool, executable, exit code, findings)"
for tool in ${tools//,/ } oom; do sort "$log_dir/summary-$tool.txt" 2>/dev/null; done | tee "$OUT/sanitize-summary.txt"
