"""bcgtune's model of SGLang's launch resolution against SGLang's own, on at least 2,000
seeded random launches: every GPU kind bcgtune knows (CUDA and ROCm), dense, Llama, MLA,
DeepSeek-V3, MoE and vision-language model shapes (configs in tests/data/models), layouts
with attention DP and context parallelism, prefill context parallelism and its strategies
(valid and not), every MoE all-to-all backend (DeepEP v2 with its dispatch budget among
them), prefill and attention backends (TRTLLM MHA for prefill, decode or both), page sizes,
chunk sizes, bucket lists, two- and single-batch overlap, speculative decoding.

SGLang answers live where it is installed (CI installs 0.5.23): every launch of one GPU kind
in one child process (bcgtune.adapters.sglang.probe). Where it is not, the answers SGLang
0.5.23 gave to this same draw are read from tests/data/sglang_answers/ (recorded with
`python tests/test_sglang_differential.py --record`); a live run also checks that the
recording still says what SGLang says.

An answer of the model either equals SGLang's (backend, the exact captured list, alignment,
ladder maximum, chunk per rank; or both refuse), or it is a mismatch that the model names:
one of its "not checked" entries names the rule SGLang applied, by SGLang's file and
function (the function that raised a refusal or the resolution step it ran in, or a step
that changed the prefill graph settings; the probe reports both, RuleTrace). Any other
mismatch is unnamed: a false answer, and there must be none. A launch SGLang refuses must
never be one the model would let `--write-profile` write by default (the model refuses it,
or names a rule it could not check, which needs --unchecked).

    python tests/test_sglang_differential.py              # counts per class, and every unnamed mismatch
    python tests/test_sglang_differential.py --record     # ask the installed SGLang, write the recording
    python tests/test_sglang_differential.py --markdown   # the counts as a table (benchmarks/RESULTS.md)
    python tests/test_sglang_differential.py --recorded   # against the recording, even with SGLang installed
"""

from __future__ import annotations

import gzip
import json
import os
import random
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bcgtune.adapters.machine.hardware import GPUS as KNOWN_GPUS  # noqa: E402
from bcgtune.adapters.machine.hardware import gpu_for  # noqa: E402
from bcgtune.adapters.sglang.launcher import build_server_command  # noqa: E402
from bcgtune.adapters.sglang.resolve import PROBE_CONFIG_DIR, known_device, run_probe, sglang_installed  # noqa: E402
from bcgtune.errors import InputError  # noqa: E402
from bcgtune.files.profile_file import Profile, snake  # noqa: E402
from bcgtune.services.launch import model_capture  # noqa: E402

MODELS_DIR = HERE / "data" / "models"
MODELS = {
    "dense": PROBE_CONFIG_DIR,
    "llama": MODELS_DIR / "llama-tiny",
    "mla": MODELS_DIR / "deepseek-v2-mla-tiny",
    "dsv3": MODELS_DIR / "deepseek-v3-tiny",
    "moe": MODELS_DIR / "qwen3-moe-tiny",
    "vl": MODELS_DIR / "qwen2.5-vl-tiny",
    "vl3": MODELS_DIR / "qwen3-vl-deepstack-tiny",
}
GPUS = tuple(KNOWN_GPUS)
N_LAUNCHES = 2100
SEED = 39
RECORDING = HERE / "data" / "sglang_answers" / "differential.json.gz"
A2A_BACKENDS = (
    "deepep", "deepep_v2", "mori", "flashinfer", "pplx", "flashinfer_megamoe", "ascend_tp", "mooncake", "nixl", "megamoe",
)  # fmt: skip
ATTENTION_BACKENDS = ("trtllm_mha", "trtllm_mla", "fa3", "triton", "flashinfer", "torch_native", "aiter")
# a value SGLang's parser does not accept for --cp-strategy (its choices: zigzag, interleave)
BAD_CP_STRATEGIES = ("ring", "Zigzag")


