"""The book's generated figures: drawn from their data files, and known stale when the data
changes (``tools/figures.py``)."""

from __future__ import annotations

import json
import shutil

from tools import figures

BATCH1 = dict(
    device="a GPU", model="a model", context=1024, floor_ms=0.3,
    rungs=[dict(name=f"rung {i}", gpu_ms=1.5 - 0.2 * i, kernels=400 - 50 * i) for i in range(6)],
)  # fmt: skip
LAYER = [
    dict(name=n, start_first=3.0 * i, start_last=3.0 * i + 1, wait_first=3.0 * i + 0.5,
         wait_last=3.0 * i + 1.5, end_last=3.0 * i + 2.5)
    for i, n in enumerate(("qkv", "attn", "merge", "o", "gate_up", "down"))
]  # fmt: skip
TIMELINE = dict(device="a GPU", context=1025, batches={"1": dict(layer_us=18.0, layer=LAYER)})


def test_a_figure_records_the_data_it_was_drawn_from(tmp_path):
    data, out = tmp_path / "data", tmp_path / "assets"
    data.mkdir(), out.mkdir()
    (data / "ch19_batch1.json").write_text(json.dumps(BATCH1))
    (data / "ch19_layer_timeline.json").write_text(json.dumps(TIMELINE))
    assert len(figures.stale(data, out)) == 2  # no pictures yet
    for figure in figures.FIGURES:
        image = figures.draw(figure, data, out)
        assert figures.recorded_digest(image) == figures.digest(data / figure.data)
    assert figures.stale(data, out) == []
    BATCH1["rungs"][0]["gpu_ms"] = 2.0  # a new measurement: the old picture is stale
    (data / "ch19_batch1.json").write_text(json.dumps(BATCH1))
    assert figures.stale(data, out) == [
        "ch19_batch1.png is not drawn from ch19_batch1.json: python -m tools.figures"
    ]
    shutil.copy(out / "ch19_layer_timeline.png", out / "ch19_batch1.png")  # a picture of other data
    assert len(figures.stale(data, out)) == 1


def test_the_committed_figures_are_drawn_from_the_committed_data():
    assert figures.stale() == []
