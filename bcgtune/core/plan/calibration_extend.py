"""Extending a calibration (`bcgtune calibrate --extend`): the rows an extension times
again beside the sizes it adds (its anchors), and the merge that puts the added rows on the
first run's scale and records the session that measured them. Pure numpy."""

from __future__ import annotations

from typing import Any

import numpy as np

from bcgtune.core.plan.calibration import Calibration, first_session
from bcgtune.errors import InputError

ANCHORS_PER_SIDE = 2  # measured rows re-timed on each side of every added size
# An extension whose anchors moved by more than this factor ran on a machine in another
# state (another clock, load or process): its values would not be comparable, scaled or not.
SCALE_LIMIT = 1.5


def extension_anchors(cal: Calibration, sizes) -> list[int]:
    """The rows an extension times again beside the sizes it adds: the ANCHORS_PER_SIDE
    nearest measured rows below and above each added size. Their two timings put the new
    run's values on the first run's scale (`extend_calibration`)."""
    rows = cal.tokens
    out: set[int] = set()
    for n in sorted({int(x) for x in sizes} - set(rows.tolist())):
        i = int(np.searchsorted(rows, n))
        out.update(rows[max(0, i - ANCHORS_PER_SIDE) : i].tolist())
        out.update(rows[i : i + ANCHORS_PER_SIDE].tolist())
    return sorted(out)


def _scale(old: np.ndarray, new: np.ndarray) -> float | None:
    """Median ratio old / new over rows both runs timed (None: none positive)."""
    ok = (new > 0) & (old > 0)
    return float(np.median(old[ok] / new[ok])) if ok.any() else None


def extend_calibration(cal: Calibration, new: Calibration, session: dict[str, Any]) -> Calibration:
    """`cal` with the rows `new` measured and `cal` lacks, `new` being a later run (same
    runner, as many timed rounds) that also timed some of `cal`'s rows again (its anchors).
    The added rows are put on `cal`'s scale: each column (graph, and the full runner's
    eager) multiplied by the median ratio, over the anchors, of `cal`'s time to the new
    run's (a GPU clock or host that ran faster in one process moves every size alike). The
    session's provenance (with the anchors and the scales) is appended to `cal.sessions`;
    each added row names it. Rows `cal` has already are not changed."""
    if cal.graph_rounds is None:
        raise InputError("this calibration keeps no timed rounds (written before format 3): calibrate again to extend it")
    if new.runner != cal.runner:
        raise InputError(f"an extension of a {cal.runner}-runner calibration measured the {new.runner} runner")
    if new.graph_rounds is None or new.rounds != cal.rounds:
        raise InputError(f"an extension must time as many rounds as the calibration ({cal.rounds}), got {new.rounds}")
    both = np.intersect1d(cal.tokens, new.tokens)
    add = ~np.isin(new.tokens, cal.tokens)
    if not add.any():
        raise InputError("nothing to add: the calibration has measured every size given")
    io_, in_ = np.searchsorted(cal.tokens, both), np.searchsorted(new.tokens, both)
    scale_g = _scale(cal.graph_ms[io_], new.graph_ms[in_]) if both.size else None
    g_rounds = new.graph_rounds[add] * (scale_g or 1.0)
    e_rounds = None
    scale_e = None
    if cal.runner == "full":
        assert new.eager_rounds is not None and cal.eager_ms is not None and new.eager_ms is not None
        scale_e = _scale(cal.eager_ms[io_], new.eager_ms[in_]) if both.size else None
        e_rounds = new.eager_rounds[add] * (scale_e or 1.0)
    for what, scale in (("replay", scale_g), ("eager", scale_e)):
        if scale is not None and not 1 / SCALE_LIMIT <= scale <= SCALE_LIMIT:
            raise InputError(
                f"the rows timed again ran {what} {1 / scale:.3g}x as long as the calibration had them: this machine is "
                "not in the state it was calibrated in (another clock, load or process); calibrate again instead"
            )
    sessions = list(cal.sessions) or [first_session(cal.rounds, cal.meta)]
    index = len(sessions)
    sessions.append(
        {
            **session,
            "kind": "extension",
            "rounds": cal.rounds,
            "sizes": new.tokens[add].tolist(),
            "anchors": both.tolist(),
            "scale_graph": scale_g,
            "scale_eager": scale_e,
        }
    )
    tokens = np.concatenate([cal.tokens, new.tokens[add]])
    order = np.argsort(tokens, kind="stable")
    row_session = np.concatenate(
        [
            cal.row_session if cal.row_session is not None else np.zeros(cal.tokens.size, dtype=np.int64),
            np.full(int(add.sum()), index),
        ]
    )
    meta = dict(cal.meta)
    added_capture = new.meta.get("capture_s") if isinstance(new.meta, dict) else None
    if isinstance(added_capture, dict):
        keep = {str(t) for t in new.tokens[add].tolist()}
        meta["capture_s"] = {**(meta.get("capture_s") or {}), **{k: v for k, v in added_capture.items() if k in keep}}
    out = Calibration(
        tokens=tokens[order],
        eager_ms=None if e_rounds is None else np.concatenate([cal._eager_column(), np.median(e_rounds, axis=1)])[order],
        graph_ms=np.concatenate([cal.graph_ms, np.median(g_rounds, axis=1)])[order],
        pool_gib=cal.pool_gib,
        per_graph_gib=cal.per_graph_gib,
        pool_by_tokens=cal.pool_by_tokens,
        meta=meta,
        runner=cal.runner,
        batches=cal.batches,
        graph_rounds=np.concatenate([cal.graph_rounds, g_rounds])[order],
        eager_rounds=None
        if e_rounds is None or cal.eager_rounds is None
        else np.concatenate([cal.eager_rounds, e_rounds])[order],
        sessions=sessions,
        row_session=row_session[order],
        engine_options=cal.engine_options,
        model_check=cal.model_check,  # the model's error, measured on the trace: the added rows are priced the same way
    )
    return out.validate()
