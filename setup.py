"""Builds fastact._C: a CUDAExtension when torch has CUDA and nvcc is found, else a CppExtension.

FASTACT_BUILD=cuda|cpu forces either way (cuda fails loudly when it cannot be built).

CPU kernels are compiled once per x86 instruction set, as ATen does: the `ISA_SOURCES` (the
softmax and elementwise kernels and the per-ISA table, `csrc/cpu/*kernels.cpp`) are each
built three times (DEFAULT, AVX2, AVX512), each with its own `CPU_CAPABILITY` namespace and
`-m` flags, and `csrc/cpu/ops.cpp` picks one at run time from `at::native::get_cpu_capability()`.
So the wheel runs on any x86-64 CPU and still uses 512-bit vectors where they exist; no
`-march=native` anywhere.

Builds go through the in-tree backend `build_backend/fastact_backend.py` (pyproject.toml), which
stops with the commands to run when torch or tbb-devel is missing (pip's build isolation hides torch)
and builds sdists without torch: with FASTACT_SDIST_ONLY=1 this file declares no extension.
"""

import glob
import importlib.metadata
import os
import platform
import shutil
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "build_backend"))
import fastact_backend  # noqa: E402

# An sdist is the files MANIFEST.in names: no extension, so neither torch nor a compiler is needed.
SDIST_ONLY = os.environ.get(fastact_backend.SDIST_ENV) == "1"
if not SDIST_ONLY:
    # `python setup.py build_ext --inplace` and the like come here without the backend's check.
    fastact_backend.check_build_requirements()
    import torch
    from torch.utils.cpp_extension import (
        CUDA_HOME,
        BuildExtension,
        CppExtension,
        CUDAExtension,
    )

# The sources built once per instruction set (the CPU kernels and their table), and the flags each build gets.
ISA_SOURCES = ["csrc/cpu/softmax_kernels.cpp", "csrc/cpu/elementwise_kernels.cpp", "csrc/cpu/kernels.cpp"]
ISA_BUILDS = {
    "DEFAULT": [],
    "AVX2": ["-mavx2", "-mfma", "-mf16c"],
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c"],
}


def _tbb_paths():
    """Include and library folders of oneTBB, from the installed tbb-devel and tbb distributions' metadata.

    Works in a venv, a user site or a system prefix alike: the files list says where pip put them.
    The headers come with tbb-devel; the unversioned libtbb.so link with tbb (2023.2.0 wheels).
    """
    try:
        files = list(importlib.metadata.files("tbb-devel") or [])
    except importlib.metadata.PackageNotFoundError as e:
        raise RuntimeError(
            "fastact needs oneTBB's headers to build: pip install tbb-devel==2023.2.0"
        ) from e
    try:
        files += list(importlib.metadata.files("tbb") or [])
    except importlib.metadata.PackageNotFoundError:
        pass
    include = lib = None
    for f in files:
        s = str(f).replace("\\", "/")
        if s.endswith("include/tbb/tbb.h"):
            include = Path(f.locate()).resolve().parents[1]
        elif Path(s).name == "libtbb.so":
            lib = Path(f.locate()).resolve().parent
    if include is None or lib is None:
        raise RuntimeError("tbb-devel is installed but its headers or libtbb.so were not found")
    return str(include), str(lib)


def _want_cuda():
    mode = os.environ.get("FASTACT_BUILD", "auto").lower()
    if mode not in ("auto", "cuda", "cpu"):
        raise RuntimeError(f"FASTACT_BUILD must be auto, cuda or cpu, got {mode!r}")
    has_nvcc = CUDA_HOME is not None and (
        shutil.which("nvcc") is not None or Path(CUDA_HOME, "bin", "nvcc").exists()
    )
    has_cuda = torch.version.cuda is not None and has_nvcc
    if mode == "cuda" and not has_cuda:
        raise RuntimeError(
            f"FASTACT_BUILD=cuda, but torch.version.cuda={torch.version.cuda} and CUDA_HOME={CUDA_HOME}"
        )
    return has_cuda if mode == "auto" else mode == "cuda"


def _runtime_libstdcxx():
    """The shared libstdc++ this process loaded (torch's, hence the run-time one), as a link input.

    g++ links `-lstdc++`, which is whatever its library folders hold first. A compiler with
    libstdc++.a but no libstdc++.so there (the GPU machine's /opt/gcc, Python's compiler) links it
    statically into the extension, and that private copy carries its own locale facet ids, which
    the process's locale (built by the shared libstdc++) never registered: the first
    `ostream << int` inside the extension (any error message with a number in it) segfaults.
    Naming the loaded library ahead of `-lstdc++` makes the linker resolve against it, whatever
    the compiler's folders hold.
    """
    if not sys.platform.startswith("linux"):
        return []
    with open("/proc/self/maps") as maps:
        loaded = {line.split()[-1] for line in maps if "/libstdc++.so" in line}
    if len(loaded) != 1:
        print(f"fastact: libstdc++ not linked explicitly (loaded: {sorted(loaded)})")
        return []
    path = loaded.pop()
    print(f"fastact: linking the run-time libstdc++ {path}")
    return [path]


