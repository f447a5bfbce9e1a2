"""The book's figures drawn from data files the benchmarks wrote, never from typed numbers.

    python -m tools.figures            # every figure whose data file is in docs/data/
    python -m tools.figures --check    # exit 1 if a committed figure is not its data's drawing

Each figure is a PNG in ``docs/assets/`` drawn by matplotlib from one JSON file in
``docs/data/``, written on the machine the JSON names by the command in ``FIGURES``. The
PNG's metadata records the SHA-256 of the data it was drawn from, so ``--check`` (and
``tests/test_tools_figures.py``) can tell a stale or hand-made figure from the real one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List

ROOT = Path(__file__).resolve().parents[1]
DATA, ASSETS = ROOT / "docs" / "data", ROOT / "docs" / "assets"
KEY = "Source-SHA256"  # the PNG text chunk that names the data


@dataclass(frozen=True)
class Figure:
    data: str  # a file in docs/data
    image: str  # a file in docs/assets
    command: str  # what wrote the data
    draw: Callable[[Dict[str, Any], Any], None]  # (data, axes)


def _batch1(data: Dict[str, Any], ax: Any) -> None:
    """The batch-1 step after each speed-up: a bar per rung, the floor as a line."""
    rungs = data["rungs"]
    names = [r["name"] for r in rungs]
    times = [r["gpu_ms"] for r in rungs]
    bars = ax.barh(range(len(rungs)), times, color="#4c72b0")
    ax.set_yticks(range(len(rungs)), names)
    ax.invert_yaxis()
    ax.axvline(data["floor_ms"], color="#c44e52", linestyle="--")
    ax.text(
        data["floor_ms"], len(rungs) - 0.4, f" floor {data['floor_ms']:.2f} ms", color="#c44e52"
    )
    for bar, rung in zip(bars, rungs):
        label = f" {rung['gpu_ms']:.3f} ms, {rung['kernels']} kernels"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, label, va="center")
    ax.set_xlim(0, max(times) * 1.45)
    ax.set_xlabel("GPU time of one decode step (ms)")
    ax.set_title(
        f"{data['model']}, one request, {data['context']} tokens of context ({data['device']})"
    )


def _layer_timeline(data: Dict[str, Any], ax: Any) -> None:
    """One layer's kernels on the GPU's clock at batch 1: from the first program's start to
    the last one's end, the span in which programs pass their PDL wait darker."""
    batch = data["batches"]["1"]
    kernels: List[Dict[str, Any]] = batch["layer"]
    for i, k in enumerate(kernels):
        ax.barh(i, k["end_last"] - k["start_first"], left=k["start_first"], color="#a1c9f4")
        wait = max(k["wait_last"] - k["wait_first"], 0.05)
        ax.barh(i, wait, left=k["wait_first"], color="#4c72b0")
        ax.text(k["end_last"], i, f" {k['end_last']:.1f}", va="center", fontsize=8)
    ax.set_yticks(range(len(kernels)), [k["name"] for k in kernels])
    ax.invert_yaxis()
    ax.set_xlabel("microseconds since the layer before ended (darker: programs passing the wait)")
    ax.set_title(
        f"one layer at batch 1: {batch['layer_us']:.1f} us a layer ({data['device']}, "
        f"{data['context']} tokens)"
    )


FIGURES = [
    Figure(
        "ch19_batch1.json",
        "ch19_batch1.png",
        "python -m minisgl.benchmark.batch1 --json docs/data/ch19_batch1.json",
        _batch1,
    ),
    Figure(
        "ch19_layer_timeline.json",
        "ch19_layer_timeline.png",
        "python -m minisgl.benchmark.layer_timeline --json docs/data/ch19_layer_timeline.json",
        _layer_timeline,
    ),
]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def draw(figure: Figure, data_dir: Path = DATA, out_dir: Path = ASSETS) -> Path:
    """Render ``figure`` from its data file into ``out_dir``; returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    source = data_dir / figure.data
    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=150)
    figure.draw(json.loads(source.read_text()), ax)
    fig.tight_layout()
    out = out_dir / figure.image
    fig.savefig(out, metadata={KEY: digest(source), "Software": "tools/figures.py"})
    plt.close(fig)
    return out


def recorded_digest(image: Path) -> str | None:
    """The data digest stored in a PNG drawn by ``draw``, or None."""
    from PIL import Image

    with Image.open(image) as png:
        return png.text.get(KEY)  # type: ignore[attr-defined]


def stale(data_dir: Path = DATA, out_dir: Path = ASSETS) -> List[str]:
    """The figures whose PNG is missing or was not drawn from the current data file."""
    problems = []
    for figure in FIGURES:
        source, image = data_dir / figure.data, out_dir / figure.image
        if not source.is_file():
            continue
        if not image.is_file() or recorded_digest(image) != digest(source):
            problems.append(
                f"{figure.image} is not drawn from {figure.data}: python -m tools.figures"
            )
    return problems


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a figure is stale")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale()
        print("\n".join(problems) or "every figure is drawn from its data")
        raise SystemExit(1 if problems else 0)
    for figure in FIGURES:
        if (DATA / figure.data).is_file():
            print(f"{draw(figure)}  <-  docs/data/{figure.data}  ({figure.command})")


if __name__ == "__main__":
    main()
