"""Convert B-Caffe's GoogLeNet logs into gradsched's bundled profile and cluster files.

The MG-WFBP authors published per-layer measurements of GoogLeNet on an 8-node K80
cluster with 10 Gb Ethernet (``shyhuai/B-Caffe``, ``logdata/``; a copy with its README
is in ``tests/data/bcaffe-googlenet``).  This script turns them into:

- ``googlenet.profile.json``: 128 tensors in forward order, backward times from the
  one-node log, forward times and ``other_s`` from the assumptions in docs/cost-model.md;
- ``googlenet-10gbe.p{2,4,8}.cluster.json``: the OSU all-reduce latency table as
  ``points`` plus a line fitted on the large-message protocol (sizes >= 12 KiB);
- ``googlenet-intrain.p{2,4,8}.cluster.json``: a line fitted on the all-reduce times
  measured inside training (slower than OSU; see docs/cost-model.md).

Usage (from the repository root)::

    python scripts/convert_bcaffe.py                      # tests/data copy -> src/gradsched/data
    python scripts/convert_bcaffe.py /work/shared/data/bcaffe-googlenet --check
    python scripts/convert_bcaffe.py --report             # in-training vs OSU, per world size

The output is deterministic, and a test checks that running this on the tests/data
copy reproduces the packaged files byte for byte.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gradsched.cluster import Cluster, CollectiveCost
from gradsched.errors import GradschedError
from gradsched.profile import Profile, TensorProfile

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SRC = ROOT / "tests" / "data" / "bcaffe-googlenet"
DEFAULT_OUT = ROOT / "src" / "gradsched" / "data"

WORLD_SIZES = (2, 4, 8)
NUM_TENSORS = 128
ELEMENT_BYTES = 4  # fp32
BATCH_PER_NODE = 64
ONE_NODE_SAMPLES_PER_S = 163.36  # README: one-node throughput
ONE_NODE_ITERATION_S = BATCH_PER_NODE / ONE_NODE_SAMPLES_PER_S  # 0.3918 s
FORWARD_PER_BACKWARD = 0.5  # assumed: a layer's forward costs half its backward (docs/cost-model.md)
PROTOCOL_SWITCH_BYTES = 12288  # first OSU size after the eager -> rendezvous jump (8 KiB -> 12 KiB)
DIGITS = 12  # seconds are rounded to picoseconds so the JSON is short and stable

# --------------------------------------------------------------------------- model
# BVLC GoogLeNet as trained by Caffe (train_val.prototxt), in prototxt order, which is
# the order of the logged parameters: (name, in_channels, out_channels, kernel) per
# parameterised layer.  Derived from the published architecture (Szegedy et al. 2015,
# table 1) and checked against every numel in the logs by ``_check_sizes``.
_INCEPTION = {  # name: (in, 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj)
    "inception_3a": (192, 64, 96, 128, 16, 32, 32),
    "inception_3b": (256, 128, 128, 192, 32, 96, 64),
    "inception_4a": (480, 192, 96, 208, 16, 48, 64),
    "inception_4b": (512, 160, 112, 224, 24, 64, 64),
    "inception_4c": (512, 128, 128, 256, 24, 64, 64),
    "inception_4d": (512, 112, 144, 288, 32, 64, 64),
    "inception_4e": (528, 256, 160, 320, 32, 128, 128),
    "inception_5a": (832, 256, 160, 320, 32, 128, 128),
    "inception_5b": (832, 384, 192, 384, 48, 128, 128),
}


def _aux_head(prefix: str, in_ch: int) -> list[tuple[str, int, int, int]]:
    """An auxiliary classifier: 1x1 conv to 128, fc on the 4x4x128 map to 1024, classifier."""
    return [(f"{prefix}/conv", in_ch, 128, 1), (f"{prefix}/fc", 128 * 4 * 4, 1024, 1),
            (f"{prefix}/classifier", 1024, 1000, 1)]


def googlenet_layers() -> list[tuple[str, int, int, int]]:
    """GoogLeNet's 64 parameterised layers as ``(name, in, out, kernel)`` in forward order."""
    layers = [("conv1/7x7_s2", 3, 64, 7), ("conv2/3x3_reduce", 64, 64, 1), ("conv2/3x3", 64, 192, 3)]
    for name, (cin, c1, c3r, c3, c5r, c5, pp) in _INCEPTION.items():
        layers += [(f"{name}/1x1", cin, c1, 1), (f"{name}/3x3_reduce", cin, c3r, 1), (f"{name}/3x3", c3r, c3, 3),
                   (f"{name}/5x5_reduce", cin, c5r, 1), (f"{name}/5x5", c5r, c5, 5),
                   (f"{name}/pool_proj", cin, pp, 1)]
        if name == "inception_4a":
            layers += _aux_head("loss1", 512)
        if name == "inception_4d":
            layers += _aux_head("loss2", 528)
    layers.append(("loss3/classifier", 1024, 1000, 1))
    return layers


