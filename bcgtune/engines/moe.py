"""Routed experts in torch: a top-k router over all experts, this rank's experts (their
GEMMs grouped where torch offers it, looped otherwise), and an optional shared expert; the
MoE layer of Qwen2/Qwen3-MoE, Qwen3-VL-MoE and DeepSeek-V2/V3 as SGLang runs it on one
tensor-parallel rank (srt/layers/moe/topk.py for the routing, srt/layers/moe/fused_moe_triton
for the experts).

Routing. The router's gate is drawn so its logits spread by about 1 (std 1/sqrt(hidden) on
an RMS-normalized input), plus a seeded per-layer bias:
  * uniform: no bias; the random gate spreads tokens evenly over the experts on average (the
    busiest of Qwen3-30B-A3B's 128 experts, top 8, takes ~1.2x the mean load of 4096 tokens);
  * skewed: each layer's expert popularity log-normal, a bias of SKEW_SIGMA x N(0, 1) per
    expert (seeded by the layer), so some experts take several times the mean load, as a
    trained router's do: ~2.9x the mean for the busiest of 128 experts at top 8, ~1.5x of 8 at
    top 2 (simulated over 4096 tokens). The spread a model gets is printed with the
    calibration (`routing_spread`); it is a stated model of imbalance, not one measured from a
    trained router.

Padded rows (a bucket's rows past the batch's tokens) behave as SGLang 0.5.23's do:
  * routed, on the breakable runner at plain TP: the capture batch carries no
    num_token_non_padded (model_executor/runner/prefill_cuda_graph_runner.py registers its slot
    only when `enable_num_token_non_padded()` holds or the backend is full;
    model_executor/forward_batch_info.py: expert parallelism, DP gather or an a2a backend), so
    `_mask_topk_ids_padded_region` (srt/layers/moe/topk.py) leaves them routed: they run
    through the experts like real tokens and cost their share;
  * masked, on the full runner and under expert parallelism: their top-k ids are set to -1,
    so no expert computes them; here their pairs are dropped the same way.
A padded row never changes a real row's routing (no expert has a capacity here or in SGLang's
fused MoE), and in SGLang's fused kernel every output row is computed from its own hidden row.
Here the experts' GEMMs on the CPU take BLAS's matrix-vector path for an expert that got one
row, so a real row's rounding can depend on how many rows share its expert: what validate
checks for an MoE model is stated in engines/compare.py.

The combine is deterministic: each pair's output written back to its slot and the top-k slots
of a token summed in a fixed order (SGLang's moe_sum), never scattered with atomics.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bcgtune.engines.mlp import MLP
from bcgtune.engines.shapes import MoeConfig, RankDims

# The rows of the batch in flight that are real (a 1-element long tensor), set by an engine
# around its static-buffer forwards; None: every row is real (an eager forward).
_NON_PADDED: ContextVar[torch.Tensor | None] = ContextVar("bcgtune_non_padded", default=None)
SKEW_SIGMA = 0.25


def non_padded_rows() -> ContextVar[torch.Tensor | None]:
    return _NON_PADDED


@dataclass(frozen=True)
class ExpertGemm:
    """How this engine runs the experts' GEMMs: torch's grouped GEMM (one call per layer for
    all experts) or a loop over the experts with at least one row; `why` when looped."""

    grouped: bool
    why: str = ""

    @property
    def name(self) -> str:
        return "grouped (torch._grouped_mm)" if self.grouped else "looped (one GEMM per expert)"


def probe_grouped_gemm(device: torch.device, dtype: torch.dtype, hidden: int, width: int) -> ExpertGemm:
    """Does torch's grouped GEMM run here for both of the experts' GEMMs at these shapes
    (hidden -> 2 x width, width -> hidden; the weights in the layout the layer keeps them, a
    row past the last group as a dropped pair leaves)? Checked against a loop over the groups."""
    fn = getattr(torch, "_grouped_mm", None)
    if fn is None:
        return ExpertGemm(False, f"torch {torch.__version__} has no _grouped_mm")
    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        offs = torch.tensor([2, 6], dtype=torch.int32, device=device)
        tol = 1e-3 if dtype == torch.float32 else 5e-2
        for k, n in ((hidden, 2 * width), (width, hidden)):
            x = torch.randn(7, k, generator=g).to(device=device, dtype=dtype)
            w = torch.randn(2, n, k, generator=g).to(device=device, dtype=dtype)
            out = fn(x, w.transpose(1, 2), offs=offs)[:6]
            ref = torch.cat([x[:2] @ w[0].t(), x[2:6] @ w[1].t()])
            if not torch.allclose(out.float(), ref.float(), atol=tol * max(1.0, float(ref.abs().max())), rtol=tol):
                return ExpertGemm(False, "torch._grouped_mm disagrees with a loop here")
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        return ExpertGemm(False, f"torch._grouped_mm does not run here: {' '.join(str(exc).split())[:160]}")
    return ExpertGemm(True)


class MoELayer(nn.Module):
    """The MoE block of one decoder layer on one rank: router (replicated), this rank's slice
    of the routed experts, optional shared expert; the caller all-reduces the output."""

    e_score_correction_bias: torch.Tensor
    route_bias: torch.Tensor

    def __init__(self, hidden: int, moe: MoeConfig, dims: RankDims, gemm: ExpertGemm, pad_rows: str, **fk: Any):
        super().__init__()
        self.moe = moe
        self.gemm = gemm
        self.mask_padded = pad_rows == "masked"
        self.local = dims.experts
        self.start = dims.expert_start
        width = dims.moe_intermediate
        self.width = width
        self.gate = nn.Linear(hidden, moe.num_experts, bias=False, **fk)
        # each routed expert's gate and up projections stacked ([E, 2I, H]) and its down
        # projection ([E, H, I]), as nn.Linear keeps a weight (out, in)
        self.w13 = nn.Parameter(torch.empty(self.local, 2 * width, hidden, **fk))
        self.w2 = nn.Parameter(torch.empty(self.local, hidden, width, **fk))
        device = fk.get("device")
        self.register_buffer(
            "e_score_correction_bias", torch.zeros(moe.num_experts, device=device, dtype=torch.float32), persistent=False
        )
        self.register_buffer("route_bias", torch.zeros(moe.num_experts, device=device, dtype=torch.float32), persistent=False)
        self.shared: nn.Module | None = None
        self.shared_gate: nn.Linear | None = None
        if dims.shared_intermediate:
            self.shared = MLP(hidden, dims.shared_intermediate, **fk)
            if moe.shared_gate:
                self.shared_gate = nn.Linear(hidden, 1, bias=False, **fk)
        self.record: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # routing of each forward, when set

    # ---- routing ------------------------------------------------------------------
    def set_routing(self, mode: str, seed: int, layer: int) -> None:
        """The seeded bias of `mode` (module docstring) for this layer."""
        if mode == "skewed":
            rng = np.random.default_rng([seed, layer, 0x5EED])
            bias = SKEW_SIGMA * rng.standard_normal(self.moe.num_experts)
            self.route_bias.copy_(torch.as_tensor(bias, dtype=torch.float32))
        else:
            self.route_bias.zero_()

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(top-k expert ids [T, k], their weights [T, k] fp32, the score each id was chosen
        on, sorted, [T, k + 1]: the margin of the last choice) as srt/layers/moe/topk.py
        computes them: softmax scores, or sigmoid scores with a correction bias and
        group-limited choice (DeepSeek-V3's biased_grouped_topk)."""
        m = self.moe
        logits = self.gate(x).float() + self.route_bias
        if m.scoring == "sigmoid":
            scores = logits.sigmoid()
            choice = scores + self.e_score_correction_bias
        else:
            scores = logits.softmax(dim=-1)
            choice = scores
        if m.n_group > 1:
            t = x.shape[0]
            grouped = choice.view(t, m.n_group, -1)
            group_score = grouped.topk(2, dim=-1).values.sum(-1) if m.correction_bias else grouped.max(dim=-1).values
            keep = group_score.topk(m.topk_group, dim=-1).indices
            mask = torch.zeros_like(group_score).scatter_(1, keep, 1.0)
            mask = mask.unsqueeze(-1).expand_as(grouped).reshape(t, -1)
            choice = choice.masked_fill(mask == 0, float("-inf"))
        k1 = min(m.top_k + 1, m.num_experts)
        top = choice.topk(k1, dim=-1)
        ids = top.indices[:, : m.top_k]
        weights = scores.gather(1, ids)
        if m.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-20)
        return ids, weights * m.routed_scaling_factor, top.values

    # ---- experts ------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, h = x.shape
        k = self.moe.top_k
        ids, weights, chosen = self.route(x)
        if self.record is not None and not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            self.record.append((ids.detach().clone(), chosen.detach().clone()))
        local = ids - self.start
        keep = (local >= 0) & (local < self.local)  # pairs routed to this rank's experts
        bound = _NON_PADDED.get()
        if self.mask_padded and bound is not None:  # SGLang's _mask_topk_ids_padded_region
            rows = torch.arange(t, device=x.device)
            keep = keep & (rows < bound)[:, None]
        expert = torch.where(keep, local, self.local).reshape(-1)  # dropped pairs: past the last expert
        order = torch.argsort(expert, stable=True)
        # rows per expert, at a fixed size (bincount reads its input's largest value on the host)
        counts = torch.zeros(self.local + 1, dtype=torch.int64, device=x.device).scatter_add_(0, expert, torch.ones_like(expert))
        counts = counts[: self.local]
        offs = torch.cumsum(counts, 0).to(torch.int32)
        rows_sorted = x.index_select(0, order // k)
        if self.gemm.grouped:
            hmid = torch._grouped_mm(rows_sorted, self.w13.transpose(1, 2), offs=offs)
            act = F.silu(hmid[:, : self.width]) * hmid[:, self.width :]
            out = torch._grouped_mm(act, self.w2.transpose(1, 2), offs=offs)
        else:
            out = self._looped(rows_sorted, counts)
        w_sorted = torch.where(keep, weights, 0.0).reshape(-1).index_select(0, order)
        valid = torch.arange(order.numel(), device=x.device) < offs[-1]  # the dropped pairs sort last
        out = torch.where(valid[:, None], out, 0.0) * w_sorted[:, None].to(out.dtype)
        slots = torch.empty_like(out)
        slots[order] = out  # back to (token, slot) order: one write per pair, no atomics
        y = slots.view(t, k, h).sum(dim=1)
        if self.shared is not None:
            s = self.shared(x)
            if self.shared_gate is not None:
                s = torch.sigmoid(self.shared_gate(x)) * s
            y = y + s
        return y

    def _looped(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The experts one GEMM at a time, over the rows each got (reads the counts on the
        host: no CUDA graph can hold it)."""
        out = torch.zeros(rows.shape[0], rows.shape[1], dtype=rows.dtype, device=rows.device)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n:
                seg = rows[start : start + n]
                hmid = seg @ self.w13[e].t()
                act = F.silu(hmid[:, : self.width]) * hmid[:, self.width :]
                out[start : start + n] = act @ self.w2[e].t()
            start += n
        return out


def routing_spread(model: nn.Module, tokens: int = 4096, seed: int = 0) -> dict[str, float] | None:
    """How unevenly the model's routers spread `tokens` random hidden rows over the experts:
    the busiest expert's load over the mean and the share of experts left idle, averaged over
    the MoE layers (None: no MoE layer). A statistic of the routing bias drawn, printed with
    the calibration."""
    layers = [m for m in model.modules() if isinstance(m, MoELayer)]
    if not layers:
        return None
    p = next(model.parameters())
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(tokens, layers[0].gate.in_features, generator=g).to(device=p.device, dtype=p.dtype)
    busiest, idle = [], []
    with torch.no_grad():
        for layer in layers:
            ids = layer.route(x)[0]
            load = torch.bincount(ids.reshape(-1), minlength=layer.moe.num_experts).float()
            busiest.append(float(load.max() / load.mean()))
            idle.append(float((load == 0).float().mean()))
    return {
        "tokens": tokens,
        "busiest_over_mean": round(math.fsum(busiest) / len(busiest), 3),
        "idle_share": round(math.fsum(idle) / len(idle), 3),
    }
