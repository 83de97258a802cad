"""Server configurations in a trace: the launch settings each source's log states, and the
batches grouped by them.

A log states how its server was launched (SGLang's `server_args=...` line and the
scheduler's `max_total_num_tokens=..., chunked_prefill_size=...` startup line). Batches of
servers launched alike form one group; a trace from a fleet may hold several. A group
carries its settings as plain launch flags (SGLang's ServerArgs names: model_path, tp_size,
dp_size, enable_dp_attention, chunked_prefill_size, ...), so what resolves a launch can
take them as they are, and its own histogram of forward sizes and its request mix (the
(tokens, requests) pairs the breakable runner's cost model reads), so a trace without
per-batch columns still prices every group exactly. Pure data: no printing, no flags.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bcgtune.errors import InputError

# Launch settings that tell configurations apart (every one a ServerArgs field).
SETTING_KEYS = (
    "model_path",
    "tp_size",
    "dp_size",
    "attn_dp_size",
    "enable_dp_attention",
    "pp_size",
    "ep_size",
    "attn_cp_size",
    "moe_a2a_backend",
    "moe_dense_tp_size",
    "enable_two_batch_overlap",
    "enable_dp_lm_head",
    "disable_attn_tp_gather",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "page_size",
    "enable_mixed_chunk",
    "disable_radix_cache",
    "cuda_graph_backend_prefill",
    "disable_cuda_graph",
)
MAX_GROUPS = 4096  # a trace with more configurations than this is not a fleet, it is noise

# How a log trace counts a batch's forward tokens (its meta's forward_tokens_rule). Traces
# written since launches are read by their own settings say BY_LAUNCH: a configuration
# whose launch ran --enable-mixed-chunk (its settings' enable_mixed_chunk) counts the running
# decode rows too; older traces applied one rule to every batch.
FORWARD_TOKENS_RULE = "new_token + replay_token"
FORWARD_TOKENS_RULE_MIXED = FORWARD_TOKENS_RULE + " + running_req (mixed chunk)"
FORWARD_TOKENS_RULE_BY_LAUNCH = FORWARD_TOKENS_RULE + " (+ running_req where the launch ran --enable-mixed-chunk)"


def counts_running_rows(rule: object, settings: dict[str, Any]) -> bool:
    """Whether a configuration's forward tokens count its running decode rows, under the
    trace's forward_tokens_rule."""
    if rule == FORWARD_TOKENS_RULE_BY_LAUNCH:
        return settings.get("enable_mixed_chunk") is True
    return rule == FORWARD_TOKENS_RULE_MIXED


def attention_dp_ranks(settings: dict[str, Any]) -> int:
    """Attention-DP ranks of a launch: attn_dp_size when set above 1, else dp_size under
    --enable-dp-attention, else 1 (SGLang srt/arg_groups/parallel_hook.py divides the
    chunk by this many ranks)."""
    attn = settings.get("attn_dp_size")
    if isinstance(attn, int) and not isinstance(attn, bool) and attn > 1:
        return attn
    dp = settings.get("dp_size")
    if settings.get("enable_dp_attention") is True and isinstance(dp, int) and not isinstance(dp, bool) and dp > 1:
        return dp
    return 1


_BOOL_SETTINGS = frozenset(k for k in SETTING_KEYS if k.startswith(("enable_", "disable_")))
_TEXT_SETTINGS = frozenset({"model_path", "moe_a2a_backend", "cuda_graph_backend_prefill"})


def parse_launch_settings(values: list[str], where: str = "--launch") -> dict[str, Any]:
    """`KEY=VALUE` items (KEY as SGLang's ServerArgs names it, `chunked_prefill_size`, or
    its flag `--chunked-prefill-size`) -> launch settings: integers within int32 for sizes,
    true/false for enable_/disable_ switches, text for the model and backends."""
    out: dict[str, Any] = {}
    for item in values:
        key, sep, value = str(item).partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        value = value.strip()
        if not sep or not key or not value:
            raise InputError(f"expected KEY=VALUE, got {item!r}", where)
        if key not in SETTING_KEYS:
            raise InputError(f"unknown launch setting {key!r}; known: {', '.join(SETTING_KEYS)}", where)
        if key in _BOOL_SETTINGS:
            if value.lower() not in ("true", "false"):
                raise InputError(f"{key}: expected true or false, got {value[:40]!r}", where)
            parsed: Any = value.lower() == "true"
        elif key in _TEXT_SETTINGS:
            parsed = value[:400]
        else:
            if not re.fullmatch(r"-?[0-9]{1,20}", value):  # 0-9 only: int() also reads '１' and '1_0'
                raise InputError(f"{key}: expected an integer, got {value[:40]!r}", where)
            parsed = int(value)
            if not 1 <= parsed <= 2**31 - 1 and not (key == "chunked_prefill_size" and parsed == -1):
                raise InputError(f"{key}: must be within 1..{2**31 - 1}, got {value[:40]}", where)
        if key in out and out[key] != parsed:
            raise InputError(f"{key} given twice ({out[key]} and {parsed})", where)
        out[key] = parsed
    return out