@dataclass(frozen=True)
class Launch:
    """One drawn launch: the GPU kind, the model, its [server] flags, its bucket list and
    the environment the server starts with."""

    hw: str
    model: str
    server: dict
    buckets: list[int] | None
    env: dict = field(default_factory=dict)

    def profile(self) -> Profile:
        return Profile(
            name="diff",
            platform=gpu_for(self.hw).platform,
            hardware=self.hw,
            model=str(MODELS[self.model]),
            server={snake(k): v for k, v in self.server.items()},
            buckets=list(self.buckets) if self.buckets else None,
            env=dict(self.env),
        )

    def argv(self) -> list[str]:
        return build_server_command(self.profile()).argv[3:]

    def classes(self) -> tuple[str, ...]:
        """The classes of launches this one belongs to (the counts per class)."""
        s, out = self.server, []
        if s.get("moe-a2a-backend") == "deepep_v2":
            out.append("DeepEP v2")
        if "trtllm_mha" in (s.get("attention-backend"), s.get("prefill-attention-backend"), s.get("decode-attention-backend")):
            out.append("TRTLLM MHA")
        if s.get("enable-prefill-cp"):
            out.append("prefill CP on ROCm" if gpu_for(self.hw).platform == "rocm" else "prefill CP")
        if "cp-strategy" in s:
            out.append("--cp-strategy" + (" (invalid)" if s["cp-strategy"] in BAD_CP_STRATEGIES else ""))
        if "page-size" in s:
            out.append("--page-size")
        return tuple(out) or ("other",)


