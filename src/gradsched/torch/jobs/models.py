"""Built-in models on synthetic, learnable data: what ``gradsched train``, the profiler
and the benchmarks run when the user brings no model of their own.

Every model comes as a :class:`ModelSpec`: the module, a batch maker and a loss.  The
data are synthetic but learnable: inputs are random, targets come from a fixed random
*teacher* (seeded independently of the batch generator), so the loss falls during
training and a run is reproducible from ``(seed, generator)`` alone, with no downloads.

Models (``MODEL_NAMES``):

- ``mlp``: a small multi-layer perceptron (fast; the runtime's tests use it).
- ``cnn``: a small ResNet-like network (residual blocks with BatchNorm, 32x32 input).
- ``vgg``: many 3x3 convolutions then large fully-connected layers, ~13.8M parameters (55 MB of fp32 gradients) at
  32x32 input: communication-heavy relative to its compute, like the DESIGN's regime.
- ``gpt2`` / ``bert``: small configs of ``transformers`` models, random init
  (needs ``pip install transformers``).
- ``replay:PROFILE``: a profile (a file or a bundled name) replayed with emulated
  compute and real parameters (:mod:`gradsched.torch.jobs.replay`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from gradsched.constants import MODEL_NAMES
from gradsched.errors import GradschedError

# Sizes of the synthetic problems (kept small so a CPU step is well under a second).
_IMAGE_SIZE = 32
_NUM_CLASSES = 10
_MLP_IN = 64
_SEQ_LEN = 32
_VOCAB = 512


@dataclass(slots=True)
class ModelSpec:
    """A model plus the data and loss that train it.

    ``make_batch(batch_size, generator)`` returns ``(inputs, targets)`` on the CPU;
    ``loss_fn(module(inputs), targets)`` returns a scalar loss."""

    name: str
    module: nn.Module
    make_batch: Callable[[int, torch.Generator], tuple[Any, Any]]
    loss_fn: Callable[[Any, Any], torch.Tensor]


def build_model(name: str, *, seed: int = 0) -> ModelSpec:
    """Build built-in model ``name`` with parameters drawn from ``seed``.

    The same ``(name, seed)`` gives the same parameters in every process, which is how
    data-parallel ranks start from identical weights without a broadcast.  ``name`` may
    also be ``replay:PROFILE`` (:mod:`gradsched.torch.jobs.replay`) or the user's own
    factory, ``MODULE:FUNCTION`` (:mod:`gradsched.torch.jobs.factory`)."""
    if name.startswith("replay:"):  # a profile replayed: real parameters, emulated compute
        from gradsched.torch.jobs import replay

        module = replay.ReplayModel(replay.load_profile(name.removeprefix("replay:")), seed=seed)
        return ModelSpec(f"replay:{module.profile.model}", module, replay.make_batch, F.mse_loss)
    if ":" in name:
        from gradsched.torch.jobs.factory import build_from_factory

        return ModelSpec(name, *build_from_factory(name, seed))
    builders = {"mlp": _mlp, "cnn": _cnn, "vgg": _vgg, "gpt2": _gpt2, "bert": _bert}
    if name not in builders:
        raise GradschedError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}")
    return builders[name](seed)


# ----------------------------------------------------------------------------- helpers
def _teacher(seed: int, in_features: int, out_features: int) -> torch.Tensor:
    """A fixed random linear map that labels the synthetic inputs (independent of ``seed``'s model init)."""
    g = torch.Generator().manual_seed(1_000_003 + seed)
    # on the CPU always, like the batches it labels: a model built under ``torch.device("meta")``
    # (``gradsched profile --device meta``) still makes real CPU batches
    return torch.randn(in_features, out_features, generator=g, device="cpu")


def _classify(teacher: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: (x.flatten(1) @ teacher).argmax(dim=1)


def _image_batch(teacher: torch.Tensor) -> Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]:
    label = _classify(teacher)

    def make(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch_size, 3, _IMAGE_SIZE, _IMAGE_SIZE, generator=generator, device="cpu")
        # Teacher sees a pooled 8x8 view so that the labels depend on coarse structure.
        return x, label(F.avg_pool2d(x, 4))

    return make


# ----------------------------------------------------------------------------- mlp
def _mlp(seed: int) -> ModelSpec:
    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(_MLP_IN, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                           nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, _NUM_CLASSES))
    label = _classify(_teacher(seed, _MLP_IN, _NUM_CLASSES))

    def make(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch_size, _MLP_IN, generator=generator, device="cpu")
        return x, label(x)

    return ModelSpec("mlp", module, make, F.cross_entropy)


