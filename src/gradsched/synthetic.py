"""Synthetic profiles for benchmarks and property tests: many tensors, realistic spread.

Sizes follow a CNN/transformer-like mix (biases and norms of a few hundred
elements, weights from thousands to millions); each weight starts a layer whose
compute time grows with its size.  Deterministic for a given seed."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from gradsched.cluster import Cluster
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


def heldout_profile(num_tensors: int = 1000, seed: int = 1, flops_per_s: float = 2e12) -> Profile:
    """Tensors of 10 to 20M fp32 elements (40 B to 80 MB), log-uniform, one per layer, compute
    about proportional to size: a spread no planner was tuned on (issues 16 and 40)."""
    rng = random.Random(seed)
    tensors = []
    for i in range(num_tensors):
        numel = int(10 ** rng.uniform(1, 7.3))
        fwd = 2 * numel * 32 / flops_per_s * rng.uniform(0.5, 4)
        tensors.append(TensorProfile(f"t{i}", numel, 4 * numel, fwd, 2 * fwd))
    return Profile(f"heldout{num_tensors}", tuple(tensors))


# The random grid of issue 40: alpha and beta of the all-reduce at 8 workers, extrapolated
ALPHA_RANGE_S = (1e-5, 5e-3)
BETA_RANGE_S_PER_BYTE = (1e-10, 1e-8)
WORKERS_RANGE = (8, 1024)
FLOPS_RANGE = (2e10, 2e12)  # compute from 100x slower than the benchmark's to as fast: from compute- to comm-bound
TENSORS_RANGE = (30, 1000)


@dataclass(frozen=True)
class RandomCase:
    """One draw of the random grid: a held-out profile on an alpha-beta cluster."""

    seed: int
    num_tensors: int
    alpha_s: float  # all-reduce start-up at 8 workers
    beta_s_per_byte: float  # at 8 workers
    workers: int
    flops_per_s: float = 2e12

    def profile(self) -> Profile:
        return heldout_profile(self.num_tensors, self.seed, self.flops_per_s)

    def cluster(self) -> Cluster:
        return Cluster.alpha_beta(self.alpha_s, self.beta_s_per_byte, 8).at_world_size(self.workers)

    def label(self) -> str:
        return (f"seed {self.seed}: {self.num_tensors} tensors, alpha {self.alpha_s:.3g} s, "
                f"beta {self.beta_s_per_byte:.3g} s/B, {self.workers} workers, "
                f"{self.flops_per_s:.3g} flop/s")


def random_case(seed: int, num_tensors: int | None = None) -> RandomCase:
    """A case drawn log-uniformly from the grid (alpha, beta, workers, compute speed, and the
    tensor count unless given), deterministic for ``seed``."""
    rng = random.Random(f"case{seed}")

    def log_uniform(lo: float, hi: float) -> float:
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))

    alpha, beta = log_uniform(*ALPHA_RANGE_S), log_uniform(*BETA_RANGE_S_PER_BYTE)
    workers = round(log_uniform(*WORKERS_RANGE))
    count = num_tensors if num_tensors is not None else round(log_uniform(*TENSORS_RANGE))
    flops = log_uniform(*FLOPS_RANGE)
    return RandomCase(seed, count, alpha, beta, workers, flops)
