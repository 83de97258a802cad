"""`bcgtune trace --simulate`: a workload from its sources (a workload file or preset, a
profile's server settings, option values), optionally timed by a calibration, played
against SGLang's scheduler (bcgtune/adapters/bench_serving/simulator.py), and what the simulation says
beyond a log trace's summary (bcgtune/core/sim/summary.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bcgtune.core.sim.scheduler import ProgressFn
from bcgtune.core.sim.summary import SimulationSummary, simulation_summary
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.core.trace.summary import TraceSummary, summarize


@dataclass
class SimulationRequest:
    """What to simulate: `workload` a workload TOML or preset name (None: the built-in
    defaults), `profile` a profile whose server settings apply next, `options` the
    settings given one by one (field name -> value as the command line parsed it; they win),
    `calibration` a calibration file whose eager prefill times replace the step-time model,
    `buckets` a list whose replay shares are reported beside SGLang's default ladder."""

    workload: str | None = None
    profile: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    calibration: str | None = None
    buckets: Sequence[int] | None = None


@dataclass
class SimulationResult:
    trace: PrefillTrace
    summary: TraceSummary
    simulation: SimulationSummary

    def to_json(self) -> dict[str, Any]:
        """The trace's summary, as `trace --log --json` prints it, plus "simulation"."""
        return {**self.summary.to_dict(), "simulation": self.simulation.to_dict()}


def simulate_trace(req: SimulationRequest, progress: ProgressFn | None = None) -> SimulationResult:
    """Build the workload, simulate it, summarize. `progress(done, total)`: requests done."""
    from bcgtune.adapters.bench_serving.simulator import simulate
    from bcgtune.files.workload_file import workload_from_options

    wl = workload_from_options(workload=req.workload, profile=req.profile, **req.options)
    if req.calibration is not None:
        from bcgtune.files.calibration_file import load_calibration

        wl = replace(wl, step=wl.step.calibrated(load_calibration(req.calibration)))
    trace = simulate(wl, progress=progress)
    return SimulationResult(trace, summarize(trace), simulation_summary(trace, req.buckets))
