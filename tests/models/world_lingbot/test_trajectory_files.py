"""Every safety rule of the trajectory loader, one test each (plus the happy path)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from models.world.lingbot.trajectory_files import (MAX_FRAMES, TrajectoryError, check_name,
                                                   load_trajectory, read_npy)


def _poses(n: int) -> np.ndarray:
    p = np.tile(np.eye(4), (n, 1, 1))
    p[:, 2, 3] = np.arange(n) * 0.1
    return p


def _intr(n: int) -> np.ndarray:
    return np.tile([500.0, 500.0, 416.0, 240.0], (n, 1))


def _write(root, name="orbit", poses=None, intr=None, n=5):
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / "poses.npy", _poses(n) if poses is None else poses)
    np.save(d / "intrinsics.npy", _intr(n) if intr is None else intr)
    return d


def test_loads_a_good_trajectory(tmp_path):
    _write(tmp_path, "a/orbit", poses=_poses(7).astype(np.float32), n=7)
    t = load_trajectory(tmp_path, "a/orbit")
    assert t.frames == 7 and t.poses.dtype == np.float64
    assert np.array_equal(t.poses, _poses(7).astype(np.float32).astype(np.float64))


@pytest.mark.parametrize("name", ["../x", "a/../b", "..", "./a", "a//b", "a/", ""])
def test_no_dot_dot_or_empty_components(tmp_path, name):
    with pytest.raises(TrajectoryError, match="component|non-empty"):
        load_trajectory(tmp_path, name)


def test_no_absolute_paths(tmp_path):
    d = _write(tmp_path)
    with pytest.raises(TrajectoryError, match="relative"):
        load_trajectory(tmp_path, str(d))


def test_no_symlinked_folder_anywhere_on_the_path(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    _write(outside, "orbit")
    (root / "link").symlink_to(outside)
    with pytest.raises(TrajectoryError, match="'link' is .*symlink"):
        load_trajectory(root, "link/orbit")
    (root / "orbit").symlink_to(outside / "orbit")
    with pytest.raises(TrajectoryError, match="'orbit' is .*symlink"):
        load_trajectory(root, "orbit")


def test_no_symlinked_file(tmp_path):
    d = _write(tmp_path, "orbit")
    np.save(tmp_path / "real.npy", _poses(5))
    os.remove(d / "poses.npy")
    (d / "poses.npy").symlink_to(tmp_path / "real.npy")
    with pytest.raises(TrajectoryError, match="'poses.npy' is a symlink"):
        load_trajectory(tmp_path, "orbit")


def test_a_fifo_neither_blocks_nor_is_read(tmp_path):
    d = _write(tmp_path, "orbit")
    os.remove(d / "poses.npy")
    os.mkfifo(d / "poses.npy")
    result = {}

    def load():
        try:
            load_trajectory(tmp_path, "orbit")
        except TrajectoryError as e:
            result["error"] = str(e)

    t = threading.Thread(target=load, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(5)
    if t.is_alive():  # unblock the stuck open so the test process can end, then fail
        with open(d / "poses.npy", "wb"):
            pass
        pytest.fail("loading a FIFO blocked")
    assert time.monotonic() - t0 < 5
    assert "not a regular file" in result["error"]


def test_a_folder_in_place_of_a_file_is_refused(tmp_path):
    d = _write(tmp_path, "orbit")
    os.remove(d / "intrinsics.npy")
    (d / "intrinsics.npy").mkdir()
    with pytest.raises(TrajectoryError, match="not a regular file"):
        load_trajectory(tmp_path, "orbit")


def _npy_with_header(header: str, data: bytes = b"") -> bytes:
    h = header.encode("latin1")
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + data


def test_npy_header_size_is_bounded(tmp_path):
    d = _write(tmp_path, "orbit")
    big = "{'descr': '<f8', 'fortran_order': False, 'shape': (5, 4, 4), }" + " " * 5000 + "\n"
    (d / "poses.npy").write_bytes(_npy_with_header(big, _poses(5).tobytes()))
    with pytest.raises(TrajectoryError, match="header of .* bytes, at most 4096"):
        load_trajectory(tmp_path, "orbit")


@pytest.mark.parametrize("dtype", [object, np.complex128, np.bool_, [("a", "<f8")]])
def test_only_real_numeric_dtypes(tmp_path, dtype):
    d = _write(tmp_path, "orbit")
    if dtype is object:
        np.save(d / "poses.npy", np.empty((5, 4, 4), dtype=object), allow_pickle=True)
    elif isinstance(dtype, list):
        np.save(d / "poses.npy", np.zeros((5, 4, 4), dtype=dtype))
    else:
        np.save(d / "poses.npy", np.zeros((5, 4, 4), dtype=dtype))
    with pytest.raises(TrajectoryError, match="not a real number type|structured"):
        load_trajectory(tmp_path, "orbit")


def test_a_pickle_is_never_unpickled(tmp_path):
    d = _write(tmp_path, "orbit")
    marker = tmp_path / "pwned"
    import pickle

    class Boom:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (d / "poses.npy").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(TrajectoryError, match="not an NPY file"):
        load_trajectory(tmp_path, "orbit")
    assert not marker.exists()


def test_the_header_is_a_literal_not_code(tmp_path):
    d = _write(tmp_path, "orbit")
    (d / "poses.npy").write_bytes(_npy_with_header("__import__('os').system('true')\n"))
    with pytest.raises(TrajectoryError, match="not a literal dict"):
        load_trajectory(tmp_path, "orbit")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_values_must_be_finite(tmp_path, bad):
    p = _poses(5)
    p[2, 0, 3] = bad
    _write(tmp_path, "orbit", poses=p)
    with pytest.raises(TrajectoryError, match="finite"):
        load_trajectory(tmp_path, "orbit")


@pytest.mark.parametrize("n", [0, MAX_FRAMES + 1])
def test_frame_count_is_1_to_4096(tmp_path, n):
    _write(tmp_path, "orbit", poses=_poses(n), intr=_intr(n))
    with pytest.raises(TrajectoryError, match=r"frames, expected 1\.\.4096"):
        load_trajectory(tmp_path, "orbit")


def test_4096_frames_load(tmp_path):
    _write(tmp_path, "orbit", poses=_poses(MAX_FRAMES), intr=_intr(MAX_FRAMES))
    assert load_trajectory(tmp_path, "orbit").frames == MAX_FRAMES


def test_both_files_have_the_same_frame_count(tmp_path):
    _write(tmp_path, "orbit", poses=_poses(5), intr=_intr(4))
    with pytest.raises(TrajectoryError, match="5 poses but 4 intrinsics"):
        load_trajectory(tmp_path, "orbit")


def test_wrong_shape_is_refused(tmp_path):
    _write(tmp_path, "orbit", poses=np.zeros((5, 3, 4)))
    with pytest.raises(TrajectoryError, match=r"expected \[frames, 4, 4\]"):
        load_trajectory(tmp_path, "orbit")


def test_a_truncated_file_is_refused_before_decoding(tmp_path, monkeypatch):
    d = _write(tmp_path, "orbit")
    raw = (d / "poses.npy").read_bytes()
    (d / "poses.npy").write_bytes(raw[:-8])
    decoded = []
    monkeypatch.setattr(np, "frombuffer", lambda *a, **k: decoded.append(1))
    with pytest.raises(TrajectoryError, match="truncated"):
        load_trajectory(tmp_path, "orbit")
    assert decoded == []


def test_trailing_bytes_are_refused(tmp_path):
    d = _write(tmp_path, "orbit")
    with open(d / "poses.npy", "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(TrajectoryError, match="trailing"):
        load_trajectory(tmp_path, "orbit")


@pytest.mark.parametrize("change", ["rewrite", "truncate"])
def test_a_file_changed_after_validation_is_never_half_read(tmp_path, change):
    d = _write(tmp_path, "orbit")
    path = d / "poses.npy"
    raw = path.read_bytes()

    def meddle():
        time.sleep(0.01)  # a later mtime even on coarse clocks
        with open(path, "r+b") as f:
            if change == "rewrite":
                f.seek(len(raw) - 64)
                f.write(b"\x7f" * 64)
            else:
                f.truncate(len(raw) - 64)

    with pytest.raises(TrajectoryError, match="changed while it was read"):
        read_npy(tmp_path, ("orbit", "poses.npy"), (4, 4), after_validate=meddle)


def test_missing_files_and_names_are_clear(tmp_path):
    with pytest.raises(TrajectoryError, match="'nope' does not exist"):
        load_trajectory(tmp_path, "nope")
    with pytest.raises(TrajectoryError, match="non-empty string"):
        check_name(3)
