"""Which attention a model layer runs: plain causal SDPA over one sequence (the default, and
the whole-forward graph engine), or a varlen attention over a batch of several requests that
the breakable engine installs for the duration of a forward (eager, warm-up and capture).

A context variable, not a model attribute, so one model object can serve both engines and a
Hugging Face model (whose forward bcgtune does not own) reads the same switch from its
registered attention function."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# fn(q [T, q_heads, head_dim], k [T, kv_heads, head_dim], v [T, kv_heads, head_dim]) -> [T, q_heads, head_dim]
VarlenAttention = Callable[..., "torch.Tensor"]

_CURRENT: ContextVar[VarlenAttention | None] = ContextVar("bcgtune_varlen_attention", default=None)


@contextmanager
def varlen_attention(fn: VarlenAttention) -> Iterator[None]:
    token = _CURRENT.set(fn)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_varlen_attention() -> VarlenAttention | None:
    return _CURRENT.get()
