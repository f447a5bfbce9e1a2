#!/usr/bin/env bash
# Install what the book needs, once. Safe to run again: it returns in a second or two when
# everything is in place, and never reinstalls what pip already considers satisfied.
#
#   bash tools/setup.sh            # torch (only if missing: see below) + pip install -e '.[dev,docs]'
#   EXTRAS=dev,docs,gpu bash tools/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
EXTRAS="${EXTRAS:-dev,docs}"

# torch first, and pinned: an unpinned `pip install torch` (or any package that pulls it in)
# on a machine without torch fetches PyPI's build, which on Linux is the multi-GB CUDA one.
# So, only when no torch imports: the CPU build from PyTorch's own CPU index when that index
# answers within a few seconds; otherwise torch==2.13.0 from pip's configured indexes (a
# local CPU wheel on a machine that has one; on stock Linux, PyPI's CUDA build). A torch
# that already imports (a CUDA build on a GPU machine, say) is kept as it is.
TORCH_VERSION="2.13.0"
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
cpu_index_answers() {  # an answer within 5 s; `timeout` also bounds a hanging DNS look-up
    local probe=("$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)'
                 "$TORCH_CPU_INDEX/torch/")
    if command -v timeout >/dev/null 2>&1; then probe=(timeout 10 "${probe[@]}"); fi
    "${probe[@]}" >/dev/null 2>&1
}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    if cpu_index_answers; then
        echo "[setup] torch missing: pip install torch==$TORCH_VERSION from PyTorch's CPU index"
        "$PY" -m pip install "torch==$TORCH_VERSION" --index-url "$TORCH_CPU_INDEX"
    else
        echo "[setup] torch missing and PyTorch's CPU index ($TORCH_CPU_INDEX) does not answer:"
        echo "[setup] pip install torch==$TORCH_VERSION from pip's own indexes (stock Linux: the CUDA build)"
        "$PY" -m pip install "torch==$TORCH_VERSION"
    fi
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
