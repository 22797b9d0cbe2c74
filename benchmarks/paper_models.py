"""Small definitions of the CNNs US-Byte's authors train (ResNet-50, VGG-16; ImageNet shapes), for meta profiles.

Written here from the architectures' published descriptions (He et al. 2016: bottleneck
blocks 3-4-6-3, widths 64-128-256-512 x4; Simonyan and Zisserman 2015: configuration D),
not taken from torchvision, so that the profiles need no download and no torchvision.
Each ``factory(seed)`` follows ``gradsched --model MODULE:FUNCTION`` (docs/profiling.md);
:func:`meta_profile` profiles one on the meta device at a given GPU throughput, which
is what ``gradsched profile --model paper_models:resnet50 --device meta --device-tflops T``
does from this directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

IMAGE = (3, 224, 224)
CLASSES = 1000


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand (x4), each with batch norm; a projected shortcut where the shape changes."""

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        out = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out))
        self.short = (nn.Sequential(nn.Conv2d(c_in, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                      if stride != 1 or c_in != out else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.short(x))


def resnet50_module() -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                               nn.MaxPool2d(3, 2, 1)]
    c_in = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Bottleneck(c_in, width, stride if b == 0 else 1))
            c_in = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, CLASSES)]
    return nn.Sequential(*layers)


def vgg16_module() -> nn.Module:
    layers: list[nn.Module] = []
    c_in = 3
    for c in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
        if c == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(c_in, int(c), 3, padding=1), nn.ReLU(inplace=True)]
            c_in = int(c)
    layers += [nn.Flatten(), nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Linear(4096, 4096),
               nn.ReLU(inplace=True), nn.Linear(4096, CLASSES)]
    return nn.Sequential(*layers)


def _batch(batch_size: int, generator: torch.Generator | None = None,
           device: str = "cpu", image: tuple[int, int, int] = IMAGE) -> tuple[torch.Tensor, torch.Tensor]:
    if device == "meta":
        return torch.empty(batch_size, *image, device="meta"), torch.zeros(batch_size, dtype=torch.long, device="meta")
    return (torch.randn(batch_size, *image, generator=generator),
            torch.randint(0, CLASSES, (batch_size,), generator=generator))


def resnet50(seed: int = 0) -> tuple[nn.Module, Callable[..., Any]]:
    torch.manual_seed(seed)
    return resnet50_module(), _batch


def vgg16(seed: int = 0) -> tuple[nn.Module, Callable[..., Any]]:
    torch.manual_seed(seed)
    return vgg16_module(), _batch


# ----------------------------------------------------------------------------- DeAR's other models
class _DenseLayer(nn.Module):
    """BN-ReLU-1x1 (4k) then BN-ReLU-3x3 (k), its output concatenated to its input (Huang et al. 2017)."""

    def __init__(self, c_in: int, growth: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.BatchNorm2d(c_in), nn.ReLU(inplace=True), nn.Conv2d(c_in, 4 * growth, 1, bias=False),
                                  nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True),
                                  nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], 1)


def densenet201_module(growth: int = 32, blocks: tuple[int, ...] = (6, 12, 48, 32)) -> nn.Module:
    c = 2 * growth
    layers: list[nn.Module] = [nn.Conv2d(3, c, 7, 2, 3, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                               nn.MaxPool2d(3, 2, 1)]
    for i, n in enumerate(blocks):
        for _ in range(n):
            layers.append(_DenseLayer(c, growth))
            c += growth
        if i < len(blocks) - 1:  # transition: halve the channels and the resolution
            layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2)]
            c //= 2
    layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, CLASSES)]
    return nn.Sequential(*layers)


