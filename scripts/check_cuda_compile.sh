#!/usr/bin/env bash
# Compiles every .cu file under csrc/ with nvcc against the installed torch's headers, without a GPU
# and without CUDA libraries (CI runs this: a CUDA compile error fails it), and the torch-free programs
# under tests/ against include/ alone (tests/cuda/: the header-only check test_header_only.py runs on a
# GPU). Objects are discarded. The diagnostics under bench/diag/ are not compiled here: they are built by
# hand on the machine that runs them, and the library's internals may change under them.
# Usage: scripts/check_cuda_compile.sh [file.cu ...]   (default: csrc/**/*.cu, tests/**/*.cu)
# Env: NVCC (default nvcc, else $CUDA_HOME/bin/nvcc), CUDA_ARCH (default 90), JOBS (default: cores).
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")}
[ -x "$NVCC" ] || { echo "check_cuda_compile: nvcc not found" >&2; exit 1; }
if [ $# -gt 0 ]; then files=("$@"); else mapfile -t files < <(find csrc -name '*.cu' | sort; find tests -name '*.cu' 2>/dev/null | sort); fi
[ ${#files[@]} -gt 0 ] || { echo "check_cuda_compile: no .cu files"; exit 0; }

mapfile -t incs < <(python3 -c "
import sysconfig
from torch.utils.cpp_extension import include_paths
for p in include_paths() + [sysconfig.get_paths()['include']]: print('-I' + p)")
# A CPU-only torch wheel ships c10/cuda headers but not the one its CMake generates for CUDA builds;
# supply the line it holds (shared-library build) so those headers compile.
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
if ! python3 -c "import torch, os, sys; sys.exit(not os.path.exists(os.path.join(os.path.dirname(torch.__file__), 'include/c10/cuda/impl/cuda_cmake_macros.h')))"; then
  mkdir -p "$shim/c10/cuda/impl"
  echo '#define C10_CUDA_BUILD_SHARED_LIBS' >"$shim/c10/cuda/impl/cuda_cmake_macros.h"
fi
abi=$(python3 -c "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))")
# -std=c++17: what torch.utils.cpp_extension (setup.py's build) compiles with; a newer standard here
# would pass code the real build rejects.
flags=(-std=c++17 -O1 "-arch=sm_${CUDA_ARCH:-90}" --expt-relaxed-constexpr -DFASTACT_WITH_CUDA=1
       "-D_GLIBCXX_USE_CXX11_ABI=$abi" -Iinclude -Icsrc "${incs[@]}" "-I$shim")

# tests/: standalone programs of the headers alone (no torch, no csrc/).
standalone_flags=(-std=c++17 -O1 "-arch=sm_${CUDA_ARCH:-90}" --expt-relaxed-constexpr -Iinclude)

compile() {
  echo "nvcc $1"
  case $1 in
    tests/*) "$NVCC" "${standalone_flags[@]}" -c "$1" -o /dev/null ;;
    *) "$NVCC" "${flags[@]}" -c "$1" -o "${OBJ_DIR:-/dev/null}${OBJ_DIR:+/$(basename "$1").o}" ;;
  esac
}


pids=() failed=0 jobs=${JOBS:-$(nproc)}
for f in "${files[@]}"; do
  compile "$f" & pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then wait "${pids[0]}" || failed=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
# The CUDA adapters in csrc/cuda/*.cpp are host C++ built only in CUDA builds: check them too.
if [ $# -eq 0 ]; then
  cuda_home=${CUDA_HOME:-$(python3 -c "from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME or '/usr/local/cuda')")}
  for f in csrc/cuda/*.cpp; do
    [ -e "$f" ] || continue
    echo "c++ $f"
    "${CXX:-c++}" -std=c++17 -fsyntax-only -DFASTACT_WITH_CUDA=1 "-D_GLIBCXX_USE_CXX11_ABI=$abi" -Iinclude -Icsrc \
      "${incs[@]}" "-I$shim" "-I$cuda_home/include" "$f" || failed=1
  done
fi
[ $failed -eq 0 ] || { echo "check_cuda_compile: FAILED" >&2; exit 1; }
echo "check_cuda_compile: ${#files[@]} file(s) compiled"
