#!/usr/bin/env bash
# Set up fastact in ./.venv and run one job. The README's two commands:
#   scripts/dev.sh bench   # the benchmark report (python -m fastact.bench) on this machine's device
#   scripts/dev.sh test    # the test suite (CUDA tests skip where there is no GPU)
# Also: scripts/dev.sh cuda-check   # compile every .cu with nvcc against torch's headers (no GPU needed)
#       scripts/dev.sh sdist-check  # build the sdist, a wheel from it, and smoke-test that wheel
#
# The venv sees the system's site-packages, so a torch that is already installed (a CUDA build on a
# GPU machine, say) is used as is; only where none is found is TORCH_SPEC (default torch==2.13.0)
# installed. Extra arguments go to pytest / the report.
set -euo pipefail
cd "$(dirname "$0")/.."
job=${1:?usage: scripts/dev.sh bench|test|cuda-check|sdist-check [args...]}
shift

if [ ! -x .venv/bin/python ]; then
  python3 -m venv --system-site-packages .venv
  # A venv carries its own (often old) setuptools, which shadows the system's: the build needs 77 or
  # later (PEP 639 license metadata in pyproject.toml; bdist_wheel built in).
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade "setuptools>=77" wheel
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip() { python -m pip "$@"; }

if ! python -c "import torch" 2>/dev/null; then
  pip install -q "${TORCH_SPEC:-torch==2.13.0}"
fi
# The test extra of pyproject.toml, and the build's requirements. transformers, onnx, onnxruntime and
# onnxscript: the model and export tests, which must run (not skip) in CI.
need=("setuptools>=77" ninja "tbb==2023.2.0" "tbb-devel==2023.2.0" pytest pytest-benchmark hypothesis expecttest
      numpy transformers onnx onnxruntime onnxscript)
[ "$job" = bench ] && need+=(matplotlib)
missing=$(python - "${need[@]}" <<'PY'
import sys, importlib.metadata as m, re
def key(v):  # the leading release numbers, enough for the bounds above
    return tuple(int(n) for n in re.findall(r"\d+", v.split("+")[0])[:3])
out = []
for spec in sys.argv[1:]:
    name, op, ver = re.match(r"([\w.-]+)(==|>=)?(.*)", spec).groups()
    try:
        have = m.version(name)  # raises for a package that is not installed, pinned or not
    except m.PackageNotFoundError:
        out.append(spec)
        continue
    if (op == "==" and have != ver) or (op == ">=" and key(have) < key(ver)):
        out.append(spec)
print(" ".join(out))
PY
)
# shellcheck disable=SC2086
[ -z "$missing" ] || pip install -q $missing

# (Re)build the extension in place when sources changed since the last build.
stamp=.venv/.fastact-build
if [ ! -f "$stamp" ] || [ -n "$(find setup.py pyproject.toml fastact/_version.py build_backend csrc include -newer "$stamp" -type f | head -n 1)" ] \
   || ! python -c "import fastact" 2>/dev/null; then
  MAX_JOBS=${MAX_JOBS:-$(nproc)} pip install -q --no-build-isolation --no-deps -e .
  touch "$stamp"
fi

case $job in
  test)
    # the whole suite, unless the arguments name test files or folders (tests/test_api.py, tests/x.py::test_y)
    targets=(tests)
    for a in "$@"; do case $a in -*) ;; *) [ -e "${a%%::*}" ] && targets=() ;; esac; done
    set +e
    python -m pytest ${targets[@]+"${targets[@]}"} -q -rfEs -p no:cacheprovider "$@"  # (bash < 4.4: set -u)
    rc=$?
    [ $rc -eq 5 ] && { echo "dev.sh: pytest collected no tests" >&2; exit 1; }
    exit $rc
    ;;
  bench)
    if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
      exec python -m fastact.bench "$@"
    fi
    exec python -m fastact.bench --quick "$@"
    ;;
  cuda-check)
    exec bash scripts/check_cuda_compile.sh "$@"
    ;;
  sdist-check)
    exec bash scripts/check_sdist.sh "$@"
    ;;
  *) echo "dev.sh: unknown job $job (bench, test, cuda-check, sdist-check)" >&2; exit 2 ;;
esac
