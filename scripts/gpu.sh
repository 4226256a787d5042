#!/usr/bin/env bash
# Everything a GPU machine does for fastact, in one go: install carried wheels (if .whl/ holds any),
# build the CUDA extension, run the whole test suite, the sanitizers and the benchmark report (and, asked for, the
# model table). Logs go to $OUT (default ./gpu-out): env.txt, build.log, tests.log (tests-huge.log), sanitize.log,
# bench.log and the report's JSON and PNG; models.log, models.json and bert_host.log.
#
# Usage: scripts/gpu.sh [stage ...]    stages: build test sanitize bench models (default: the first four, in order)
# Env:   TESTS (pytest args, default "tests"), TESTS_K (a pytest -k expression, spaces allowed: a targeted run that
#        still keeps the huge tests out of the parallel pass), WORKERS (pytest-xdist processes, default 16), BENCH (report args, default ""), TORCH_CUDA_ARCH_LIST
#        (default 9.0), MAX_JOBS (default: cores).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
stages=${*:-build test sanitize bench}
status=0

# oneTBB is not on the GPU machine: carried wheels go to a prefix (not --target, which drops the
# wheels' lib/ folder), whose site-packages joins PYTHONPATH so setup.py finds them by metadata.
if compgen -G ".whl/*.whl" >/dev/null; then
  prefix=/tmp/fastact-deps
  python3 -m pip install -q --no-index --no-deps --no-compile --ignore-installed --prefix "$prefix" .whl/*.whl || exit 1
  site=$(python3 -c "import sysconfig; print(sysconfig.get_path('purelib', vars={'base': '$prefix', 'platbase': '$prefix'}))")
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv; nproc
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  nvcc --version | tail -1; git log --oneline -1; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# Runs a command, taking pytest's exit code 5 (no test selected) as success: a TESTS subset may hold
# no `huge` test.
allow_no_tests() {
  "$@"
  local rc=$?
  [ $rc -eq 5 ] && return 0
  return $rc
}

run_stage() {  # name, log, command...
  local name=$1 log=$2; shift 2
  echo "=== $name ($(date +%T))"
  "$@" >"$log" 2>&1
  local rc=$?
  tail -n 25 "$log"
  echo "=== $name: exit $rc ($(date +%T))"
  [ $rc -eq 0 ] || status=1
  return $rc
}

for stage in $stages; do
  case $stage in
    build)
      export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-$(nproc)}
      run_stage build "$OUT/build.log" env FASTACT_BUILD=cuda \
        python3 -m pip install --no-build-isolation --no-deps -v -e . || exit 1
      # The extension must use the process's shared libstdc++, not a static copy (see setup.py).
      if command -v readelf >/dev/null && ! readelf -d fastact/_C*.so | grep -q 'NEEDED.*libstdc++'; then
        echo "gpu.sh: fastact/_C links libstdc++ statically; error messages would crash" >&2; exit 1
      fi
      python3 -c "import fastact, torch; x = torch.randn(4, 8, device='cuda'); print(fastact.explain('softmax', x))" || exit 1
      ;;
    test)
      # shellcheck disable=SC2086
      # pytest-xdist, where present, runs WORKERS processes (default 16) on the one GPU; each test's
      # time, outcome and failure report also go to $OUT/testlog as they finish (tests/conftest.py).
      # The `huge` tests (tensors beyond 2^31 elements, tens of GiB each) then run one at a time:
      # beside 15 other workers they found too little free memory and skipped.
      par=()
      # One intra-op thread per worker: 16 workers of 16 threads each slow the CPU tests tenfold.
      if python3 -c "import xdist" 2>/dev/null; then
        par=(-n "${WORKERS:-16}" -m "not huge")
        export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
      fi
      sel=()
      [ -n "${TESTS_K:-}" ] && sel=(-k "$TESTS_K")
      run_stage test "$OUT/tests.log" env FASTACT_TEST_LOG="$OUT/testlog" \
        python3 -m pytest ${TESTS:-tests} "${sel[@]}" -q -rfEs -p no:cacheprovider "${par[@]}" --durations=30
      if [ ${#par[@]} -gt 0 ]; then
        run_stage test-huge "$OUT/tests-huge.log" allow_no_tests env FASTACT_TEST_LOG="$OUT/testlog-huge" \
          python3 -m pytest ${TESTS:-tests} "${sel[@]}" -q -rfEs -p no:cacheprovider -m huge --durations=10
      fi
      ;;
    sanitize)
      run_stage sanitize "$OUT/sanitize.log" bash scripts/sanitize.sh
      ;;
    bench)
      # shellcheck disable=SC2086
      run_stage bench "$OUT/bench.log" python3 -m fastact.bench --out "$OUT" ${BENCH:-}
      ;;
    models)
      # The model table (GPT-2 and BERT training steps, torch against fastact.apply: models.json), then where BERT
      # bf16's host time goes (torch, the swaps, the swaps with the former mode, apply).
      run_stage models "$OUT/models.log" python3 -m fastact.bench_models --out "$OUT"
      run_stage bert-host "$OUT/bert_host.log" python3 bench/diag/bert_host.py --dtype bf16
      ;;
    *) echo "gpu.sh: unknown stage $stage" >&2; exit 2 ;;
  esac
done
exit $status
