"""A recording for the simulated device (engines/sim) of any model and rank: the H200
calibration of Qwen3-8B in benchmarks/results (calibrate's JSON, breakable runner), with the
model and the shape it names rewritten. The simulated device times what the recording
measured; which model the recording says it measured is what a run is checked against."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H200_8B = ROOT / "benchmarks" / "results" / "cal_breakable_onephase_grid128_qwen3-8b_h200.json"


def sim_recording(path: Path, model: str | None = None, tp: int | None = None, ep: int = 1) -> Path:
    """The H200 recording written to `path`, said to be of `model` (unchanged: qwen3-8b) on
    one rank of TP `tp` (None: no shape recorded, as calibrations made before TP had none)."""
    doc = json.loads(H200_8B.read_text())
    if model is not None:
        doc["meta"]["model"]["name"] = model
    if tp is not None:
        doc["meta"]["shape"] = {"model": model or "qwen3-8b", "tp": tp, "ep": ep, "rank": 0}
    path.write_text(json.dumps(doc))
    return path
