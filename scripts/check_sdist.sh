#!/usr/bin/env bash
# The sdist holds everything a wheel is built from: build the sdist (`python -m build --sdist`), build a
# wheel from it (a CPU build), install that wheel into a throwaway folder apart from the checkout and run
# scripts/smoke_test.py on it. CI runs it (scripts/dev.sh sdist-check).
#
# Runs in the active Python environment, which must hold torch, ninja, tbb-devel and setuptools>=77
# (scripts/dev.sh sdist-check sets that up; `build` is installed when missing). MAX_JOBS defaults to nproc.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
py=${PYTHON:-python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# (Asked of the package metadata: `import build` would find the checkout's build/ folder.)
$py -c "import importlib.metadata as m; m.version('build')" 2>/dev/null || $py -m pip install -q build

# From a clean copy of the sources (tracked, or new and not ignored): an earlier build's
# fastact.egg-info/SOURCES.txt in the checkout would add its files to the sdist whatever MANIFEST.in says.
start=$SECONDS
mkdir "$tmp/src"
if git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard -- ':(glob)*' build_backend csrc include fastact tests \
    | while IFS= read -r -d '' f; do if [ -f "$f" ]; then cp --parents -- "$f" "$tmp/src/"; fi; done
else
  cp -r setup.py pyproject.toml MANIFEST.in README.md LICENSE CHANGELOG.md build_backend csrc include fastact tests "$tmp/src"
  find "$tmp/src" \( -name '*.so' -o -name '__pycache__' -o -name '*.egg-info' \) -prune -exec rm -rf {} +
fi
(cd "$tmp/src" && $py -m build --sdist --no-isolation --outdir "$tmp/dist" .) >"$tmp/sdist.log" 2>&1 \
  || { cat "$tmp/sdist.log"; exit 1; }
sdist=$(echo "$tmp"/dist/fastact-*.tar.gz)
echo "check_sdist: built $(basename "$sdist") ($(tar tzf "$sdist" | grep -vc '/$') files; tests/test_packaging.py checks which)"

# A wheel from the sdist alone (pip unpacks it in a temporary folder: nothing of the checkout is seen).
FASTACT_BUILD=cpu MAX_JOBS=${MAX_JOBS:-$(nproc)} \
  $py -m pip wheel -q --no-build-isolation --no-deps --wheel-dir "$tmp/wheel" "$sdist" >"$tmp/wheel.log" 2>&1 \
  || { tail -n 60 "$tmp/wheel.log"; exit 1; }
wheel=$(echo "$tmp"/wheel/fastact-*.whl)
echo "check_sdist: built $(basename "$wheel") from the sdist in $((SECONDS - start)) s"

# Installed into a folder of its own, first on the path, and run from outside the checkout.
$py -m pip install -q --no-deps --target "$tmp/site" "$wheel"
(cd "$tmp" && PYTHONPATH="$tmp/site" $py "$repo/scripts/smoke_test.py" --expect-under "$tmp/site")