def seeded_launches(n: int = N_LAUNCHES, seed: int = SEED) -> list[Launch]:
    """`n` launches drawn with `seed`, the GPU kinds in turn."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        hw = GPUS[i % len(GPUS)]
        model = rng.choice(sorted(MODELS))
        server: dict = {"tp-size": rng.choice((1, 2, 4, 8))}
        env: dict = {}
        _draw_layout(rng, server)
        _draw_moe(rng, server, env)
        _draw_backends(rng, server)
        _draw_rest(rng, server)
        buckets = rng.choice((None, None, None, [256, 512], [100, 301, 1000, 3000], [96, 200, 4000, 9000]))
        out.append(Launch(hw, model, server, buckets, env))
    return out


def _draw_layout(rng: random.Random, server: dict) -> None:
    """Attention DP (both spellings) or attention context parallelism; prefill context
    parallelism, often over the whole TP group; --cp-strategy, valid or not."""
    tp = server["tp-size"]
    r = rng.random()
    if r < 0.2 and tp > 1:
        server["attn-dp-size"] = rng.choice([d for d in (2, 4, 8) if d <= tp])
    elif r < 0.25 and tp > 1:
        server["enable-dp-attention"] = True
        server["dp-size"] = tp
    elif r < 0.36 and tp > 1:
        server["attn-cp-size"] = rng.choice([c for c in (2, 4, 8) if c <= tp])
    if rng.random() < 0.12:
        server["enable-prefill-cp"] = True
        if rng.random() < 0.6 and tp > 1 and "attn-cp-size" not in server:
            for key in ("attn-dp-size", "enable-dp-attention", "dp-size"):
                server.pop(key, None)
            server["attn-cp-size"] = tp
    if rng.random() < 0.15 or (server.get("enable-prefill-cp") and rng.random() < 0.8):
        server["cp-strategy"] = rng.choice(("zigzag", "interleave", "zigzag", "interleave", *BAD_CP_STRATEGIES))


def _draw_moe(rng: random.Random, server: dict, env: dict) -> None:
    """An MoE all-to-all backend (DeepEP v2 more often, with its dispatch budget raised or
    not and its communication mode), DeepEP's mode, the MoE runner."""
    if rng.random() < 0.4:
        a2a = server["moe-a2a-backend"] = rng.choice(A2A_BACKENDS + ("deepep_v2", "deepep_v2"))
        if a2a in ("deepep", "pplx") and rng.random() < 0.4:
            server["deepep-mode"] = rng.choice(("normal", "low_latency", "auto"))
        if a2a == "deepep_v2":
            if rng.random() < 0.4:
                env["SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] = str(rng.choice((256, 1024, 8192, 65536)))
            if rng.random() < 0.2:
                server["deepep-v2-mode"] = rng.choice(("direct", "hybrid"))
    if rng.random() < 0.1:
        server["moe-runner-backend"] = rng.choice(("auto", "deep_gemm", "triton"))


def _draw_backends(rng: random.Random, server: dict) -> None:
    """The prefill graph backend; the attention backend, or TRTLLM MHA for one phase."""
    if rng.random() < 0.35:
        server["cuda-graph-backend-prefill"] = rng.choice(("breakable", "full", "disabled"))
    r = rng.random()
    if r < 0.2:
        server["attention-backend"] = rng.choice(ATTENTION_BACKENDS + ("trtllm_mha",))
    elif r < 0.26:
        server[rng.choice(("prefill-attention-backend", "decode-attention-backend"))] = "trtllm_mha"


def _draw_rest(rng: random.Random, server: dict) -> None:
    """Page size, chunk, overlap, speculative decoding, request pool, pipeline parallelism."""
    for p, key, values in (
        (0.12, "page-size", (1, 16, 32, 64, 128)),
        (0.3, "chunked-prefill-size", (-1, 256, 1024, 2048, 4096, 8192, 16384)),
        (0.08, "enable-two-batch-overlap", (True,)),
        (0.05, "enable-single-batch-overlap", (True,)),
        (0.05, "speculative-algorithm", ("NGRAM",)),
        (0.12, "max-running-requests", (2, 8, 64)),
        (0.05, "pp-size", (2,)),
    ):
        if rng.random() < p:
            server[key] = rng.choice(values)


# --------------------------------------------------------------------------- SGLang's answers
def _item(launch: Launch) -> dict:
    return {"argv": launch.argv(), "env": dict(launch.env)}


def live_answers(launches: list[Launch]) -> list[dict]:
    """SGLang's answer for each launch, asked of the installed SGLang: one child process per
    GPU kind, a few at a time."""
    answers: dict[int, dict] = {}

    def one(hw: str) -> list[tuple[int, dict]]:
        idx = [i for i, launch in enumerate(launches) if launch.hw == hw]
        if not idx:
            return []
        result = run_probe({"device": known_device(gpu_for(hw)), "launches": [_item(launches[i]) for i in idx]}, timeout=1800)
        assert "error" not in result, result.get("error")
        return list(zip(idx, result["launches"]))

    workers = max(1, min(3, (os.cpu_count() or 1)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for pairs in pool.map(one, GPUS):
            answers.update(pairs)
    return [answers[i] for i in range(len(launches))]


def _draw_key(launch: Launch) -> list:
    """What a recorded answer was asked for: the GPU kind, the argv (the model by its folder's
    name: the repository's place on disk differs between machines) and the environment."""
    argv = launch.argv()
    i = argv.index("--model-path") + 1
    argv[i] = Path(argv[i]).name
    return [launch.hw, argv, launch.env]


def recorded_answers(launches: list[Launch]) -> tuple[str, list[dict]]:
    """(SGLang version, the recorded answer for each launch). Fails when the recording was
    made for another draw."""
    with gzip.open(RECORDING, "rt", encoding="utf-8") as fh:
        rec = json.load(fh)
    want = [_draw_key(launch) for launch in launches]
    if rec.get("draw") != want:
        pytest.fail(
            f"{RECORDING.relative_to(HERE.parent)} was recorded for another draw: run "
            "`python tests/test_sglang_differential.py --record` with SGLang 0.5.23 installed"
        )
    return rec["sglang_version"], rec["answers"]


def record(launches: list[Launch], answers: list[dict], version: str) -> None:
    RECORDING.parent.mkdir(parents=True, exist_ok=True)
    kept = [{k: v for k, v in a.items() if k not in ("messages", "model_path")} for a in answers]
    doc = {"sglang_version": version, "seed": SEED, "draw": [_draw_key(x) for x in launches], "answers": kept}
    with gzip.open(RECORDING, "wt", encoding="utf-8", compresslevel=9) as fh:
        json.dump(doc, fh, separators=(",", ":"), sort_keys=True)


# --------------------------------------------------------------------------- judging
def sglang_outcome(answer: dict) -> tuple | None:
    """SGLang's outcome for a launch; None when it gave no verdict (a failure to ask)."""
    if answer.get("ok"):
        backend = answer["backend"] if answer["captured"] else "disabled"
        return (backend, tuple(answer["captured"]), answer["alignment"], answer["max_bs"], answer["chunked_prefill_size"])
    if answer.get("refused"):
        return ("refused",)
    return None


def model_outcome(cap) -> tuple:
    if cap is None or cap.refused is not None:
        return ("refused",)
    backend = cap.backend if cap.captured else "disabled"
    return (backend, cap.captured, cap.alignment, cap.max_bs, cap.chunked_prefill_size)


# Capture-stage rules (after SGLang's resolution pipeline): a difference in what is captured
# from the same resolved settings is SGLang's capture filter or its alignment.
CAPTURE_RULES = (
    "srt/model_executor/model_runner_components/cuda_graph_setup.py:capture_prefill_graph",
    "srt/utils/common.py:get_cuda_graph_batch_size_alignment",
)


def rules_applied(answer: dict) -> list[str]:
    """The rules SGLang applied to a launch, as `file:function`: for a refusal, the function
    that raised and the resolution step it ran in; else every step that changed the prefill
    graph settings, and the capture stage."""
    if answer.get("refused"):
        where = str(answer.get("where") or "")
        keys = [str(answer.get("rule") or "")]
        if answer.get("function"):
            keys.append(f"{where.rsplit(':', 1)[0]}:{answer['function']}")
        return [k for k in keys if k]
    return [*answer.get("applied", []), *CAPTURE_RULES]


def names_rule(entry: str, key: str) -> bool:
    """A "not checked" entry names a rule when it cites the rule's file and function."""
    path, _, function = key.rpartition(":")
    return os.path.basename(path) in entry and function in entry


def judge(answer: dict, cap) -> str:
    """same | named | unnamed | unanswered: the model's answer `cap` (None: bcgtune refuses
    the launch's own values) against SGLang's."""
    sg = sglang_outcome(answer)
    if sg is None:
        return "unanswered"
    if sg == model_outcome(cap):
        return "same"
    if cap is None or cap.refused is not None:
        return "unnamed"  # the model refuses what SGLang accepts: a false verdict
    keys = rules_applied(answer)
    if any(names_rule(entry, key) for entry in cap.unchecked for key in keys):
        return "named"
    return "unnamed"


def written_by_default(answer: dict, cap) -> bool:
    """SGLang refuses the launch, and the model alone would let --write-profile write it
    without --unchecked (it neither refuses it nor names a rule it could not check)."""
    return bool(answer.get("refused")) and cap is not None and cap.refused is None and not cap.unchecked


@dataclass
class Comparison:
    rows: list[tuple[Launch, dict, Any, str]]

    def of(self, verdict: str) -> list:
        return [r for r in self.rows if r[3] == verdict]

    def written_by_default(self) -> list:
        return [r for r in self.rows if written_by_default(r[1], r[2])]

    def per_class(self) -> dict[str, Counter]:
        out: dict[str, Counter] = {}
        for launch, answer, _cap, verdict in self.rows:
            refused = "refused" if answer.get("refused") else "resolved"
            for cls in (*launch.classes(), "all"):
                c = out.setdefault(cls, Counter())
                c["launches"] += 1
                c[verdict] += 1
                c[f"sglang {refused}"] += 1
        return out


def compare(launches: list[Launch], answers: list[dict]) -> Comparison:
    rows = []
    for launch, answer in zip(launches, answers):
        try:
            cap = model_capture(launch.profile())
        except InputError:
            cap = None
        rows.append((launch, answer, cap, judge(answer, cap)))
    return Comparison(rows)


def _answers(launches: list[Launch]) -> tuple[list[dict], str]:
    if sglang_installed():
        return live_answers(launches), "live"
    return recorded_answers(launches)[1], "recorded"


@pytest.mark.sglang
def test_no_unnamed_mismatch_over_two_thousand_seeded_launches():
    launches = seeded_launches()
    assert len(launches) >= 2000 and {x.hw for x in launches} == set(GPUS)
    assert {x.model for x in launches} == set(MODELS)
    answers, how = _answers(launches)
    got = compare(launches, answers)
    counts = got.per_class()
    # every class behind the refusals the model had to learn is drawn, in numbers
    for cls in ("DeepEP v2", "TRTLLM MHA", "prefill CP", "prefill CP on ROCm", "--cp-strategy", "--cp-strategy (invalid)",
                "--page-size"):  # fmt: skip
        assert counts.get(cls, Counter())["launches"] >= 30, (cls, counts.get(cls))
    unnamed = got.of("unnamed")
    assert not unnamed, "\n".join(_row_text(r) for r in unnamed[:10]) + f"\n{len(unnamed)} unnamed mismatches ({how})"
    assert not got.written_by_default(), [_row_text(r) for r in got.written_by_default()[:5]]
    # SGLang gave a verdict (resolved or refused) for nearly every launch
    assert len(got.of("unanswered")) <= len(launches) // 50, [r[1] for r in got.of("unanswered")[:5]]
    assert len(got.of("same")) >= len(launches) // 2
    if how == "live" and RECORDING.is_file():
        # the recording used where SGLang is absent still says what SGLang says
        version, recorded = recorded_answers(launches)
        from bcgtune.adapters.machine.environment import sglang_info

        if sglang_info().version == version:
            differ = [i for i, (a, b) in enumerate(zip(answers, recorded)) if sglang_outcome(a) != sglang_outcome(b)]
            assert not differ, [(launches[i], answers[i], recorded[i]) for i in differ[:3]]


def _row_text(row) -> str:
    launch, answer, cap, verdict = row
    ours = "bcgtune refuses the launch's values" if cap is None else (model_outcome(cap), list(cap.unchecked))
    said = answer.get("refused") or ""
    return f"{verdict}: {launch} -> SGLang {sglang_outcome(answer)} {rules_applied(answer)} {said}; model {ours}"


def markdown(got: Comparison) -> str:
    counts = got.per_class()
    order = [c for c in ("DeepEP v2", "TRTLLM MHA", "prefill CP", "prefill CP on ROCm", "--cp-strategy",
                         "--cp-strategy (invalid)", "--page-size", "other", "all") if c in counts]  # fmt: skip
    lines = [
        "| class | launches | SGLang refuses | same answer | mismatch, rule named | unnamed | written by default (refused) |",
        "|---|---|---|---|---|---|---|",
    ]
    for cls in order:
        c = counts[cls]
        wrote = sum(1 for r in got.written_by_default() if cls == "all" or cls in r[0].classes())
        lines.append(
            f"| {cls} | {c['launches']} | {c['sglang refused']} | {c['same']} | {c['named']} | {c['unnamed']} | {wrote} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    args = sys.argv[1:]
    draw = seeded_launches()
    if "--record" in args:
        from bcgtune.adapters.machine.environment import sglang_info

        got_answers = live_answers(draw)
        record(draw, got_answers, sglang_info().version or "unknown")
        print(f"recorded {len(got_answers)} answers in {RECORDING}")
    elif "--recorded" in args:
        got_answers, source = recorded_answers(draw)[1], "recorded"
    else:
        got_answers, source = _answers(draw)
    print(f"{len(draw)} launches, SGLang's answers {'asked now' if '--record' in args else source}")
    result = compare(draw, got_answers)
    if "--markdown" in args:
        print(markdown(result))
    else:
        for name, c in result.per_class().items():
            print(name, dict(c))
    for row in result.of("unnamed"):
        print(_row_text(row))
    for row in result.of("unanswered")[:20]:
        print("UNANSWERED", row[0], row[1].get("error"))
