"""Stage 2 of a run (stage 1 is engines/config.resolve): the resolved EngineConfig bound to
torch. The device confirmed (and, for a real all-reduce, the ranks' process group joined),
the kernel probes run once (SDPA's native GQA, flash attention's varlen kernel, torch's
grouped GEMM for MoE experts, the breakable capture machinery), the model built or loaded,
and the runner's engine made; `EngineSession.new_engine` makes every further engine over the
same model. Nothing here decides what stage 1 decided.

The simulated device (a config whose device is "sim", engines/sim) branches off first: its
session is assembled from the recording it replays and torch is never imported, except for
validate's numerics (`numerics=True`), which a tiny stand-in model computes on the CPU
(engines/config.standin_config, engines/sim/engine.NumericsOnSim)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from bcgtune.engines.config import EngineConfig
from bcgtune.engines.spec import RUNNER_HELP
from bcgtune.errors import ExternalError

if TYPE_CHECKING:  # torch is imported where a run is bound, never for a run that needs none
    import torch

    from bcgtune.engines.records import Environment
    from bcgtune.engines.sim.device import SimDevice


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a resolved dtype name (bf16, fp16, fp32)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


@dataclass(frozen=True)
class Kernels:
    """What the kernel probes answered, once per session."""

    native_gqa: bool  # SDPA's pinned backend takes enable_gqa
    attention_kind: str  # breakable: flash-varlen or sdpa-per-request
    graph_impl: Any  # breakable on a GPU: engines.segmented.GraphImpl; None otherwise
    expert_gemm: Any  # MoE: engines.moe.ExpertGemm; None without MoE layers


@dataclass(frozen=True)
class EngineSettings:
    """How the engine runs, as its reports state it."""

    runner: str
    graph_mode: str
    graph_impl: str
    graph_impl_note: str | None
    attention: str | None
    sdpa_backend: str
    tensor_parallel: str
    expert_gemm: str | None
    routing: str | None
    pad_rows: str | None
    numerics: str | None = None  # the simulated device's validate: what computes the outputs compared

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "graph_mode": self.graph_mode,
            "runner": self.runner,
            "runner_matches": RUNNER_HELP[self.runner],
            "graph_impl": self.graph_impl,
        }
        if self.runner == "breakable":
            out["attention"] = self.attention
            if self.graph_impl_note:
                out["graph_impl_note"] = self.graph_impl_note
        out["sdpa_backend"] = self.sdpa_backend
        out["tensor_parallel"] = self.tensor_parallel
        if self.expert_gemm is not None:
            out.update(expert_gemm=self.expert_gemm, routing=self.routing, pad_rows=self.pad_rows)
        if self.numerics is not None:
            out["numerics"] = self.numerics
        return out


@dataclass
class EngineSession:
    """A built engine over a loaded model, with what its reports say about it."""

    config: EngineConfig
    device: torch.device | SimDevice  # SimDevice: the simulated device (engines/sim)
    dtype: torch.dtype | None  # None on the simulated device
    model: Any  # the torch module (DecoderLM, or a transformers checkpoint behind HFPrefillModel); None simulated
    description: dict[str, Any]  # the model, for reports
    environment: Environment
    settings: EngineSettings
    kernels: Kernels
    engine: Any  # BreakablePrefillEngine | FullPrefillEngine | engines.sim.engine.SimEngine (or NumericsOnSim)

    def report_environment(self) -> dict[str, Any]:
        """Hardware, software and engine settings in one table, as reports carry them."""
        return {**self.environment.to_json(), **self.settings.to_json()}

    def new_engine(self, max_tokens: int) -> Any:
        """A fresh engine of the same runner over the same model, with static buffers for
        `max_tokens` (its own pool: graphs of an earlier engine are not shared); on the
        simulated device another engine on the same simulated device."""
        if self.config.simulated:
            return self.engine.fresh(max_tokens)
        return _runner_engine(self.config, self.model, cast("torch.device", self.device), max_tokens, self.kernels)


def _bind_device(cfg: EngineConfig) -> torch.device:
    """The torch device of the resolved one (a real all-reduce's rank on its own GPU)."""
    import torch

    if cfg.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        why = (
            "this machine shows a GPU but torch sees none; pass --device cpu for a CPU run"
            if cfg.spec.device in ("auto", "", None)
            else f"device {cfg.spec.device!r} asked for but torch sees no GPU"
        )
        raise ExternalError(
            f"{why} (torch {torch.__version__}, cuda {torch.version.cuda}, hip {getattr(torch.version, 'hip', None)})"
        )
    base = int(cfg.device.split(":")[1]) if ":" in cfg.device else 0
    index = base + (cfg.parallel.rank if cfg.parallel.all_reduce == "real" else 0)
    if index >= torch.cuda.device_count():
        raise ExternalError(f"GPU {index} asked for and torch sees {torch.cuda.device_count()}")
    weights = cfg.model.rank_params * torch.finfo(torch_dtype(cfg.dtype)).bits / 8 / 2**30
    total = torch.cuda.get_device_properties(index).total_memory / 2**30
    if weights > 0.9 * total:  # refused before it is built, not an out-of-memory error mid-build
        tp = cfg.parallel.tp
        raise ExternalError(
            f"{cfg.model.name}'s weights {'on one rank of TP ' + str(tp) + ' ' if tp > 1 else ''}take ~{weights:.0f} GiB "
            f"and this GPU has {total:.0f} GiB: give --tp with more ranks (each holds a slice)"
        )
    return torch.device("cuda", index)


def _join_ranks(cfg: EngineConfig, device: torch.device) -> None:
    """A real all-reduce: this process joins the ranks' process group (NCCL on GPUs, gloo on
    the CPU), once."""
    import datetime as dt

    import torch
    import torch.distributed as dist

    par = cfg.parallel
    if par.all_reduce != "real" or dist.is_initialized():
        return
    if par.rendezvous is None:
        raise ExternalError("a real all-reduce needs its ranks started together (services/ranks.run_ranks)")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        par.backend or "gloo",
        init_method=f"file://{par.rendezvous}",
        rank=par.rank,
        world_size=par.tp,
        timeout=dt.timedelta(seconds=600),
    )


