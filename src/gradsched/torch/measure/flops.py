"""FLOP-based timing on the meta device, and transformer configs too large to run here.

On ``torch.device("meta")`` tensors have shapes but no storage, so a model of any
size can be built and run forward and backward in milliseconds without allocating
its parameters.  Nothing is computed, so nothing can be timed; instead PyTorch's FLOP
counter (``torch.utils.flop_counter``) counts the floating-point operations each
operator would do and a :class:`FlopClock` turns the running count into seconds at a
rate the user gives (``--device-tflops``: the *achieved*, not the peak, rate of the
target device).  The profiler reads that clock where it would read the wall clock,
so the per-layer attribution is the same code for measured and estimated profiles.

What this model of time leaves out, on purpose: operators the counter does not know
(element-wise ops, norms, softmax) cost nothing, and every counted FLOP runs at one
rate.  Backward costs what autograd actually runs (about twice the forward for
matrix products; the first layer skips its input gradient).

The reference transformers below (:data:`PRESETS`) are plain PyTorch with the shapes
of GPT-2-XL and a LLaMA-7B-like model, so that planning a model far larger than this
machine needs neither a download nor the ``transformers`` package.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from gradsched.errors import GradschedError


class FlopClock:
    """Seconds of device time implied by the FLOPs counted so far.

    Use as a context manager around the forward and backward passes; call it to read
    the clock.  ``tflops`` is the device's sustained rate in 10^12 FLOP/s."""

    def __init__(self, tflops: float) -> None:
        if not (isinstance(tflops, (int, float)) and math.isfinite(tflops) and tflops > 0):
            raise GradschedError(f"--device-tflops must be a positive number of TFLOP/s, got {tflops!r}")
        self.flops_per_s = float(tflops) * 1e12
        self._counter = FlopCounterMode(display=False)
        self._offset_flops = 0  # flops of earlier `with` blocks (the counter resets on entry)

    def __enter__(self) -> "FlopClock":
        self._counter.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._offset_flops += self._counter.get_total_flops()
        self._counter.__exit__(*exc)

    @property
    def flops(self) -> int:
        """FLOPs counted since the clock was created."""
        return self._offset_flops + (self._counter.get_total_flops() if self._counter.mode is not None else 0)

    def __call__(self) -> float:
        return self.flops / self.flops_per_s


# --------------------------------------------------------------------------- models
@dataclass(frozen=True, slots=True, kw_only=True)
class TransformerConfig:
    """Shape of a decoder-only transformer (what its FLOPs and tensor sizes depend on)."""

    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int
    seq_len: int  # tokens per sample (also the learned position table's length)
    ffn_hidden: int  # hidden width of the MLP
    gated_mlp: bool = False  # SwiGLU (gate, up, down) as in LLaMA, else GELU MLP as in GPT-2
    tie_embeddings: bool = True  # output projection shares the token embedding (GPT-2)
    learned_positions: bool = True  # a position embedding table (GPT-2); LLaMA's RoPE has no parameters
    bias: bool = True  # biases in linear layers and norms (GPT-2 yes, LLaMA no)

    @property
    def num_parameters(self) -> int:
        """Parameter count, computed from the shapes (no model is built)."""
        d, f, b = self.n_embd, self.ffn_hidden, int(self.bias)
        attn = 4 * d * d + 4 * d * b
        mlp = (3 if self.gated_mlp else 2) * d * f + (f + d) * b
        norms = 2 * (d + d * b)
        per_layer = attn + mlp + norms
        emb = self.vocab_size * d + (self.seq_len * d if self.learned_positions else 0)
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return self.n_layer * per_layer + emb + (d + d * b) + head


PRESETS: dict[str, TransformerConfig] = {
    # GPT-2-XL: 48 layers, width 1600, 25 heads, 1024-token context: 1.56e9 parameters.
    "gpt2-xl": TransformerConfig(n_layer=48, n_embd=1600, n_head=25, vocab_size=50257, seq_len=1024,
                                 ffn_hidden=6400),
    # LLaMA-7B's shapes (SwiGLU, untied head, no biases, RoPE): 6.7e9 parameters.
    "llama-7b": TransformerConfig(n_layer=32, n_embd=4096, n_head=32, vocab_size=32000, seq_len=2048,
                                  ffn_hidden=11008, gated_mlp=True, tie_embeddings=False,
                                  learned_positions=False, bias=False),
}


class _Block(nn.Module):
    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.n_head = c.n_head
        self.ln_1 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.qkv = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.attn_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.ln_2 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.gated = c.gated_mlp
        if c.gated_mlp:
            self.gate = nn.Linear(c.n_embd, c.ffn_hidden, bias=False)
        self.up = nn.Linear(c.n_embd, c.ffn_hidden, bias=c.bias)
        self.down = nn.Linear(c.ffn_hidden, c.n_embd, bias=c.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, d))
        h = self.ln_2(x)
        h = F.silu(self.gate(h)) * self.up(h) if self.gated else F.gelu(self.up(h))
        return x + self.down(h)


class Transformer(nn.Module):
    """A decoder-only transformer built from a :class:`TransformerConfig`; maps tokens to logits."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.config = c
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.seq_len, c.n_embd) if c.learned_positions else None
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


@dataclass(frozen=True)
class TransformerSpec:
    """A model ready to profile: the same three things ``gradsched.torch.jobs.models`` gives."""

    module: Transformer
    config: TransformerConfig

    def make_batch(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Random tokens and next-token targets, ``batch_size`` x ``seq_len`` (int64, on the CPU)."""
        c = self.config
        tokens = torch.randint(0, c.vocab_size, (batch_size, c.seq_len + 1), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]

    @staticmethod
    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def build_transformer(config: TransformerConfig | str, *, device: str | torch.device = "meta") -> TransformerSpec:
    """Build a reference transformer (on the meta device by default: nothing allocated)."""
    if isinstance(config, str):
        if config not in PRESETS:
            raise GradschedError(f"unknown transformer preset {config!r}; known: {', '.join(PRESETS)}")
        config = PRESETS[config]
    if config.n_embd % config.n_head:
        raise GradschedError(f"n_embd {config.n_embd} is not a multiple of n_head {config.n_head}")
    with torch.device(device):
        module = Transformer(config)
    return TransformerSpec(module, config)
