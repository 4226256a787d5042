#!/usr/bin/env bash
# Compiles every .cu file under csrc/ with nvcc against the installed torch's headers, without a GPU
# and without CUDA libraries (CI runs this: a CUDA compile error fails it). Objects are discarded.
# Usage: scripts/check_cuda_compile.sh [file.cu ...]   (default: all of csrc/**/*.cu)
# Env: NVCC (default nvcc), CUDA_ARCH (default 90), JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null || { echo "check_cuda_compile: nvcc not found" >&2; exit 1; }
mapfile -t files < <(if [ $# -gt 0 ]; then printf '%s\n' "$@"; else find csrc -name '*.cu' | sort; fi)
[ ${#files[@]} -gt 0 ] || { echo "check_cuda_compile: no .cu files"; exit 0; }
incs=$(python3 -c "
import sysconfig
from torch.utils.cpp_extension import include_paths
print(' '.join('-I' + p for p in include_paths() + [sysconfig.get_paths()['include']]))")
abi=$(python3 -c "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))")
flags="-std=c++20 -O1 -arch=sm_${CUDA_ARCH:-90} --expt-relaxed-constexpr -DFASTACT_WITH_CUDA=1
  -D_GLIBCXX_USE_CXX11_ABI=$abi -Iinclude -Icsrc $incs -Xcudafe --diag_suppress=20012"
printf '%s\n' "${files[@]}" | xargs -P "${JOBS:-$(nproc)}" -I{} sh -c \
  "echo \"nvcc {}\"; $NVCC $flags -c {} -o /dev/null" 
echo "check_cuda_compile: ${#files[@]} file(s) compiled"