def googlenet_tensors() -> list[tuple[str, int]]:
    """``(name, numel)`` of the 128 tensors (weight then bias per layer) in forward order."""
    out = []
    for name, cin, cout, k in googlenet_layers():
        out += [(f"{name}.weight", cin * cout * k * k), (f"{name}.bias", cout)]
    return out


# --------------------------------------------------------------------------- logs
@dataclass(frozen=True, slots=True)
class Record:
    """One ``[param_id, numel, backward_us, comm_us(, merged_comm_us)]`` log record."""

    param_id: int
    numel: int
    backward_us: float
    comm_us: float
    merged_comm_us: float | None


_RECORD = re.compile(r"\]\s*\[([^\]]*)\]\s*$")


def read_records(path: Path) -> list[Record]:
    """The last 128 records of a ``tmp*comm.log`` (earlier blocks may be all zeros)."""
    records = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        m = _RECORD.search(line)
        if not m:
            continue
        try:
            fields = [float(x) for x in m.group(1).split(",")]
        except ValueError:
            raise GradschedError(f"{path}:{lineno}: record {m.group(1)!r} is not a list of numbers") from None
        if len(fields) not in (4, 5):
            raise GradschedError(f"{path}:{lineno}: expected 4 or 5 fields, got {len(fields)}")
        records.append(Record(int(fields[0]), int(fields[1]), fields[2], fields[3],
                              fields[4] if len(fields) == 5 else None))
    if len(records) < NUM_TENSORS:
        raise GradschedError(f"{path}: {len(records)} records, need the last {NUM_TENSORS}; is this a GoogLeNet log?")
    last = records[-NUM_TENSORS:]
    if [r.param_id for r in last] != list(range(NUM_TENSORS)):
        raise GradschedError(f"{path}: the last {NUM_TENSORS} records are not param ids 0..{NUM_TENSORS - 1} in order")
    return last


def read_osu(path: Path, world_size: int) -> list[tuple[int, float]]:
    """``(bytes, seconds)`` from an OSU all-reduce latency log.

    Lines are ``nodes,size  latency_us`` or (allreduce4.log) just ``size  latency_us``."""
    points = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        head = parts[0].split(",")
        try:
            if len(parts) != 2 or len(head) > 2:
                raise ValueError
            if len(head) == 2 and int(head[0]) != world_size:
                raise GradschedError(f"{path}:{lineno}: measured on {head[0]} nodes, expected {world_size}")
            points.append((int(head[-1]), round(float(parts[1]) * 1e-6, DIGITS)))
        except ValueError:
            raise GradschedError(f"{path}:{lineno}: expected '[nodes,]size_bytes latency_us', got {line!r}") from None
    if len(points) < 2:
        raise GradschedError(f"{path}: fewer than two latency points")
    return points


BIAS_PAD_ELEMENTS = 64