def logged_form(settings: dict[str, Any]) -> dict[str, Any]:
    """Launch settings as SGLang's server_args line states them: the chunk per attention-DP
    rank (launch_settings multiplies it back)."""
    out = dict(settings)
    chunk = out.get("chunked_prefill_size")
    if isinstance(chunk, int) and chunk > 0:
        out["chunked_prefill_size"] = max(1, chunk // attention_dp_ranks(out))
    return out


def launch_settings(server_args: dict[str, Any] | None, startup: dict[str, Any] | None) -> tuple[dict[str, Any], int | None]:
    """(launch flags, the scheduler's chunk) of one launch from what its log states.

    SGLang logs server_args after resolution, and the scheduler logs its own
    chunked_prefill_size: both are the chunk of one attention-DP rank (the launch value
    divided by the attention-DP size). The launch flag is that times the ranks, so that a
    launch resolved from these flags divides it back to what the log shows."""
    flags = {k: v for k, v in (server_args or {}).items() if k in SETTING_KEYS and v is not None}
    chunk = None
    if startup and isinstance(startup.get("chunked_prefill_size"), int):
        chunk = int(startup["chunked_prefill_size"])
    elif isinstance(flags.get("chunked_prefill_size"), int):
        chunk = int(flags["chunked_prefill_size"])
    if chunk is not None:
        flags["chunked_prefill_size"] = chunk * attention_dp_ranks(flags) if chunk > 0 else chunk
    if startup and isinstance(startup.get("max_prefill_tokens"), int) and "max_prefill_tokens" not in flags:
        flags["max_prefill_tokens"] = int(startup["max_prefill_tokens"])
    return flags, chunk


def settings_key(settings: dict[str, Any], rank_chunk: int | None) -> str:
    """One string per configuration (equal settings, equal key)."""
    return json.dumps({"settings": {k: settings[k] for k in sorted(settings)}, "rank_chunk": rank_chunk}, sort_keys=True)


@dataclass
class TraceGroup:
    """The batches of servers launched with one configuration."""

    settings: dict[str, Any]  # launch flags the logs state (SETTING_KEYS); {} when none was logged
    rank_chunk: int | None  # the scheduler's chunked_prefill_size as logged (per attention-DP rank)
    sources: list[int]  # indices into the trace's sources
    sizes: np.ndarray  # forward sizes of its batches, ascending, and their counts
    counts: np.ndarray
    mix_tokens: np.ndarray  # its (tokens, requests) pairs and their counts (core.trace.mix.BatchMix)
    mix_requests: np.ndarray
    mix_counts: np.ndarray
    requests_known: bool = True  # False: some lines carried no #new-seq (one request assumed)
    graph: dict[str, int] = field(default_factory=dict)  # replayed / eager / unflagged batches
    saturated: dict[str, int] = field(default_factory=dict)  # see mixed_chunk_signature
    given: bool = False  # its settings were given (`--launch`) for logs that state none, not logged

    @property
    def n_batches(self) -> int:
        return int(self.counts.sum())

    def key(self) -> str:
        return settings_key(self.settings, self.rank_chunk)

    def label(self) -> str:
        """A short description: model, layout, chunk."""
        s = self.settings
        parts = []
        if isinstance(s.get("model_path"), str):
            parts.append(f"model {os.path.basename(s['model_path'].rstrip('/')) or s['model_path']}")
        for key, name in (("tp_size", "tp"), ("dp_size", "dp"), ("pp_size", "pp"), ("ep_size", "ep")):
            v = s.get(key)
            if isinstance(v, int) and (v > 1 or key == "tp_size"):
                parts.append(f"{name} {v}")
        if attention_dp_ranks(s) > 1:
            parts.append(f"dp-attention {attention_dp_ranks(s)}")
        if self.rank_chunk is not None:
            parts.append(f"chunk {self.rank_chunk}" + (" per rank" if attention_dp_ranks(s) > 1 else ""))
        if s.get("enable_mixed_chunk") is True:
            parts.append("mixed chunk")
        if not parts:
            parts = [f"{k} {v}" for k, v in list(s.items())[:3]]
        return ", ".join(parts) if parts else "launch settings not logged"

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "rank_chunk": self.rank_chunk,
            "sources": list(self.sources),
            "histogram": {"sizes": self.sizes.tolist(), "counts": self.counts.tolist()},
            "mix": {
                "tokens": self.mix_tokens.tolist(),
                "requests": self.mix_requests.tolist(),
                "counts": self.mix_counts.tolist(),
                "requests_known": self.requests_known,
            },
            "graph": dict(self.graph),
            "saturated": dict(self.saturated),
            **({"settings_given": True} if self.given else {}),
        }


