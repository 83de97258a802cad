"""`bcgtune validate --server`: the patched-runner check on a live server.

Two launches of one profile: graphs on (as the profile says) and graphs off
(`--cuda-graph-backend-prefill disabled`). The same probes go to both, one at a time
(bcgtune/adapters/sglang/live_validate.py); their answers are compared position by position and
the graphs-on log says which batches replayed (bcgtune/core/bench/server_validation.py decides).
On a Qwen4-Exp model without speculative decoding, image batches replaying proves the
patched runner; if text batches replay but every image batch runs eager, the runner is
unpatched. The report is also written to <workdir>/validation.json.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from bcgtune.core.bench.accuracy import GAP_THRESHOLD, MAX_LOGPROB_DELTA
from bcgtune.core.bench.server_validation import RunnerCheck, ServerValidation, compare_outputs, failures, runner_verdict
from bcgtune.errors import InputError

DEFAULT_MIN_REPLAY_SHARE = 0.9  # of the batches a captured bucket serves under the 2x rule


def server_validation(
    profile_ref: str,
    prompts: str | None = None,
    min_replay_share: float | None = None,
    gap_threshold: float = GAP_THRESHOLD,
    delta_tol: float = MAX_LOGPROB_DELTA,
    workdir: str | os.PathLike[str] | None = None,
    say: Callable[[str], None] | None = None,
) -> ServerValidation:
    """Run both launches and return the report. `prompts`: a prompts file (None: the
    built-in probes). `min_replay_share` None: DEFAULT_MIN_REPLAY_SHARE. `say`: progress
    callback (one line each)."""
    from bcgtune.adapters.machine.model_config import model_is_qwen4_exp
    from bcgtune.adapters.sglang.flags import effective_prefill_backend
    from bcgtune.adapters.sglang.live import graphs_off, terminate_as_interrupt
    from bcgtune.adapters.sglang.live_validate import default_probes, gate_crosscheck, load_probes, log_replay, run_probes
    from bcgtune.fileio import atomic_write_json
    from bcgtune.files.profile_file import load_profile

    if min_replay_share is None:
        min_replay_share = DEFAULT_MIN_REPLAY_SHARE
    if not 0.0 <= min_replay_share <= 1.0:
        raise InputError(f"min replay share must be within 0..1, got {min_replay_share}", "--min-replay-share")
    profile = load_profile(profile_ref)
    backend, _ = effective_prefill_backend(profile.server, profile.platform)
    if backend == "disabled":
        raise InputError("the profile runs prefill graphs disabled: nothing to validate against eager", profile.where)
    probes = load_probes(prompts) if prompts is not None else default_probes()
    # the answers come back text probes first, then image probes (run_probes' order)
    ordered = [p for p in probes if p.kind == "text"] + [p for p in probes if p.kind == "image"]
    folder = Path(workdir) if workdir else Path.cwd() / f"bcgtune-validate-{profile.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    with terminate_as_interrupt():
        on, on_launch = run_probes(profile, probes, folder / "graphs-on.server.log", "graphs-on server", say)
        off, off_launch = run_probes(graphs_off(profile), probes, folder / "graphs-off.server.log", "graphs-off server", say)
    requests = compare_outputs([(p.name, p.kind) for p in ordered], on, off, gap_threshold, delta_tol)
    replay = log_replay(on_launch.log, on_launch.phases)
    qwen4 = model_is_qwen4_exp(profile.model)
    spec = bool(profile.server.get("speculative_algorithm"))
    state, why = runner_verdict(replay, qwen4, spec, backend)
    report = ServerValidation(
        profile=profile.name,
        model=profile.model,
        backend=backend,
        probes=len(probes),
        gap_threshold=gap_threshold,
        logprob_delta_tolerance=delta_tol,
        min_replay_share=min_replay_share,
        requests=requests,
        replay=replay,
        runner=RunnerCheck(verdict=state, why=why, qwen4_exp=qwen4, speculative=spec, doctor=gate_crosscheck()),
        graphs_on=on_launch,
        graphs_off=off_launch,
        workdir=str(folder),
        failures=failures(requests, replay, gap_threshold, delta_tol, min_replay_share),
    )
    atomic_write_json(folder / "validation.json", report.to_json())
    return report