def _c(c_in: int, c_out: int, k: Any, s: int = 1, p: Any = 0) -> nn.Module:
    """Convolution (no bias), batch norm, ReLU: Inception-v4's unit."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, k, s, p, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


class _Branches(nn.Module):
    """Branches run on the same input, their outputs concatenated (a branch may fork into a group of its own)."""

    def __init__(self, *branches: nn.Module) -> None:
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([b(x) for b in self.branches], 1)


def _then(first: nn.Module, second: nn.Module) -> nn.Module:
    return nn.Sequential(first, second)


def _inception_a() -> nn.Module:
    return _Branches(nn.Sequential(nn.AvgPool2d(3, 1, 1), _c(384, 96, 1)), _c(384, 96, 1),
                     nn.Sequential(_c(384, 64, 1), _c(64, 96, 3, p=1)),
                     nn.Sequential(_c(384, 64, 1), _c(64, 96, 3, p=1), _c(96, 96, 3, p=1)))


def _inception_b() -> nn.Module:
    return _Branches(nn.Sequential(nn.AvgPool2d(3, 1, 1), _c(1024, 128, 1)), _c(1024, 384, 1),
                     nn.Sequential(_c(1024, 192, 1), _c(192, 224, (1, 7), p=(0, 3)), _c(224, 256, (7, 1), p=(3, 0))),
                     nn.Sequential(_c(1024, 192, 1), _c(192, 192, (1, 7), p=(0, 3)), _c(192, 224, (7, 1), p=(3, 0)),
                                   _c(224, 224, (1, 7), p=(0, 3)), _c(224, 256, (7, 1), p=(3, 0))))


def _inception_c() -> nn.Module:
    def fork(c_in: int) -> nn.Module:
        return _Branches(_c(c_in, 256, (1, 3), p=(0, 1)), _c(c_in, 256, (3, 1), p=(1, 0)))

    return _Branches(nn.Sequential(nn.AvgPool2d(3, 1, 1), _c(1536, 256, 1)), _c(1536, 256, 1),
                     _then(_c(1536, 384, 1), fork(384)),
                     nn.Sequential(_c(1536, 384, 1), _c(384, 448, (3, 1), p=(1, 0)), _c(448, 512, (1, 3), p=(0, 1)),
                                   fork(512)))


def inception_v4_module() -> nn.Module:
    """Szegedy et al. 2017, Inception-v4 (299x299 inputs): stem, 4 A, reduction A, 7 B, reduction B, 3 C."""
    stem = nn.Sequential(_c(3, 32, 3, 2), _c(32, 32, 3), _c(32, 64, 3, p=1),
                         _Branches(nn.MaxPool2d(3, 2), _c(64, 96, 3, 2)),
                         _Branches(nn.Sequential(_c(160, 64, 1), _c(64, 96, 3)),
                                   nn.Sequential(_c(160, 64, 1), _c(64, 64, (7, 1), p=(3, 0)),
                                                 _c(64, 64, (1, 7), p=(0, 3)), _c(64, 96, 3))),
                         _Branches(_c(192, 192, 3, 2), nn.MaxPool2d(3, 2)))
    reduce_a = _Branches(nn.MaxPool2d(3, 2), _c(384, 384, 3, 2),
                         nn.Sequential(_c(384, 192, 1), _c(192, 224, 3, p=1), _c(224, 256, 3, 2)))
    reduce_b = _Branches(nn.MaxPool2d(3, 2), nn.Sequential(_c(1024, 192, 1), _c(192, 192, 3, 2)),
                         nn.Sequential(_c(1024, 256, 1), _c(256, 256, (1, 7), p=(0, 3)), _c(256, 320, (7, 1), p=(3, 0)),
                                       _c(320, 320, 3, 2)))
    return nn.Sequential(stem, *(_inception_a() for _ in range(4)), reduce_a, *(_inception_b() for _ in range(7)),
                         reduce_b, *(_inception_c() for _ in range(3)), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(1536, CLASSES))


VOCAB, SEQ = 30522, 64  # BERT's WordPiece vocabulary; DeAR's sequence length


class Bert(nn.Module):
    """BERT for masked-LM pre-training (Devlin et al. 2019): embeddings, post-norm encoder layers, MLM head tied
    to the word embeddings."""

    def __init__(self, hidden: int, layers: int, heads: int) -> None:
        super().__init__()
        self.words, self.positions, self.types = nn.Embedding(VOCAB, hidden), nn.Embedding(512, hidden), nn.Embedding(
            2, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.encoder = nn.ModuleList(nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0,
                                                                activation="gelu", batch_first=True)
                                     for _ in range(layers))
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.LayerNorm(hidden))
        self.decoder_bias = nn.Parameter(torch.zeros(VOCAB))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.norm(self.words(ids) + self.positions(pos) + self.types(torch.zeros_like(ids)))
        for layer in self.encoder:
            x = layer(x)
        return self.head(x) @ self.words.weight.t() + self.decoder_bias


def _mlm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def _tokens(batch_size: int, generator: torch.Generator | None = None,
            device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    if device == "meta":
        ids = torch.zeros(batch_size, SEQ, dtype=torch.long, device="meta")
        return ids, ids
    ids = torch.randint(0, VOCAB, (batch_size, SEQ), generator=generator)
    return ids, ids


BUILDERS = {"resnet50": resnet50_module, "vgg16": vgg16_module, "densenet201": densenet201_module,
            "inception-v4": inception_v4_module,
            "bert-base": lambda: Bert(768, 12, 12), "bert-large": lambda: Bert(1024, 24, 16)}
TOKEN_MODELS = ("bert-base", "bert-large")


def meta_profile(name: str, batch_size: int, tflops: float, path: Path) -> Path:
    """Profile model ``name`` on the meta device at ``tflops`` (sustained), once; later calls read ``path``."""
    if path.exists():
        return path
    from gradsched.torch.measure.profiler import profile_module

    with torch.device("meta"):
        module = BUILDERS[name]()
    tokens = name in TOKEN_MODELS
    batch = (_tokens(batch_size, device="meta") if tokens else
             _batch(batch_size, device="meta", image=(3, 299, 299) if name == "inception-v4" else IMAGE))
    prof = profile_module(module, batch,
                          loss_fn=_mlm_loss if tokens else nn.functional.cross_entropy,
                          iterations=1, warmup=0, device="meta", device_tflops=tflops, model_name=name)
    prof.extra.update(batch_size=batch_size, device_tflops=tflops,
                      source=f"benchmarks/paper_models.py:{name}, meta device at {tflops:g} TFLOP/s, batch {batch_size}")
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.save(path)
    return path