def _build_ext_class():
    """build_ext for the extension (a function: BuildExtension is imported only when building)."""

    class FastactBuild(BuildExtension):
        """BuildExtension plus the per-instruction-set objects of the CPU kernels."""

        def build_extension(self, ext):
            # The host side of .cu files is compiled by nvcc's host compiler, the first gcc on PATH unless
            # told otherwise (torch passes -ccbin only when CC is set). Use Python's compiler, the one the
            # .cpp files get, so that every object is built against the same libstdc++ headers.
            if isinstance(ext.extra_compile_args, dict) and "nvcc" in ext.extra_compile_args and "CC" not in os.environ:
                ext.extra_compile_args["nvcc"] = ["-ccbin", self.compiler.compiler_so[0]] + ext.extra_compile_args["nvcc"]
            ext.extra_link_args = _runtime_libstdcxx() + list(ext.extra_link_args or [])
            if platform.machine() in ("x86_64", "AMD64"):
                builds = ISA_BUILDS
            else:  # no x86 flags elsewhere: one portable build
                builds = {"DEFAULT": []}
            cxx = ext.extra_compile_args["cxx"] if isinstance(ext.extra_compile_args, dict) else ext.extra_compile_args
            objects = []
            for isa, flags in builds.items():
                objects += self.compiler.compile(
                    ISA_SOURCES,
                    output_dir=os.path.join(self.build_temp, f"isa_{isa.lower()}"),
                    include_dirs=ext.include_dirs,
                    extra_postargs=list(cxx) + flags + [f"-DCPU_CAPABILITY={isa}", f"-DCPU_CAPABILITY_{isa}"],
                    depends=ext.depends,
                )
            ext.extra_objects = list(ext.extra_objects or []) + objects
            ext.define_macros = list(ext.define_macros or []) + [
                (f"FASTACT_HAVE_{isa}", "1") for isa in builds
            ]
            super().build_extension(ext)
            # Builds before the eager entry points (csrc/eager.cpp) were abi3 libraries, `_C.abi3.so`, which
            # a Python without a build of its own would still import from an editable checkout (or the
            # build folder): this build replaces them.
            built = os.path.abspath(self.get_ext_fullpath(ext.name))
            for folder in (os.path.dirname(built), str(ROOT / "fastact")):
                stale = os.path.join(folder, "_C.abi3.so")
                if os.path.exists(stale) and os.path.abspath(stale) != built:
                    os.remove(stale)

    return FastactBuild


def extension():
    tbb_include, tbb_lib = _tbb_paths()
    with_cuda = _want_cuda()
    sources = sorted(glob.glob("csrc/*.cpp")) + [s for s in sorted(glob.glob("csrc/cpu/*.cpp")) if s not in ISA_SOURCES]
    cxx = ["-O3", "-fvisibility=hidden", "-Wall", "-Wno-unknown-pragmas"]
    kwargs = dict(
        name="fastact._C",
        include_dirs=[str(ROOT / "include"), str(ROOT / "csrc"), tbb_include],
        library_dirs=[tbb_lib],
        libraries=["tbb"],
        # libtbb.so.12 is found where tbb-devel put it at build time; fastact/_ops.py also
        # preloads it from the `tbb` runtime distribution, for installs that moved.
        extra_link_args=[f"-Wl,-rpath,{tbb_lib}"],
        depends=glob.glob("include/**/*", recursive=True) + glob.glob("csrc/**/*.h", recursive=True),
    )
    if not with_cuda:
        return CppExtension(sources=sources, extra_compile_args={"cxx": cxx}, **kwargs)
    # csrc/cuda/*.cpp: the torch-facing adapters, built by the host compiler (error messages format
    # through libstdc++'s streams, which crashed when built by nvcc on a GPU machine); *.cu: kernels.
    sources += sorted(glob.glob("csrc/cuda/*.cpp")) + sorted(glob.glob("csrc/cuda/*.cu"))
    # No --use_fast_math: erf, tanh and exp must stay within torch's tolerance.
    nvcc = ["-O3", "--expt-relaxed-constexpr", "-lineinfo", "-DFASTACT_WITH_CUDA=1"]
    return CUDAExtension(
        sources=sources,
        extra_compile_args={"cxx": cxx + ["-DFASTACT_WITH_CUDA=1"], "nvcc": nvcc},
        **kwargs,
    )


if SDIST_ONLY:
    setup()
else:
    if "TORCH_CUDA_ARCH_LIST" not in os.environ:
        # sm_80 (A100) and sm_90 (H100); PTX for newer chips.
        os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0+PTX"
    # Not a limited-API (abi3) extension: csrc/eager.cpp calls torch's Python bindings (libtorch_python)
    # to enter the ops unboxed. The wheel is tied to one torch build (its C++ ABI) either way.
    setup(
        ext_modules=[extension()],
        cmdclass={"build_ext": _build_ext_class()},
    )
