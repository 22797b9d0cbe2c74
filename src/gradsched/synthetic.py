"""Synthetic profiles for benchmarks and property tests: many tensors, realistic spread.

Sizes follow a CNN/transformer-like mix (biases and norms of a few hundred
elements, weights from thousands to millions); each weight starts a layer whose
compute time grows with its size.  Deterministic for a given seed."""

from __future__ import annotations

import random

from gradsched.profile import Profile, TensorProfile


def synthetic_profile(num_tensors: int = 1000, *, seed: int = 0, flops_per_s: float = 2e12,
                      model: str | None = None) -> Profile:
    """A profile of ``num_tensors`` fp32 tensors, about half of them weights."""
    rng = random.Random(seed)
    tensors = []
    i = 0
    while i < num_tensors:
        numel = int(10 ** rng.uniform(3, 6.5))
        # ~6 flops per parameter per sample (2 forward + 4 backward) at batch 32
        fwd = 2 * numel * 32 / flops_per_s * rng.uniform(0.5, 4)
        tensors.append(TensorProfile(f"layer{i}.weight", numel, 4 * numel, fwd, 2 * fwd))
        i += 1
        if i < num_tensors and rng.random() < 0.8:
            bias = rng.choice([64, 128, 256, 512, 1024])
            tensors.append(TensorProfile(f"layer{i - 1}.bias", bias, 4 * bias, 0.0, 0.0))
            i += 1
    return Profile(model or f"synthetic{num_tensors}", tuple(tensors), other_s=0.0)
