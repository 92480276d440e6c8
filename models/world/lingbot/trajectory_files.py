"""Named camera trajectories from a trusted folder, loaded as untrusted input.

``--trajectory-root DIR`` is trusted (the operator's); what lies below it and the
names clients send are not. A name ``NAME`` means ``DIR/NAME/poses.npy``
(``[frames, 4, 4]`` camera-to-world) and ``DIR/NAME/intrinsics.npy``
(``[frames, 4]`` fx, fy, cx, cy at 832x480). Rules, each refused with a
``TrajectoryError`` that says which:

* the name is relative, made of plain components (no ``..``, ``.``, empty parts,
  backslashes or NUL); no absolute paths;
* every component below the root is opened with ``O_NOFOLLOW`` relative to its
  parent's descriptor, so a symlink anywhere on the path is refused and nothing
  can be swapped in between a check and the open;
* the file is opened ``O_NONBLOCK`` and must be a regular file (``fstat``): a FIFO
  is refused without blocking and without a read;
* the NPY header is at most ``MAX_HEADER`` bytes and parsed as a literal (never
  pickle), its dtype a real number (``f``/``i``/``u``, no object, structured,
  complex or bool), not Fortran-ordered, with the expected shape;
* 1..``MAX_FRAMES`` frames, the same count in both files;
* the file size must be exactly header + data, checked before anything is decoded
  (a truncated file never reaches numpy);
* the bytes are read once into memory and the file's ``fstat`` (size, mtime, ctime,
  inode) must be the same after the read as before it: a file changed meanwhile is
  refused, never half-read;
* every value finite; fx and fy positive;
* the first pose invertible, its rotation part's condition number at most
  ``MAX_CONDITION``, and every pose relative to it (``inv(P0) @ P``, what a block
  plays) finite: the relative poses are computed here, once, so that playing a
  trajectory never meets a matrix it cannot invert.
"""

from __future__ import annotations

import ast
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

MAX_FRAMES = 4096
MAX_HEADER = 4096
MAX_NAME = 255
# A first pose's rotation part may stretch space at most this much more in one direction
# than another (a rotation: 1). Beyond it ``inv(P0)`` loses half of float64's digits.
MAX_CONDITION = 1e8
POSES_FILE = "poses.npy"
INTRINSICS_FILE = "intrinsics.npy"
_MAGIC = b"\x93NUMPY"


class TrajectoryError(ValueError):
    """A trajectory name or file that is refused; the message says why."""


@dataclass(frozen=True)
class Trajectory:
    poses: np.ndarray       # [frames, 4, 4] float64
    intrinsics: np.ndarray  # [frames, 4] float64
    relative: np.ndarray    # [frames, 4, 4] float64: inv(poses[0]) @ poses, all finite

    @property
    def frames(self) -> int:
        return int(self.poses.shape[0])


def check_name(name: object) -> tuple[str, ...]:
    """The components of a client-sent trajectory name, or TrajectoryError."""
    if not isinstance(name, str) or not name:
        raise TrajectoryError("trajectory name must be a non-empty string")
    if len(name) > MAX_NAME:
        raise TrajectoryError(f"trajectory name is longer than {MAX_NAME} characters")
    if "\x00" in name or "\\" in name:
        raise TrajectoryError("trajectory name contains a NUL or a backslash")
    if name.startswith("/"):
        raise TrajectoryError("trajectory name must be relative, not an absolute path")
    parts = tuple(name.split("/"))
    for p in parts:
        if p in ("", ".", ".."):
            raise TrajectoryError(f"trajectory name has a {p or 'empty'!r} component; "
                                  "only plain names below the trajectory root are allowed")
    return parts


def _open_below(root: Path, parts: tuple[str, ...]) -> int:
    """Open ``root/parts...`` without following any link below ``root``; returns an fd."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_NONBLOCK if last else os.O_DIRECTORY)
            try:
                nfd = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                raise TrajectoryError(f"trajectory path component {part!r} does not exist") from None
            except OSError as e:
                # O_NOFOLLOW on a symlink: ELOOP; a file (or, on some systems, a link) where a
                # folder is due: ENOTDIR.
                if e.errno == errno.ELOOP:
                    raise TrajectoryError(f"trajectory path component {part!r} is a symlink; "
                                          "links are not followed") from None
                if e.errno == errno.ENOTDIR:
                    raise TrajectoryError(f"trajectory path component {part!r} is not a folder "
                                          "(or is a symlink)") from None
                raise TrajectoryError(f"cannot open trajectory path component {part!r}: "
                                      f"{e.strerror}") from None
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _parse_header(head: bytes, where: str) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, data offset) from the first bytes of an NPY file."""
    if len(head) < 10 or head[:6] != _MAGIC:
        raise TrajectoryError(f"{where}: not an NPY file")
    major = head[6]
    if major == 1:
        hlen, start = int.from_bytes(head[8:10], "little"), 10
    elif major in (2, 3):
        if len(head) < 12:
            raise TrajectoryError(f"{where}: truncated NPY header")
        hlen, start = int.from_bytes(head[8:12], "little"), 12
    else:
        raise TrajectoryError(f"{where}: unsupported NPY version {major}")
    if hlen > MAX_HEADER:
        raise TrajectoryError(f"{where}: NPY header of {hlen} bytes, at most {MAX_HEADER}")
    raw = head[start:start + hlen]
    if len(raw) != hlen:
        raise TrajectoryError(f"{where}: truncated NPY header")
    try:
        meta = ast.literal_eval(raw.decode("latin1"))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise TrajectoryError(f"{where}: NPY header is not a literal dict") from None
    if not isinstance(meta, dict) or set(meta) != {"descr", "fortran_order", "shape"}:
        raise TrajectoryError(f"{where}: NPY header must have exactly descr, fortran_order, shape")
    descr, fortran, shape = meta["descr"], meta["fortran_order"], meta["shape"]
    if not isinstance(descr, str):
        raise TrajectoryError(f"{where}: structured dtypes are not allowed")
    try:
        dtype = np.dtype(descr)
    except TypeError:
        raise TrajectoryError(f"{where}: unknown dtype {descr!r}") from None
    if dtype.kind not in "fiu" or dtype.hasobject or dtype.fields is not None:
        raise TrajectoryError(f"{where}: dtype {descr!r} is not a real number type "
                              "(object, complex, bool and structured arrays are refused)")
    if fortran is not False:
        raise TrajectoryError(f"{where}: Fortran-ordered arrays are not accepted")
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise TrajectoryError(f"{where}: bad shape {shape!r}")
    return dtype, shape, start + hlen