def histogram_of(tokens: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct sizes, summed counts) of possibly repeated sizes."""
    if tokens.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    sizes, inv = np.unique(tokens, return_inverse=True)
    return sizes.astype(np.int64), np.bincount(inv.ravel(), weights=counts).astype(np.int64)


def pairs_of(
    tokens: np.ndarray, requests: np.ndarray, counts: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (tokens, requests) pairs, ascending, with summed counts (None: one each)."""
    if tokens.size == 0:
        e = np.empty(0, np.int64)
        return e, e.copy(), e.copy()
    if tokens.min() >= 0 and tokens.max() < 2**32 and requests.min() >= 0 and requests.max() < 2**31:
        keys = (tokens.astype(np.int64) << 31) | requests  # one int64 per pair
        if counts is None:  # one per batch: sorted in place and run lengths, no per-batch temporaries
            keys.sort()
            starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
            distinct = keys[starts]
            return distinct >> 31, distinct & (2**31 - 1), np.diff(np.append(starts, keys.size)).astype(np.int64)
        keys, inv = np.unique(keys, return_inverse=True)
        return keys >> 31, keys & (2**31 - 1), np.bincount(inv.ravel(), weights=counts, minlength=keys.size).astype(np.int64)
    if counts is None:
        counts = np.ones(tokens.size, np.int64)
    pairs, inv = np.unique(np.stack([tokens, requests]), axis=1, return_inverse=True)
    return (
        pairs[0].astype(np.int64),
        pairs[1].astype(np.int64),
        np.bincount(inv.ravel(), weights=counts, minlength=pairs.shape[1]).astype(np.int64),
    )


def group_from_batches(
    settings: dict[str, Any],
    rank_chunk: int | None,
    sources: list[int],
    forward_tokens: np.ndarray,
    new_seq: np.ndarray,
    graph: np.ndarray | None,
    saturated: dict[str, int] | None = None,
) -> TraceGroup:
    """A group from its batches' columns (requests < 1 mean unknown and count as one, as
    core.trace.mix.BatchMix.from_batches reads them)."""
    fwd = np.asarray(forward_tokens, np.int64)
    req = np.asarray(new_seq, np.int64)
    known = bool((req >= 1).all())
    req = np.where(req >= 1, np.minimum(req, fwd), 1)
    t, r, c = pairs_of(fwd, req)
    sizes, counts = histogram_of(t, c)
    g = {}
    if graph is not None:
        g = {"replayed": int((graph == 1).sum()), "eager": int((graph == 0).sum()), "unflagged": int((graph < 0).sum())}
    return TraceGroup(settings, rank_chunk, sources, sizes, counts, t, r, c, known, g, dict(saturated or {}))


def merge_groups(groups: list[TraceGroup]) -> TraceGroup:
    """Groups of one configuration (equal keys) as one: histograms, mixes and counters
    summed, sources concatenated in order."""
    first = groups[0]
    if len(groups) == 1:
        return replace(first, sources=list(first.sources), graph=dict(first.graph), saturated=dict(first.saturated))
    sizes, counts = histogram_of(np.concatenate([g.sizes for g in groups]), np.concatenate([g.counts for g in groups]))
    t, r, c = pairs_of(
        np.concatenate([g.mix_tokens for g in groups]),
        np.concatenate([g.mix_requests for g in groups]),
        np.concatenate([g.mix_counts for g in groups]),
    )
    return TraceGroup(
        settings=dict(first.settings),
        rank_chunk=first.rank_chunk,
        sources=list(dict.fromkeys(s for g in groups for s in g.sources)),
        sizes=sizes,
        counts=counts,
        mix_tokens=t,
        mix_requests=r,
        mix_counts=c,
        requests_known=all(g.requests_known for g in groups),
        graph=sum_counters([g.graph for g in groups]),
        saturated=sum_counters([g.saturated for g in groups]),
        given=all(g.given for g in groups),
    )


