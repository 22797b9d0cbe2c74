"""Checkpoint files carry a checksum verified on load (issue 39, item 3)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gradsched.torch import CheckpointError, load_checkpoint, save_checkpoint  # noqa: E402


def state() -> dict:
    gen = torch.Generator().manual_seed(0)
    return {"model": {"w": torch.randn(64, 64, generator=gen), "b": torch.zeros(64)}, "step": 7,
            "sparse": {"_gradsched_sparse.residual.op0": torch.randn(2, 100, generator=gen)}}


def test_a_checkpoint_round_trips(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(state(), path)
    got = load_checkpoint(path)
    assert got["step"] == 7
    torch.testing.assert_close(got["model"]["w"], state()["model"]["w"], rtol=0, atol=0)
    assert not (tmp_path / "ckpt.pt.tmp").exists()


@pytest.mark.parametrize("where", [0.3, 0.6, 0.95])
def test_64_corrupted_bytes_are_refused(tmp_path, where):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(state(), path)
    data = bytearray(path.read_bytes())
    at = int(len(data) * where)
    data[at:at + 64] = bytes((b + 1) % 256 for b in data[at:at + 64])
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted: its content does not match the SHA-256"):
        load_checkpoint(path)


def test_a_truncated_or_foreign_file_is_refused(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(state(), path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(path)
    torch.save(state(), path)
    with pytest.raises(CheckpointError, match="not a gradsched checkpoint"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="cannot read"):
        load_checkpoint(tmp_path / "missing.pt")


def test_an_unwritable_place_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="cannot write checkpoint"):
        save_checkpoint(state(), tmp_path / "no-such-dir" / "ckpt.pt")
