#!/usr/bin/env bash
# compute-sanitizer's four tools over scripts/sanitize_cases.py (every variant, forward and
# backward, every dtype, boundary shapes). Exit status non-zero if any tool reports an error.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
for tool in memcheck racecheck initcheck synccheck; do
  args=()
  # racecheck is the slowest tool by far: two dtypes cover every kernel's shared-memory code.
  [ "$tool" = racecheck ] && args=(--quick)
  echo "--- compute-sanitizer --tool $tool"
  # initcheck: the caching allocator's unused padding is never read, so the default is fine.
  compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
    python3 scripts/sanitize_cases.py "${args[@]}" 2>&1 | grep -v "^========= COMPUTE-SANITIZER$" | tail -n 12
  rc=${PIPESTATUS[0]}
  echo "--- $tool: exit $rc"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
