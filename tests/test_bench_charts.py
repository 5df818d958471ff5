"""bench/charts.py on real measured rows: the PNGs beside curl_bench's and device_capacity's tables.

The stage chart is drawn from requests this test sends to a real service (a few classifies), read
the way curl_bench.sh's results are; the utilisation chart from the figures the real device-capacity
bench wrote (docs/img/device_capacity.json, the chart the docs show). What is checked: a valid PNG
of the promised size, not blank, and bars whose lengths follow the milliseconds.
"""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest
from PIL import Image

from bench import charts, curl_table
from bench.device_capacity import chart_panels
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not charts.available(), reason="matplotlib (the dev extra) is not installed")

REQUESTS = 4
DEVICE_REPORT = ROOT / "docs" / "img" / "device_capacity.json"


def hex_rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def png(path) -> np.ndarray:
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.verify()
    return np.asarray(Image.open(path).convert("RGB"))


def assert_not_blank(pixels: np.ndarray) -> None:
    white = np.all(pixels == 255, axis=-1).mean()
    assert 0.3 < white < 0.98, f"{white:.0%} white"  # a chart, not an empty or solid canvas
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # text, lines and fills


@pytest.fixture(scope="module")
def measured_rows(client, china_jpg) -> list[dict]:
    """curl_bench's rows from real requests: one cold (after a reload), then warm ones, on cpu."""
    assert client.post("/v1/models/efficientnet_lite0/reload").status_code == 200
    lines = []
    for _ in range(REQUESTS + 1):
        start = time.perf_counter()
        response = client.post("/v1/models/efficientnet_lite0/classify?backend=cpu&top_k=1",
                               content=china_jpg.read_bytes(), headers={"Content-Type": "image/jpeg"})
        lines.append(f"cpu\t{time.perf_counter() - start}\t{response.status_code}\t{response.text}\n")
    return curl_table.summarize(curl_table.read(lines))


def test_stage_chart_of_measured_requests_is_a_png_of_the_promised_size(measured_rows, tmp_path):
    (row,) = measured_rows
    assert row["warm"] >= REQUESTS - 1 and set(row["stages_ms"]) == set(charts.STAGES)
    path = curl_table.write_chart(measured_rows, tmp_path / "stages.png", "test")
    pixels = png(path)
    assert pixels.shape[1::-1] == charts.stage_chart_size(1)
    assert_not_blank(pixels)


def test_stage_bar_lengths_follow_the_milliseconds(measured_rows, tmp_path):
    """Each stage's colour runs, along the bar, for a length proportional to its ms."""
    (row,) = measured_rows
    stages = row["stages_ms"]
    pixels = png(curl_table.write_chart(measured_rows, tmp_path / "stages.png", "test"))
    lengths = {}
    for stage in charts.STAGES:
        match = np.all(pixels == hex_rgb(charts.STAGE_COLOURS[stage]), axis=-1)
        lengths[stage] = int(match.sum(axis=1).max())  # its longest scanline (off the legend and the text)
    total_ms, total_px = sum(stages.values()), sum(lengths.values())
    for stage, ms in stages.items():
        if ms >= 0.1 * total_ms:  # wide enough for a 2 px edge to be small beside it
            assert lengths[stage] / total_px == pytest.approx(ms / total_ms, abs=0.03), (stage, lengths, stages)


def test_one_more_labelled_row_takes_its_place_in_the_table_and_the_chart(measured_rows, tmp_path):
    """What the estimate helper will add: a row that knows only some figures."""
    estimate = {"backend": "estimated Edge TPU", "inference_p50": 2.6,
                "stages_ms": {**measured_rows[0]["stages_ms"], "inference": 2.6}}
    rows = [*measured_rows, estimate]
    out = io.StringIO()
    curl_table.print_table(rows, markdown=True, out=out)
    table = [line for line in out.getvalue().splitlines() if line.startswith("| estimated Edge TPU")]
    assert table and "| 2.60 |" in table[0] and "| - |" in table[0]
    pixels = png(curl_table.write_chart(rows, tmp_path / "stages.png", "test"))
    assert pixels.shape[1::-1] == charts.stage_chart_size(2)
    assert_not_blank(pixels)


def test_utilisation_chart_of_the_device_capacity_figures(tmp_path):
    report = json.loads(DEVICE_REPORT.read_text())
    panels = chart_panels(report)
    assert panels and all(p["points"] for p in panels)
    path = charts.utilisation_lines(panels, tmp_path / "busy.png", "test")
    pixels = png(path)
    assert pixels.shape[1::-1] == charts.utilisation_chart_size(len(panels))
    assert_not_blank(pixels)
    for colour in charts.LINE_COLOURS[:len({p["input"] for p in report["points"]})]:  # one line per input
        assert np.all(pixels == hex_rgb(colour), axis=-1).sum() > 100, colour
