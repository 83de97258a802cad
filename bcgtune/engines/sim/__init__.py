"""The simulated device (`--device sim --sim-calibration CAL.json`): capture, calibrate,
validate and tune run on the CPU in seconds against a hidden "true" timing function built
from a recorded GPU calibration, with the noise a real GPU shows (fitted from H200
measurements: noise.py), on a clock that counts simulated device seconds. The truth of any
list on any trace is known exactly (truth.py), so the intervals bcgtune prints can be checked
for coverage (benchmarks/tune_coverage.py).

    noise.py    the noise profile: what varies and by how much (fitted, and from the recording)
    truth.py    the hidden truth: per-size times with size-to-size roughness; exact totals
    device.py   one simulated process: its clock, level shift, drift and host; the draws
    engine.py   the engine the services drive (the interface of engines/base.py), and the
                stand-in model that computes validate's numerics on the CPU

No torch here, except the stand-in (imported only when validate asks for numerics). May import
core, files and the engines' torch-free modules."""