def logged_numel(name: str, numel: int) -> int:
    """The size B-Caffe logs (and all-reduces) for a tensor: biases padded to 64 elements.

    Every weight in the logs has GoogLeNet's exact size; every bias is rounded up to a
    multiple of 64 elements (96 -> 128, 1000 -> 1024): 856 extra elements in all."""
    if name.endswith(".bias"):
        return -(-numel // BIAS_PAD_ELEMENTS) * BIAS_PAD_ELEMENTS
    return numel


def _check_sizes(records: list[Record], path: Path) -> None:
    for r, (name, numel) in zip(records, googlenet_tensors()):
        if r.numel != logged_numel(name, numel):
            raise GradschedError(f"{path}: param {r.param_id} has {r.numel} elements, "
                                 f"GoogLeNet's {name} has {numel} (logged as {logged_numel(name, numel)})")


# --------------------------------------------------------------------------- profile
def build_profile(src: Path) -> Profile:
    """The one-node profile: measured backward, assumed forward, the rest as ``other_s``."""
    path = src / "tmpcomm.log"
    records = read_records(path)
    _check_sizes(records, path)
    tensors = []
    backward_s = 0.0
    for i, (r, (name, _)) in enumerate(zip(records, googlenet_tensors())):
        numel = r.numel  # the logged (communicated) size, biases padded: see logged_numel
        if i % 2 == 1 and r.backward_us != records[i - 1].backward_us:
            raise GradschedError(f"{path}: weight and bias of {name.rsplit('.', 1)[0]} carry different backward times")
        # The layer's time goes on its weight (first tensor); the bias carries 0 (profile.py's rule).
        bwd = round(r.backward_us * 1e-6, DIGITS) if i % 2 == 0 else 0.0
        fwd = round(bwd * FORWARD_PER_BACKWARD, DIGITS)
        backward_s += bwd
        tensors.append(TensorProfile(name, numel, numel * ELEMENT_BYTES, fwd, bwd))
    forward_s = sum(t.forward_s for t in tensors)
    other_s = round(ONE_NODE_ITERATION_S - backward_s - forward_s, DIGITS)
    source = {
        "data": "B-Caffe logdata (github.com/shyhuai/B-Caffe), GoogLeNet, 1 node, K80, batch 64, fp32",
        "sizes": "numel as logged: GoogLeNet's, with biases padded to a multiple of 64 elements",
        "backward": "tmpcomm.log: backward_us of the last 128 records, counted once per layer (on the weight)",
        "forward": f"not measured: forward_s = {FORWARD_PER_BACKWARD} * backward_s per layer (assumption)",
        "other": "one-node iteration (64 / 163.36 samples/s) minus summed backward and forward",
        "iteration_1node_s": round(ONE_NODE_ITERATION_S, DIGITS),
        "doc": "docs/cost-model.md",
    }
    return Profile("googlenet", tuple(tensors), None, other_s, {"batch_size": BATCH_PER_NODE, "source": source})


# --------------------------------------------------------------------------- clusters
def ols_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Ordinary (absolute-residual) least-squares ``t = alpha + beta * s``.

    Not ``CollectiveCost.fit``'s relative residuals: these sizes are evenly spaced (OSU:
    4 KiB steps) or dominated in time by the large tensors (in training), and absolute
    residuals make the largest messages, the ones the line extrapolates to, fit best.
    With an intercept, the residuals sum to zero: the line reproduces the measured
    total time of the points exactly (docs/cost-model.md)."""
    s = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    (alpha, beta), *_ = np.linalg.lstsq(np.stack([np.ones_like(s), s], axis=1), t, rcond=None)
    if alpha < 0 or beta < 0:
        raise GradschedError(f"fitted line alpha={alpha:.3g} s, beta={beta:.3g} s/B is negative; check the log")
    return round(float(alpha), DIGITS), round(float(beta), 20)


def build_osu_cluster(src: Path, world_size: int) -> Cluster:
    """The OSU table as ``points``; the line fitted on the large-message protocol only."""
    points = read_osu(src / f"allreduce{world_size}.log", world_size)
    large = [p for p in points if p[0] >= PROTOCOL_SWITCH_BYTES]
    alpha_s, beta_s_per_byte = ols_line(large)
    cost = CollectiveCost(alpha_s, beta_s_per_byte, tuple((float(b), t) for b, t in points))
    extra = {"source": {
        "data": f"B-Caffe logdata allreduce{world_size}.log: OSU MPI all-reduce latency, {world_size} K80 nodes, 10GbE",
        "line": f"ordinary least squares on the {len(large)} sizes >= {PROTOCOL_SWITCH_BYTES} B "
                "(after the eager -> rendezvous switch); used above the table's 1 MiB",
        "doc": "docs/cost-model.md"}}
    return Cluster(world_size, {"allreduce": cost}, "mpi", "ring", extra)


def in_training_pairs(records: list[Record]) -> list[tuple[int, float]]:
    """``(bytes, seconds)`` of every all-reduce measured inside training.

    A record with ``comm_us > 0`` is one all-reduce; records after it with
    ``comm_us == 0`` (a bias reduced together with its weight) add their bytes to it."""
    pairs: list[list[float]] = []
    for i, r in enumerate(records):
        if r.comm_us > 0:
            pairs.append([r.numel * ELEMENT_BYTES, r.comm_us * 1e-6])
        elif i % 2 == 1 and pairs and records[i - 1].comm_us > 0:
            pairs[-1][0] += r.numel * ELEMENT_BYTES
    return [(int(b), round(t, DIGITS)) for b, t in pairs]


def build_intrain_cluster(src: Path, world_size: int) -> Cluster:
    """A line through the in-training all-reduce times (noisy, repeated sizes: no table)."""
    path = src / f"tmp{world_size}comm.log"
    records = read_records(path)
    _check_sizes(records, path)
    pairs = in_training_pairs(records)
    cost = CollectiveCost(*ols_line(pairs))
    extra = {"source": {
        "data": f"B-Caffe logdata tmp{world_size}comm.log: comm_us of {len(pairs)} all-reduces inside GoogLeNet "
                f"training, {world_size} K80 nodes, 10GbE",
        "line": "ordinary least squares on all (bytes, seconds) pairs: reproduces their total time",
        "doc": "docs/cost-model.md"}}
    return Cluster(world_size, {"allreduce": cost}, "mpi", "ring", extra)


def outputs(src: Path) -> dict[str, dict]:
    """File name -> JSON content of every bundled file."""
    files = {"googlenet.profile.json": build_profile(src).to_dict()}
    for p in WORLD_SIZES:
        files[f"googlenet-10gbe.p{p}.cluster.json"] = build_osu_cluster(src, p).to_dict()
        files[f"googlenet-intrain.p{p}.cluster.json"] = build_intrain_cluster(src, p).to_dict()
    return files


def _text(data: dict) -> str:
    return json.dumps(data, indent=1) + "\n"  # the same layout as Profile.save / Cluster.save


def convert(src: Path, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in outputs(src).items():
        (out / name).write_text(_text(data))
        written.append(out / name)
    return written


def check(src: Path, out: Path) -> list[str]:
    """Names of the files in ``out`` that differ from what ``src`` converts to."""
    return [name for name, data in outputs(src).items()
            if not (out / name).exists() or (out / name).read_text() != _text(data)]


# --------------------------------------------------------------------------- report
def report(src: Path) -> list[dict]:
    """In-training all-reduce times against the OSU cluster's prediction, per world size."""
    rows = []
    for p in WORLD_SIZES:
        osu = build_osu_cluster(src, p).cost("allreduce")
        records = read_records(src / f"tmp{p}comm.log")
        pairs = in_training_pairs(records)
        sizes = np.array([b for b, _ in pairs], dtype=float)
        measured = np.array([t for _, t in pairs])
        predicted = osu.times_s(sizes)
        ratio = measured / predicted
        big = sizes >= 1 << 20
        intrain = build_intrain_cluster(src, p).cost("allreduce")
        rows.append({"world_size": p, "allreduces": len(pairs), "measured_sum_s": float(measured.sum()),
                     "osu_predicted_sum_s": float(predicted.sum()),
                     "sum_ratio": float(measured.sum() / predicted.sum()),
                     "median_ratio": float(np.median(ratio)),
                     "ratio_at_least_1MiB": float(measured[big].sum() / predicted[big].sum()),
                     "osu_alpha_s": osu.alpha_s, "osu_beta_s_per_byte": osu.beta_s_per_byte,
                     "intrain_alpha_s": intrain.alpha_s, "intrain_beta_s_per_byte": intrain.beta_s_per_byte})
    one = read_records(src / "tmpcomm.log")
    rows.append({"world_size": 1, "allreduces": sum(1 for r in one if r.comm_us > 0),
                 "measured_sum_s": sum(r.comm_us for r in one) * 1e-6})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", nargs="?", type=Path, default=DEFAULT_SRC, help="folder with the B-Caffe logs")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the JSON files go")
    ap.add_argument("--check", action="store_true", help="only compare with --out; exit 1 if they differ")
    ap.add_argument("--report", action="store_true", help="print in-training vs OSU all-reduce times")
    args = ap.parse_args(argv)
    try:
        if args.report:
            print(json.dumps(report(args.src), indent=1))
            return 0
        if args.check:
            stale = check(args.src, args.out)
            for name in stale:
                print(f"{args.out / name}: differs from the conversion of {args.src}; rerun without --check")
            return 1 if stale else 0
        for path in convert(args.src, args.out):
            print(path)
    except (GradschedError, OSError) as exc:
        print(f"convert_bcaffe: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
