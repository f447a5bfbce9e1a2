#!/usr/bin/env bash
# Install what the book needs, once. Safe to run again: it returns in a second or two when
# everything is in place, and never reinstalls what pip already considers satisfied.
#
#   bash tools/setup.sh            # torch (CPU wheel, only if missing) + pip install -e '.[dev,docs]'
#   EXTRAS=dev,docs,gpu bash tools/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
EXTRAS="${EXTRAS:-dev,docs}"

# torch first, and pinned: an unpinned `pip install torch` (or any package that pulls it in)
# on a machine without torch fetches a multi-GB CUDA build. 2.13.0 is the CPU wheel that
# lies on local disk here; any torch that already imports is kept as it is.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "[setup] torch missing: pip install torch==2.13.0"
    "$PY" -m pip install "torch==2.13.0"
fi

# Is the project installed, editable, from *this* folder, with every requirement of the
# wanted extras satisfied? Ask pip itself: a dry run that would install nothing.
# Exits 0 only when nothing would be installed; any other outcome means "install".
up_to_date() {
    "$PY" - "$EXTRAS" <<'PYEOF'

import json, subprocess, sys
from importlib import metadata
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: no tomllib; just install
    sys.exit(1)
root = Path.cwd().resolve()
project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
# Several "minisgl" metadata dirs may be visible (setuptools leaves minisgl.egg-info in the
# work tree, and the current folder is on sys.path): look for the editable install of this folder.
for dist in metadata.distributions(name="minisgl"):
    url = json.loads(dist.read_text("direct_url.json") or "{}")
    if url.get("dir_info", {}).get("editable") and url.get("url") == root.as_uri() and dist.version == project["version"]:
        break
else:
    sys.exit(1)
reqs = list(project["dependencies"])
for extra in filter(None, sys.argv[1].split(",")):
    reqs += project.get("optional-dependencies", {}).get(extra, [])
out = subprocess.run(
    [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", *reqs],
    capture_output=True, text=True,
)
if out.returncode != 0:
    sys.exit(1)
todo = json.loads(out.stdout or "{}").get("install", [])
sys.exit(1 if todo else 0)
PYEOF
}

if up_to_date; then
    echo "[setup] minisgl and its [$EXTRAS] requirements are already installed"
else
    echo "[setup] pip install -e '.[$EXTRAS]'"
    "$PY" -m pip install -e ".[$EXTRAS]"
fi
