"""The SwiGLU MLP of a decoder layer, a shared expert, or one rank's slice of either."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, **fk):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False, **fk)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False, **fk)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False, **fk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