# ----------------------------------------------------------------------------- cnn
class _Block(nn.Module):
    """A basic residual block (two 3x3 convolutions, optional stride-2 projection)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.proj = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.proj(x))


class _ResNetLike(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layers = nn.Sequential(_Block(16, 16, 1), _Block(16, 32, 2), _Block(32, 64, 2), _Block(64, 128, 2))
        self.fc = nn.Linear(128, _NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _cnn(seed: int) -> ModelSpec:
    torch.manual_seed(seed)
    module = _ResNetLike()
    return ModelSpec("cnn", module, _image_batch(_teacher(seed, 3 * 8 * 8, _NUM_CLASSES)), F.cross_entropy)


# ----------------------------------------------------------------------------- vgg
class _VGGLike(nn.Module):
    """Convolutions (cheap in parameters) then large fully-connected layers (most bytes)."""

    def __init__(self) -> None:
        super().__init__()
        cfg = [64, 64, "M", 128, 128, "M", 256, 256, "M"]
        layers: list[nn.Module] = []
        cin = 3
        for c in cfg:
            if c == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(cin, int(c), 3, padding=1), nn.ReLU()]
                cin = int(c)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(256 * 4 * 4, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                                        nn.Linear(2048, _NUM_CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def _vgg(seed: int) -> ModelSpec:
    torch.manual_seed(seed)
    module = _VGGLike()
    return ModelSpec("vgg", module, _image_batch(_teacher(seed, 3 * 8 * 8, _NUM_CLASSES)), F.cross_entropy)


# ----------------------------------------------------------------------------- transformers
def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise GradschedError("models gpt2 and bert need the transformers package: pip install transformers "
                             "(or pip install 'gradsched[transformers]')") from None
    transformers.logging.set_verbosity_error()
    return transformers


class _Logits(nn.Module):
    """Wraps a ``transformers`` model so that ``forward`` returns the logits tensor."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits


def _token_batch(seed: int, per_token: bool) -> Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]:
    """Sequences from a fixed random bigram teacher: learnable next-token / class targets."""
    g = torch.Generator().manual_seed(2_000_003 + seed)
    successor = torch.randint(0, _VOCAB, (_VOCAB,), generator=g, device="cpu")  # CPU even under a meta device

    def make(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        first = torch.randint(0, _VOCAB, (batch_size, 1), generator=generator, device="cpu")
        noise = torch.rand(batch_size, _SEQ_LEN, generator=generator, device="cpu") < 0.1
        rand = torch.randint(0, _VOCAB, (batch_size, _SEQ_LEN), generator=generator, device="cpu")
        cols = [first[:, 0]]
        for j in range(1, _SEQ_LEN + 1):
            nxt = successor[cols[-1]]
            cols.append(torch.where(noise[:, j - 1], rand[:, j - 1], nxt))
        seq = torch.stack(cols, dim=1)
        if per_token:
            return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
        return seq[:, :-1].contiguous(), (seq[:, 0] % _NUM_CLASSES)

    return make


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _gpt2(seed: int) -> ModelSpec:
    tf = _transformers()
    cfg = tf.GPT2Config(vocab_size=_VOCAB, n_positions=_SEQ_LEN, n_embd=128, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(seed)
    module = _Logits(tf.GPT2LMHeadModel(cfg))
    return ModelSpec("gpt2", module, _token_batch(seed, per_token=True), _lm_loss)


def _bert(seed: int) -> ModelSpec:
    tf = _transformers()
    cfg = tf.BertConfig(vocab_size=_VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=_SEQ_LEN, num_labels=_NUM_CLASSES,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    module = _Logits(tf.BertForSequenceClassification(cfg))
    return ModelSpec("bert", module, _token_batch(seed, per_token=False), F.cross_entropy)
