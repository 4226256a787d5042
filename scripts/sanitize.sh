#!/usr/bin/env bash
# compute-sanitizer's four tools over scripts/sanitize_cases.py (every variant, forward and
# backward, every dtype, boundary shapes), run side by side (each is its own process on the GPU;
# none of them times anything). Exit status non-zero if any tool reports an error.
# Env: SANITIZE_LOGS (folder for the per-tool logs, default a temporary one).
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${SANITIZE_LOGS:-$(mktemp -d)}
mkdir -p "$logs"
tools=(memcheck racecheck initcheck synccheck)
pids=()
for tool in "${tools[@]}"; do
  args=()
  # racecheck is the slowest tool by far: two dtypes cover every kernel's shared-memory code.
  [ "$tool" = racecheck ] && args=(--quick)
  # synccheck faults on st.async into 16-CTA clusters whose CTAs share an SM (sanitize_cases.py says which).
  [ "$tool" = synccheck ] && args=(--synccheck)
  # initcheck: the caching allocator's unused padding is never read, so the default is fine.
  compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
    python3 scripts/sanitize_cases.py "${args[@]}" >"$logs/$tool.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!tools[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  echo "--- compute-sanitizer --tool ${tools[$i]}: exit $rc"
  grep -v "^========= COMPUTE-SANITIZER$" "$logs/${tools[$i]}.log" | tail -n 12
  [ "$rc" -eq 0 ] || status=1
done
exit $status