def read_npy(root: Path, parts: tuple[str, ...], tail: tuple[int, ...],
             after_validate: Callable[[], None] | None = None) -> np.ndarray:
    """One array ``[frames, *tail]`` as float64, under every rule in the module docstring."""
    where = "/".join(parts)
    fd = _open_below(root, parts)
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise TrajectoryError(f"{where}: not a regular file")
        head = os.pread(fd, 12 + MAX_HEADER, 0)
        dtype, shape, offset = _parse_header(head, where)
        if len(shape) != 1 + len(tail) or tuple(shape[1:]) != tail:
            raise TrajectoryError(f"{where}: shape {shape}, expected [frames, {', '.join(map(str, tail))}]")
        frames = shape[0]
        if not 1 <= frames <= MAX_FRAMES:
            raise TrajectoryError(f"{where}: {frames} frames, expected 1..{MAX_FRAMES}")
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if before.st_size != offset + nbytes:
            raise TrajectoryError(f"{where}: {before.st_size} bytes, expected {offset + nbytes} "
                                  f"(truncated or trailing data)")
        if after_validate is not None:
            after_validate()
        data = os.pread(fd, nbytes + 1, offset)
        after = os.fstat(fd)
        same = (before.st_size, before.st_mtime_ns, before.st_ctime_ns, before.st_ino) == \
            (after.st_size, after.st_mtime_ns, after.st_ctime_ns, after.st_ino)
        if len(data) != nbytes or not same:
            raise TrajectoryError(f"{where}: the file changed while it was read")
    finally:
        os.close(fd)
    arr = np.frombuffer(data, dtype=dtype).reshape(shape).astype(np.float64)
    if not np.isfinite(arr).all():
        raise TrajectoryError(f"{where}: values must all be finite")
    return arr


def load_trajectory(root: str | Path, name: object,
                    after_validate: Callable[[], None] | None = None) -> Trajectory:
    """Load trajectory ``name`` from below the trusted ``root``."""
    parts = check_name(name)
    root = Path(root)
    poses = read_npy(root, parts + (POSES_FILE,), (4, 4), after_validate)
    intr = read_npy(root, parts + (INTRINSICS_FILE,), (4,), after_validate)
    if poses.shape[0] != intr.shape[0]:
        raise TrajectoryError(f"{'/'.join(parts)}: {poses.shape[0]} poses but {intr.shape[0]} "
                              "intrinsics; the frame counts must be equal")
    return checked(poses, intr, "/".join(parts))


def checked(poses: np.ndarray, intrinsics: np.ndarray, where: str) -> Trajectory:
    """Shape and value checks shared by files and inline trajectories."""
    if poses.ndim != 3 or poses.shape[1:] != (4, 4) or intrinsics.ndim != 2 or intrinsics.shape[1] != 4:
        raise TrajectoryError(f"{where}: poses must be [frames, 4, 4] and intrinsics [frames, 4]")
    if poses.shape[0] != intrinsics.shape[0]:
        raise TrajectoryError(f"{where}: {poses.shape[0]} poses but {intrinsics.shape[0]} intrinsics")
    if not 1 <= poses.shape[0] <= MAX_FRAMES:
        raise TrajectoryError(f"{where}: {poses.shape[0]} frames, expected 1..{MAX_FRAMES}")
    if not (np.isfinite(poses).all() and np.isfinite(intrinsics).all()):
        raise TrajectoryError(f"{where}: values must all be finite")
    if not np.allclose(poses[:, 3], [0, 0, 0, 1]):
        raise TrajectoryError(f"{where}: each pose's last row must be 0 0 0 1")
    if (intrinsics[:, :2] <= 0).any():
        raise TrajectoryError(f"{where}: fx and fy must be positive")
    poses, intrinsics = poses.astype(np.float64), intrinsics.astype(np.float64)
    return Trajectory(poses, intrinsics, _relative(poses, where))


def _relative(poses: np.ndarray, where: str) -> np.ndarray:
    """``inv(poses[0]) @ poses``, or TrajectoryError if the first pose cannot be inverted
    well (see ``MAX_CONDITION``) or a relative pose is not finite."""
    s = np.linalg.svd(poses[0, :3, :3], compute_uv=False)  # descending
    condition = s[0] / s[-1] if s[-1] > 0 else np.inf
    if not condition <= MAX_CONDITION:
        raise TrajectoryError(f"{where}: the first pose cannot be inverted (the condition number of its "
                              f"rotation part is {condition:.3g}, at most {MAX_CONDITION:g}); the trajectory "
                              "plays relative to its first pose")
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        try:
            relative = np.linalg.inv(poses[0]) @ poses
        except np.linalg.LinAlgError:
            relative = np.full_like(poses, np.nan)
    if not np.isfinite(relative).all():
        raise TrajectoryError(f"{where}: the poses relative to the first pose are not all finite "
                              "(the first pose is too small or the others too large)")
    return relative
