"""bcgtune's model of SGLang's launch resolution against SGLang's own, on at least 1,000
seeded random launches: every GPU kind bcgtune knows of both platforms, dense, MLA,
DeepSeek-V3, MoE and vision-language model shapes (configs in tests/data/models), layouts
with attention DP and context parallelism, MoE all-to-all backends, prefill backends,
attention backends, chunk sizes, bucket lists, two- and single-batch overlap, speculative
decoding. SGLang answers every launch of one GPU kind in one child process
(bcgtune.adapters.sglang.probe).

An answer of the model either equals SGLang's (backend, the exact captured list, alignment,
ladder maximum, chunk per rank; or both refuse) or names what it could not check
(`unchecked`): an unnamed mismatch is a false answer, and there must be none.

    python tests/test_sglang_differential.py [N] [SEED]   # the mismatches, for a person to read
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bcgtune.adapters.machine.hardware import gpu_for  # noqa: E402
from bcgtune.adapters.sglang.launcher import build_server_command  # noqa: E402
from bcgtune.adapters.sglang.resolve import PROBE_CONFIG_DIR, known_device, run_probe, sglang_installed  # noqa: E402
from bcgtune.files.profile_file import Profile, snake  # noqa: E402
from bcgtune.services.launch import model_capture  # noqa: E402

MODELS_DIR = HERE / "data" / "models"
MODELS = {
    "dense": PROBE_CONFIG_DIR,
    "mla": MODELS_DIR / "deepseek-v2-mla-tiny",
    "dsv3": MODELS_DIR / "deepseek-v3-tiny",
    "moe": MODELS_DIR / "qwen3-moe-tiny",
    "vl": MODELS_DIR / "qwen2.5-vl-tiny",
}
GPUS = ("h100", "h200", "b200", "mi300x", "mi355x")
N_LAUNCHES = 1000
SEED = 28


def seeded_launches(n: int = N_LAUNCHES, seed: int = SEED) -> list[tuple[str, str, dict, list[int] | None]]:
    """(GPU, model, [server] flags, bucket list) for `n` launches drawn with `seed`."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        hw = GPUS[i % len(GPUS)]
        model = rng.choice(sorted(MODELS))
        tp = rng.choice((1, 2, 4, 8))
        server: dict = {"tp-size": tp}
        r = rng.random()
        if r < 0.25 and tp > 1:
            server["attn-dp-size"] = rng.choice([d for d in (2, 4, 8) if d <= tp])
        elif r < 0.3 and tp > 1:
            server["enable-dp-attention"] = True
            server["dp-size"] = tp
        elif r < 0.36 and tp > 1:
            server["attn-cp-size"] = rng.choice([c for c in (2, 4) if c <= tp])
        if rng.random() < 0.35:
            server["moe-a2a-backend"] = rng.choice(
                ("deepep", "mori", "flashinfer", "pplx", "flashinfer_megamoe", "ascend_tp", "mooncake", "nixl", "megamoe")
            )
        if rng.random() < 0.35:
            server["cuda-graph-backend-prefill"] = rng.choice(("breakable", "full", "disabled"))
        if rng.random() < 0.15:
            server["attention-backend"] = rng.choice(("trtllm_mla", "fa3", "triton", "flashinfer", "torch_native", "aiter"))
        if rng.random() < 0.3:
            server["chunked-prefill-size"] = rng.choice((-1, 1024, 2048, 4096, 8192, 16384))
        if rng.random() < 0.1:
            server["enable-two-batch-overlap"] = True
        if rng.random() < 0.05:
            server["enable-single-batch-overlap"] = True
        if rng.random() < 0.05:
            server["speculative-algorithm"] = "NGRAM"
        if rng.random() < 0.08:
            server["max-running-requests"] = rng.choice((2, 8, 64))
        if rng.random() < 0.05:
            server["pp-size"] = 2
        buckets = rng.choice((None, None, None, [256, 512], [100, 301, 1000, 3000], [96, 200, 4000, 9000]))
        out.append((hw, model, server, buckets))
    return out


def _profile(hw: str, model: str, server: dict, buckets) -> Profile:
    return Profile(
        name="diff",
        platform=gpu_for(hw).platform,
        hardware=hw,
        model=str(MODELS[model]),
        server={snake(k): v for k, v in server.items()},
        buckets=list(buckets) if buckets else None,
    )


def _device(hw: str) -> dict:
    return known_device(gpu_for(hw))


def sglang_outcome(answer: dict) -> tuple | None:
    """SGLang's outcome for a launch; None when it gave no verdict (a failure to ask)."""
    if answer.get("ok"):
        backend = answer["backend"] if answer["captured"] else "disabled"
        return (backend, tuple(answer["captured"]), answer["alignment"], answer["max_bs"], answer["chunked_prefill_size"])
    if answer.get("refused"):
        return ("refused",)
    return None


def model_outcome(cap) -> tuple:
    if cap.refused is not None:
        return ("refused",)
    backend = cap.backend if cap.captured else "disabled"
    return (backend, cap.captured, cap.alignment, cap.max_bs, cap.chunked_prefill_size)


def compare(launches) -> dict:
    """SGLang's answer and the model's for each launch, by GPU kind in one child each."""
    profiles = [_profile(*launch) for launch in launches]
    answers: dict[int, dict] = {}
    for hw in GPUS:
        idx = [i for i, launch in enumerate(launches) if launch[0] == hw]
        if not idx:
            continue
        argvs = [build_server_command(profiles[i]).argv[3:] for i in idx]
        result = run_probe({"device": _device(hw), "launches": argvs}, timeout=1800)
        assert "error" not in result, result.get("error")
        answers.update(zip(idx, result["launches"]))
    same, named, unnamed, unanswered = [], [], [], []
    for i, launch in enumerate(launches):
        sg = sglang_outcome(answers[i])
        if sg is None:
            unanswered.append((launch, answers[i].get("error")))
            continue
        cap = model_capture(profiles[i])
        ours = model_outcome(cap)
        if sg == ours:
            same.append(launch)
        elif cap.unchecked:
            named.append((launch, sg, ours, cap.unchecked))
        else:
            unnamed.append((launch, sg, ours, answers[i].get("refused")))
    return {"same": same, "named": named, "unnamed": unnamed, "unanswered": unanswered}


@pytest.mark.sglang
def test_no_unnamed_mismatch_over_a_thousand_seeded_launches():
    if not sglang_installed():
        pytest.skip("sglang not installed")
    launches = seeded_launches()
    assert len(launches) >= 1000 and {hw for hw, *_ in launches} == set(GPUS)
    assert {m for _, m, *_ in launches} == set(MODELS)
    got = compare(launches)
    assert not got["unnamed"], "\n".join(map(str, got["unnamed"][:15])) + f"\n{len(got['unnamed'])} unnamed mismatches"
    # SGLang answered (resolved or refused) nearly every launch, and the model matched most exactly
    assert len(got["unanswered"]) <= len(launches) // 50, got["unanswered"][:5]
    assert len(got["same"]) >= len(launches) // 2


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else N_LAUNCHES
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else SEED
    got = compare(seeded_launches(n, seed))
    print({k: len(v) for k, v in got.items()})
    for row in got["unnamed"]:
        print("UNNAMED", row)
    for row in got["unanswered"][:20]:
        print("UNANSWERED", row)
