"""Packaging: the version is written once, the sdist holds every source, the license is declared, and
the build backend stops with the commands to run where a build cannot work. No compiler runs here:
scripts/check_sdist.sh (CI) builds a wheel from the sdist and smoke-tests it."""

import ast
import importlib.metadata
import json
import pathlib
import subprocess
import sys
import tarfile

import pytest

import fastact

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not (ROOT / "setup.py").exists(), reason="needs the source tree (setup.py)")

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

# Hides torch from the backend (find_spec answers None for a module set to None in sys.modules), as
# pip's build isolation does, and imports the backend the way pyproject.toml's backend-path does.
_BACKEND = (
    "import sys; sys.modules['torch'] = None; sys.path.insert(0, 'build_backend'); "
    "import fastact_backend as b; "
)


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _backend(code, cwd=ROOT):
    return subprocess.run([sys.executable, "-c", _BACKEND + code], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_version_single_sourced():
    project = _pyproject()
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fastact._version.__version__"}
    # setuptools reads the attribute statically (no import, so no torch) only from a literal assignment.
    tree = ast.parse((ROOT / "fastact" / "_version.py").read_text())
    literal = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
               and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["__version__"]
               and isinstance(n.value, ast.Constant)]
    assert literal == [fastact.__version__]
    assert f"\n## {fastact.__version__}" in (ROOT / "CHANGELOG.md").read_text()


def test_installed_metadata_version():
    """The installed distribution of this checkout (an editable install) has fastact.__version__."""
    # Every fastact distribution on the path: a build's fastact.egg-info in the checkout is one too.
    urls = {}
    for dist in importlib.metadata.distributions(name="fastact"):
        url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
        urls[url] = dist
        if url.startswith("file://") and pathlib.Path(url[len("file://"):]).resolve() == ROOT:
            assert dist.version == fastact.__version__
            return
    pytest.skip(f"no install of this checkout found (fastact distributions from: {sorted(urls) or 'none'})")


def test_license():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License") and "Copyright (c) 2026, the fastact authors" in text
    project = _pyproject()["project"]
    assert project["license"] == "BSD-3-Clause" and project["license-files"] == ["LICENSE"]
    # PEP 639: a license expression rules out license classifiers.
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]


# What an sdist can be made of: the top-level files and these folders.
_FOLDERS = ("csrc", "include", "build_backend", "fastact", "tests")


def _source_files():
    """The checkout's source files (tracked, or new and not ignored), relative to ROOT."""
    git = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True)
    if git.returncode == 0 and git.stdout.strip():
        files = [f for f in git.stdout.splitlines() if (ROOT / f).is_file()]
    else:  # an unpacked sdist: what is there, less what builds and test runs leave
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
                 and not {"__pycache__", "build", ".git", ".venv"} & set(p.relative_to(ROOT).parts)
                 and not any(part.endswith(".egg-info") for part in p.parts) and p.suffix not in (".pyc", ".so")]
    return [f for f in files if "/" not in f or f.split("/")[0] in _FOLDERS]


def test_sdist_holds_every_source(tmp_path):
    """The sdist holds every file the build and the tests read.

    Built from a clean copy of the sources (an existing fastact.egg-info/SOURCES.txt, left by an
    earlier build, would otherwise add its files whatever MANIFEST.in says) by the backend's own hook,
    with torch hidden: an sdist needs none."""
    src, out = tmp_path / "src", tmp_path / "dist"
    files = _source_files()
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        (src / f).write_bytes((ROOT / f).read_bytes())
    r = _backend(f"print(b.build_sdist({str(out)!r}))", cwd=src)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    name = r.stdout.split()[-1]
    assert name == f"fastact-{fastact.__version__}.tar.gz"
    with tarfile.open(out / name) as tar:
        prefix = f"fastact-{fastact.__version__}/"
        have = {m.name[len(prefix):] for m in tar.getmembers() if m.isfile()}
    top = {"setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "CHANGELOG.md"}
    # Every source of the build and the tests: the tests' own folders hold only .py, .cu and .cpp files.
    expected = top | {f for f in files if f.split("/")[0] in _FOLDERS
                      and not (f.startswith("tests/") and pathlib.PurePath(f).suffix not in (".py", ".cu", ".cpp"))}
    assert {"csrc/cpu/kernels.cpp", "csrc/cuda/softmax_float.cu", "include/fastact/math.h"} <= expected
    assert sorted(expected - have) == []


@pytest.mark.parametrize("hook, command", [
    ("get_requires_for_build_wheel()", "pip install --no-build-isolation ."),
    ("prepare_metadata_for_build_wheel('.')", "pip install --no-build-isolation ."),
    ("build_wheel('.')", "pip install --no-build-isolation ."),
    ("get_requires_for_build_editable()", "pip install --no-build-isolation -e ."),
    ("build_editable('.')", "pip install --no-build-isolation -e ."),
])
def test_backend_stops_without_torch(hook, command):
    """Without torch (pip's build isolation), a wheel hook stops at once with the commands to run."""
    r = _backend(f"b.{hook}")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "it has no torch" in r.stderr
    assert f"\n    {command}\n" in r.stderr and "tbb-devel==2023.2.0" in r.stderr


def test_backend_names_missing_tbb_devel():
    """With torch there but no tbb-devel, the backend names tbb-devel alone."""
    code = """
del sys.modules['torch']
import importlib.metadata as m
real = m.version
def version(name):
    if name == 'tbb-devel':
        raise m.PackageNotFoundError(name)
    return real(name)
m.version = version
missing = b.missing_build_requirements()
print(missing)
b.check_build_requirements()
"""
    r = _backend(code)
    assert r.returncode == 1
    assert r.stdout.strip() == "['tbb-devel==2023.2.0']"
    assert "it has no tbb-devel." in r.stderr and "Traceback" not in r.stderr


def test_import_from_an_unbuilt_source_tree_says_why(tmp_path):
    """Python started in a checkout imports its fastact/ folder, which has no built _C: the error says so and what to
    run, instead of torch's "partially initialized module"."""
    import shutil

    shutil.copytree(ROOT / "fastact", tmp_path / "fastact", ignore=shutil.ignore_patterns("_C*", "__pycache__"))
    shutil.copy(ROOT / "setup.py", tmp_path)
    # an editable install's finder would find this checkout's own package first: leave it out
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
            "import fastact")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: fastact is imported from its source tree") and "-e ." in last, r.stderr