def sum_counters(items: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in items:
        for k, v in d.items():
            out[k] = out.get(k, 0) + int(v)
    return out


def describe_groups(groups: list[TraceGroup], source_names: list[str]) -> str:
    """`group 0 (model X, tp 1, chunk 2048; a.log), group 1 (...)` for messages."""
    parts = []
    for i, g in enumerate(groups):
        names = [source_names[s] for s in g.sources[:2] if 0 <= s < len(source_names)]
        more = len(g.sources) - len(names)
        where = ", ".join(names) + (f" +{more} more" if more > 0 else "")
        parts.append(
            f"group {i} ({g.label()}; {g.n_batches} batch{'es' if g.n_batches != 1 else ''}{'; ' + where if where else ''})"
        )
    return ", ".join(parts)


# ---- the mixed-chunk signature ------------------------------------------------------------
def mixed_chunk_signature(saturated: dict[str, int]) -> bool:
    """True when a log's chunk-saturated batches look mixed: with --enable-mixed-chunk
    SGLang's scheduler takes the running decode rows out of the chunk budget
    (srt/managers/schedule_policy.py, PrefillAdder.__init__: `rem_chunk_tokens -=
    num_mixed_decode_tokens`), so a
    chunk-saturated batch logs `#new-token + #running-req == chunk`, where a plain server
    logs `#new-token == chunk`. `saturated` counts both kinds (keys `chunk` and
    `chunk_minus_running`)."""
    mixed = int(saturated.get("chunk_minus_running", 0))
    plain = int(saturated.get("chunk", 0))
    return mixed >= 2 and mixed > plain


UNLOGGED_CHUNK_KEY = "unlogged_chunk_"
UNLOGGED_NEW_TOKEN_KEY = "unlogged_new_token_"


def _top_key(saturated: dict[str, int], prefix: str, by_count: bool) -> tuple[int, int] | None:
    """(value, batches) of the keys `<prefix><value>`: the most counted (then the largest)
    when by_count, else the largest value."""
    best = None
    for key, n in saturated.items():
        if key.startswith(prefix) and key[len(prefix) :].isdigit():
            v, rank = int(key[len(prefix) :]), (int(n), int(key[len(prefix) :]))
            if by_count:
                if best is None or rank > (best[1], best[0]):
                    best = (v, int(n))
            elif best is None or v > best[0]:
                best = (v, int(n))
    return best


def unlogged_mixed_chunk(saturated: dict[str, int]) -> tuple[int, int] | None:
    """(chunk, batches) when a launch whose chunk is not logged looks mixed, and no chunk
    explains its sizes otherwise. Under --enable-mixed-chunk a chunk-saturated batch with
    running decode rows logs `#new-token + #running-req == chunk`, so the largest such sum
    repeats over batches whose #new-token differ; a plain server's saturated batches log
    `#new-token == chunk` (its largest #new-token repeats, and its largest sum is the chunk
    plus the largest running count, reached only by batches at that #new-token). So: at
    least two batches reach the largest sum, no #new-token exceeds it, and more batches
    reach it than reach the largest #new-token. Keys `unlogged_chunk_<sum>` and
    `unlogged_new_token_<n>` count such batches per file (adapters/sglang/log/columns.py);
    a fleet's files add up per value."""
    top = _top_key(saturated, UNLOGGED_CHUNK_KEY, by_count=True)
    if top is None or top[1] < 2:
        return None
    nt = _top_key(saturated, UNLOGGED_NEW_TOKEN_KEY, by_count=False)
    if nt is not None and (nt[0] > top[0] or nt[1] >= top[1]):
        return None
    return top


def check_group_index(groups: list[TraceGroup], index: int, what: str = "--group") -> None:
    if not 0 <= index < max(1, len(groups)):
        n = max(1, len(groups))
        raise InputError(f"the trace has {n} group{'s' if n != 1 else ''} (0..{n - 1}), got {index}", what)