def _probe_native_gqa(device: torch.device, dtype: torch.dtype, sdpa_backend: str) -> bool:
    """Does the pinned SDPA backend take enable_gqa? (flash does on recent torch; if not,
    the models repeat K/V heads themselves, identically in eager and capture.)"""
    import torch

    from bcgtune.engines.sdpa import sdpa_context

    q = torch.randn(1, 4, 8, 64, device=device, dtype=dtype)
    k = torch.randn(1, 2, 8, 64, device=device, dtype=dtype)
    try:
        with sdpa_context(sdpa_backend):
            torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
        return True
    except RuntimeError:
        return False


def _attention_shape(cfg: EngineConfig) -> tuple[int, int, int] | None:
    """(heads, KV heads, head size) of this rank's attention, when bcgtune builds the model."""
    shape, dims = cfg.model.shape, cfg.parallel.dims
    if shape is None or dims is None:
        return None
    if shape.mla is not None:
        return dims.heads, dims.heads, shape.mla.qk_head_dim
    return dims.heads, dims.kv_heads, shape.head_dim


def _checkpoint_attention(model: Any) -> tuple[int, int, int]:
    """(heads, KV heads, head size) of a loaded checkpoint's attention."""
    c = model.cfg
    heads = int(getattr(c, "num_heads", None) or getattr(c, "num_attention_heads", None) or 1)
    kv = int(getattr(c, "num_kv_heads", None) or getattr(c, "num_key_value_heads", None) or heads)
    return heads, kv, int(getattr(c, "head_dim", None) or model.hidden_size // heads)


def _runner_kernels(cfg: EngineConfig, device: torch.device, dtype: torch.dtype, model: Any) -> tuple[str, Any]:
    """The breakable runner's attention kernel and capture machinery (once per session)."""
    if cfg.runner != "breakable":
        return "sdpa-per-request", None
    from bcgtune.engines.breakable import flash_varlen_works

    heads, kv, hd = _attention_shape(cfg) or _checkpoint_attention(model)
    attention = "flash-varlen" if flash_varlen_works(device, dtype, heads, kv, hd) else "sdpa-per-request"
    if device.type != "cuda":
        return attention, None
    from bcgtune.engines.segmented import resolve_impl

    return attention, resolve_impl(cfg.graph_impl)


def _expert_gemm(cfg: EngineConfig, device: torch.device, dtype: torch.dtype) -> Any:
    """How the MoE experts' GEMMs run (None: no MoE layer bcgtune builds)."""
    shape, dims = cfg.model.shape, cfg.parallel.dims
    if shape is None or shape.moe is None or dims is None:
        return None
    from bcgtune.engines.moe import probe_grouped_gemm

    gemm = probe_grouped_gemm(device, dtype, shape.hidden_size, dims.moe_intermediate)
    if device.type == "cuda" and not gemm.grouped:
        raise ExternalError(
            f"{cfg.model.name}'s MoE layers on the GPU need torch's grouped GEMM, so that one graph holds every "
            f"expert ({gemm.why}); the looped GEMMs read the routing on the host, which no CUDA graph can hold"
        )
    return gemm


def _load(cfg: EngineConfig, device: torch.device, dtype: torch.dtype, native_gqa: bool, gemm: Any) -> tuple[Any, dict[str, Any]]:
    """The model (built from its shape, or a checkpoint through transformers) and its
    description."""
    if cfg.model.kind == "hf":
        from bcgtune.engines import hf

        assert cfg.model.path is not None
        model = hf.load_hf_model(
            cfg.model.path,
            device,
            dtype,
            fix_attention=cfg.causal_fix,
            random_weights=cfg.spec.random_weights,
            seed=cfg.seed,
            native_gqa=native_gqa,
        )
        desc = model.describe()
        desc["transformers"] = getattr(model, "transformers_version", None)
        desc["random_weights"] = cfg.spec.random_weights
        return model, desc
    from bcgtune.engines.models import Comm, build_model
    from bcgtune.engines.moe import routing_spread

    shape, par = cfg.model.shape, cfg.parallel
    assert shape is not None and par.dims is not None
    comm = Comm(par.all_reduce, par.curve, shape.hidden_size, dtype.itemsize)
    comm.calibrate_clock(device)
    built = build_model(
        shape, device, dtype, cfg.seed, dims=par.dims, comm=comm, gemm=gemm, pad_rows=cfg.pad_rows, routing=cfg.routing
    )
    for layer in built.layers:
        layer.self_attn.native_gqa = native_gqa  # type: ignore[union-attr]  # a decoder layer's attention module
    info: dict[str, Any] = {
        "source": "built-in" if cfg.model.kind == "builtin" else "config.json",
        "name": shape.name,
        "random_weights": True,
        "seed": cfg.seed,
        **shape.to_dict(),
    }
    if cfg.model.path:
        info["config"] = cfg.model.path
    info["tensor_parallel"] = {"tp": par.tp, "rank": par.rank, "ep": par.ep, "rank_params": cfg.model.rank_params}
    if shape.moe is not None:
        info["routing"] = cfg.routing
        info["routing_spread"] = routing_spread(built, seed=cfg.seed)
    return built, info


def _runner_engine(cfg: EngineConfig, model: Any, device: torch.device, max_tokens: int, kernels: Kernels) -> Any:
    if cfg.runner == "breakable":
        from bcgtune.engines.breakable import BreakablePrefillEngine

        return BreakablePrefillEngine(
            model,
            device,
            max_tokens,
            sdpa_backend=cfg.sdpa_backend,
            warmup=cfg.capture_warmup,
            graph_impl=kernels.graph_impl if kernels.graph_impl is not None else cfg.graph_impl,
            fault=cfg.fault,
            attention_kind=kernels.attention_kind,
        )
    from bcgtune.engines.full import FullPrefillEngine

    return FullPrefillEngine(model, device, max_tokens, sdpa_backend=cfg.sdpa_backend, warmup=cfg.capture_warmup, fault=cfg.fault)


def _open_simulated(cfg: EngineConfig, max_tokens: int, numerics: bool) -> EngineSession:
    """The simulated device's session (module docstring): no torch unless `numerics`."""
    from bcgtune.engines.sim.engine import SIM_MODE, NumericsOnSim, open_sim

    sim = open_sim(cfg, max_tokens)
    engine: Any = sim.engine
    note = None
    if numerics:
        from bcgtune.engines.config import standin_config

        standin = standin_config(cfg, max_tokens)
        engine = NumericsOnSim(sim.engine, open_engine(standin, max_tokens).engine, standin.model.name)
        note = engine.standin_text
    par = cfg.parallel
    rank = "one GPU (TP 1)" if par.tp == 1 else f"rank {par.rank} of TP {par.tp}" + (f", EP {par.ep}" if par.ep > 1 else "")
    settings = EngineSettings(
        runner=cfg.runner,
        graph_mode=SIM_MODE,
        graph_impl=SIM_MODE,
        graph_impl_note=None,
        attention=SIM_MODE,
        sdpa_backend=SIM_MODE,
        tensor_parallel=rank + (": all-reduces as the recording measured them" if par.tp > 1 else ""),
        expert_gemm=None,
        routing=None,
        pad_rows=None,
        numerics=note,
    )
    kernels = Kernels(native_gqa=False, attention_kind=SIM_MODE, graph_impl=None, expert_gemm=None)
    return EngineSession(cfg, sim.device, None, None, sim.description, sim.environment, settings, kernels, engine)


def open_engine(cfg: EngineConfig, max_tokens: int | None = None, numerics: bool = False) -> EngineSession:
    """The engine of `cfg` with static buffers for `max_tokens` (default: the largest size
    it was resolved for), the model built on its device. On the simulated device no torch is
    loaded; `numerics` asks for an engine that computes outputs there (validate's)."""
    if cfg.simulated:
        return _open_simulated(cfg, max_tokens or cfg.max_tokens, numerics)
    device = _bind_device(cfg)
    _join_ranks(cfg, device)
    import torch

    from bcgtune.engines.runtime import environment

    dtype = torch_dtype(cfg.dtype)
    from bcgtune.engines.sdpa import check_sdpa_backend

    check_sdpa_backend(cfg.sdpa_backend, device, dtype)
    torch.manual_seed(cfg.seed)
    native = _probe_native_gqa(device, dtype, cfg.sdpa_backend)
    gemm = _expert_gemm(cfg, device, dtype)
    model, desc = _load(cfg, device, dtype, native, gemm)
    attention, impl = _runner_kernels(cfg, device, dtype, model)
    kernels = Kernels(native, attention, impl, gemm)
    desc["dtype"] = str(dtype).replace("torch.", "")
    desc["sdpa_native_gqa"] = kernels.native_gqa
    engine = _runner_engine(cfg, model, device, max_tokens or cfg.max_tokens, kernels)
    settings = EngineSettings(
        runner=cfg.runner,
        graph_mode=engine.mode,
        graph_impl=engine.graph_impl,
        graph_impl_note=impl.note if impl is not None and impl.note else None,
        attention=kernels.attention_kind if cfg.runner == "breakable" else None,
        sdpa_backend=cfg.sdpa_backend,
        tensor_parallel=cfg.parallel.describe(),
        expert_gemm=None if kernels.expert_gemm is None else kernels.expert_gemm.name,
        routing=cfg.routing if kernels.expert_gemm is not None else None,
        pad_rows=cfg.pad_rows if kernels.expert_gemm is not None else None,
    )
    return EngineSession(cfg, device, dtype, model, desc, environment(device), settings, kernels, engine)
