"""fastact's PEP 517 build backend: setuptools.build_meta, with the build's requirements checked first.

fastact's extension is compiled against the torch it will run with (a C++ extension is tied to one
torch build's ABI), so wheels are built without pip's build isolation, in the environment that
already has torch. Under isolation (pip's default) torch is not importable and setup.py cannot
even start; listing torch as a build requirement would be wrong (pip would download a second,
different torch, gigabytes of it, and build against that). So the wheel and editable hooks check
for torch and oneTBB's build package first and, where one is missing, stop with the commands to
run instead of a traceback. An sdist needs neither: its hooks tell setup.py to skip the extension
(the sources it ships are listed in MANIFEST.in).

pyproject.toml names this module through `backend-path`; setup.py uses the same messages.
"""

import contextlib
import importlib.metadata
import importlib.util
import os
import sys

import setuptools

# PEP 639 license metadata (`license = "BSD-3-Clause"`, `license-files`) needs setuptools 77.
MIN_SETUPTOOLS = 77
# Set by the sdist hooks: setup.py then declares no extension and imports no torch.
SDIST_ENV = "FASTACT_SDIST_ONLY"
TBB_DEVEL = "tbb-devel==2023.2.0"


def _major(version):
    head = version.split(".")[0]
    return int(head) if head.isdigit() else 0


if _major(setuptools.__version__) < MIN_SETUPTOOLS:
    raise SystemExit(
        f"fastact needs setuptools>={MIN_SETUPTOOLS} to build (PEP 639 license metadata); this "
        f"environment has setuptools {setuptools.__version__}. Run:\n\n"
        f'    pip install "setuptools>={MIN_SETUPTOOLS}"\n\nthen build again.'
    )

from setuptools import build_meta as _setuptools  # noqa: E402  (every PEP 517/660 hook is wrapped below)


def missing_build_requirements():
    """The requirements a wheel build needs that this environment lacks, as pip specifiers."""
    missing = []
    if importlib.util.find_spec("torch") is None:
        missing.append("torch")
    try:
        importlib.metadata.version("tbb-devel")
    except importlib.metadata.PackageNotFoundError:
        missing.append(TBB_DEVEL)
    return missing


def _isolated():
    """Whether this build runs in an isolated environment: pip's (its overlay, `pip-build-env-*`, on sys.path) or
    python -m build's (a `build-env-*` venv)."""
    return any("build-env-" in p for p in [sys.prefix, *sys.path])


def missing_message(missing, editable=False):
    target = "-e ." if editable else "."
    names = [spec.partition("==")[0] for spec in missing]
    lines = [f"fastact cannot be built in this build environment: it has no {' and no '.join(names)}."]
    if _isolated():
        lines.append("This build runs in an isolated environment (the default of pip and of python -m build): the "
                     "packages of your own environment are not in it, even where you have them.")
    if "torch" in missing:
        lines += [
            "",
            "fastact's extension is compiled against the torch it runs with, so it is built in your",
            "environment, with the torch you have, not in an isolated one: build isolation (the default",
            "of pip and of python -m build) hides your torch, and a torch in the build requirements would",
            "be a different one.",
        ]
    lines += [
        "",
        "Install torch and the build tools into your environment, then build without isolation:",
        "",
        f'    pip install torch ninja "{TBB_DEVEL}" "setuptools>={MIN_SETUPTOOLS}"',
        f"    pip install --no-build-isolation {target}",
        "",
        "(from an sdist: pip install --no-build-isolation fastact-<version>.tar.gz;",
        " to make a wheel: python -m build --wheel --no-isolation).",
    ]
    return "\n".join(lines)


def check_build_requirements(editable=False):
    """Stops the build, with the commands to run, when torch or tbb-devel is missing."""
    missing = missing_build_requirements()
    if missing:
        raise SystemExit(missing_message(missing, editable))


@contextlib.contextmanager
def _sdist_only():
    old = os.environ.get(SDIST_ENV)
    os.environ[SDIST_ENV] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ[SDIST_ENV]
        else:
            os.environ[SDIST_ENV] = old


def get_requires_for_build_sdist(config_settings=None):
    with _sdist_only():
        return _setuptools.get_requires_for_build_sdist(config_settings)


def build_sdist(sdist_directory, config_settings=None):
    with _sdist_only():
        return _setuptools.build_sdist(sdist_directory, config_settings)


def get_requires_for_build_wheel(config_settings=None):
    check_build_requirements()
    return _setuptools.get_requires_for_build_wheel(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    check_build_requirements()
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    check_build_requirements()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_editable(config_settings=None):
    check_build_requirements(editable=True)
    return _setuptools.get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    check_build_requirements(editable=True)
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    check_build_requirements(editable=True)
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
