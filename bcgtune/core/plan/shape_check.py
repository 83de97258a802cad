"""Does a calibration describe the server it prices? A calibration records the shape it
measured (the model, the tensor-parallel rank, its experts; engines/config.EngineConfig
.shape_json); a profile's launch names a model and a TP size. A list priced on a dense 8B
on one GPU stands for a TP-8 MoE server's rank only by luck, so the commands that price a
profile with a calibration (suggest-buckets, drift, doctor) say when the two differ."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Suffixes that name a checkpoint's packaging, not its architecture: quantisation, tuning,
# release date. Stripped (repeatedly) before two model names are compared.
_PACKAGING = (
    "-fp8",
    "-fp4",
    "-int4",
    "-int8",
    "-awq",
    "-gptq",
    "-mxfp4",
    "-nvfp4",
    "-quark",
    "-dynamic",
    "-bf16",
    "-w4a16",
    "-w8a8",
    "-instruct",
    "-thinking",
    "-chat",
    "-base",
    "-hf",
    "-2507",
)
_QUANTISED = ("fp8", "fp4", "int4", "int8", "awq", "gptq", "mxfp4", "nvfp4", "w4a16", "w8a8")


def base_model_name(name: str) -> str:
    """A model's name without its organisation, folder or packaging suffixes, lower-cased:
    `Qwen/Qwen3-30B-A3B-Instruct-2507-FP8` -> `qwen3-30b-a3b`."""
    parts = name.strip().rstrip("/").split("/")
    if parts[-1].lower() == "config.json" and len(parts) > 1:  # a config's model: its folder's name
        parts.pop()
    base = parts[-1].lower().removesuffix(".json")
    changed = True
    while changed:
        changed = False
        for suffix in _PACKAGING:
            if base.endswith(suffix) and len(base) > len(suffix):
                base = base[: -len(suffix)]
                changed = True
    return base


def quantised(name: str) -> bool:
    """Does a model name say its weights are quantised (FP8, MXFP4, AWQ, ...)?"""
    parts = name.lower().replace("_", "-").split("/")[-1].split("-")
    return any(p in _QUANTISED for p in parts)


@dataclass(frozen=True)
class MeasuredShape:
    """What a calibration says it measured (None fields: not recorded)."""

    model: str
    stands_for: str | None
    tp: int
    ep: int
    experts: int | None  # MoE: routed experts (None: dense)

    @classmethod
    def of(cls, meta: Any) -> MeasuredShape | None:
        """The shape in a calibration's meta, None when it records none (made before bcgtune
        recorded it) or a damaged one."""
        shape = meta.get("shape") if isinstance(meta, dict) else None
        if not isinstance(shape, dict) or not isinstance(shape.get("model"), str):
            return None

        def count(key: str) -> int:
            v = shape.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 1

        moe = shape.get("moe")
        experts = moe.get("experts") if isinstance(moe, dict) else None
        stands = shape.get("stands_for")
        return cls(
            shape["model"][:200],
            stands[:200] if isinstance(stands, str) else None,
            count("tp"),
            count("ep"),
            experts if isinstance(experts, int) and not isinstance(experts, bool) else None,
        )

    def describe(self) -> str:
        tp = f"TP {self.tp}" + (f", EP {self.ep}" if self.ep > 1 else "")
        kind = f"MoE, {self.experts} experts" if self.experts else "dense"
        return f"{self.model} ({kind}, {tp})"


def shape_notes(meta: Any, model: str | None, tp: int | None, ep: int | None = None) -> list[str]:
    """What a calibration's measured shape says against a launch serving `model` at `tp`
    (and `ep`): one sentence per difference, [] when they agree or the launch says nothing."""
    if model is None and tp is None:
        return []
    shape = MeasuredShape.of(meta)
    if shape is None:
        return ["the calibration records no measured shape (made before bcgtune recorded it): its model and TP are not checked"]
    out = []
    if model:
        ours = {base_model_name(shape.model)} | ({base_model_name(shape.stands_for)} if shape.stands_for else set())
        if base_model_name(model) not in ours:
            out.append(
                f"the calibration measured {shape.describe()}, the launch serves {model}: another model's time curve "
                "prices this list (calibrate with --model for its shape, PATH/config.json for any model)"
            )
        elif quantised(model):
            out.append(f"{model} runs quantised kernels, which the calibration's random {shape.model} weights do not reproduce")
    if tp is not None and tp != shape.tp:
        out.append(f"the calibration measured one rank of TP {shape.tp}, the launch runs TP {tp} (calibrate with --tp {tp})")
    if ep is not None and shape.experts and ep != shape.ep:
        out.append(f"the calibration measured EP {shape.ep}, the launch runs EP {ep} (calibrate with --ep {ep})")
    return out
