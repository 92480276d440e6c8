"""``python -m clients.world --format h264``: the session's H.264 stream as a playable MP4
(clients/h264.py), muxed without re-encoding, and the last frame as a PNG."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

from clients.h264 import H264Recording
from protocols.annexb import nal_types
from clients.world import main
from tests.e2e.conftest import serve
from tests.support.h264_world import Encoder, FakeWorld, WorldLog, build_app, render

av = pytest.importorskip("av", reason="PyAV is not installed (pip install 'realtime-sessions[video]')")


def nal_units(annex_b: bytes) -> list[bytes]:
    """The NAL units of an Annex B access unit, without their start codes (a 4-byte start
    code's leading zero is not part of the unit before it)."""
    return [unit.rstrip(b"\x00") for unit in annex_b.split(b"\x00\x00\x01")[1:]]


def length_prefixed_units(sample: bytes) -> list[bytes]:
    """The NAL units of an MP4 sample (4-byte big-endian lengths)."""
    units, at = [], 0
    while at < len(sample):
        n = int.from_bytes(sample[at:at + 4], "big")
        units.append(sample[at + 4:at + 4 + n])
        at += 4 + n
    return units


def test_help_documents_the_h264_options(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--format {png,jpeg,h264} how the server sends frames" in text
    assert "--bitrate-kbps BITRATE_KBPS h264: the stream's bitrate in kbit/s, 100..20000" in text
    assert "--profile {baseline,main} h264: the H.264 profile" in text
    assert "python -m clients.world --format h264 --out run.mp4" in text


def test_a_run_in_h264_writes_an_mp4_that_pyav_decodes(tiny_server, tmp_path, capsys):
    out = tmp_path / "run.mp4"
    assert main(["--url", f"ws://{tiny_server}/v1/realtime/world", "--format", "h264", "--keys", "wj",
                 "--chunks", "12", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    created = json.loads(lines[0])
    assert (created["format"], created["codec"], created["fps"]) == ("h264", "avc1.42C01F", 15.0)
    assert lines[2] == f"wrote {out}: 12 frames of H.264, as received"
    with av.open(str(out)) as mp4:
        stream = mp4.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in mp4.decode(stream)]
        assert (stream.codec_context.name, stream.codec_context.profile) == ("h264", "Constrained Baseline")
        assert (stream.frames, stream.average_rate, mp4.duration) == (12, 15, 800_000)  # 12 / 15 s, in us
    assert len(frames) == 12 and {f.shape for f in frames} == {(64, 64, 3)}
    # Held keys move the tiny world: the first and last frames differ.
    assert not np.array_equal(frames[0], frames[-1])


def test_the_mp4_holds_the_received_access_units_unchanged(tmp_path):
    """Every slice the server encoded is in the MP4 byte for byte (only the framing differs:
    start codes there, lengths here), at one frame every 1/fps."""
    encoder = Encoder(96, 128, 15.0, 500, "baseline")
    units = [encoder.encode(render(96, 128, i, 8 + 2 * i, 8), idr=(i == 6)) for i in range(10)]
    assert [5 in nal_types(u) for u in units] == [True] + [False] * 5 + [True] + [False] * 3
    recording = H264Recording(15.0)
    for unit in units:
        recording.add(unit)
    assert recording.write_mp4(tmp_path / "run.mp4") == 10
    with av.open(str(tmp_path / "run.mp4")) as mp4:
        stream = mp4.streams.video[0]
        packets = [p for p in mp4.demux(stream) if p.size]
        assert [p.pts * p.time_base for p in packets] == [Fraction(i, 15) for i in range(10)]
        assert [p.is_keyframe for p in packets] == [5 in nal_types(u) for u in units]
        slices = [[n for n in length_prefixed_units(bytes(p)) if n[0] & 0x1F in (1, 5)] for p in packets]
    assert slices == [[n for n in nal_units(u) if n[0] & 0x1F in (1, 5)] for u in units]


def test_units_before_the_first_key_frame_are_left_out():
    encoder = Encoder(96, 128, 15.0, 500, "baseline")
    units = [encoder.encode(render(96, 128, i, 8, 8), idr=False) for i in range(3)]
    recording = H264Recording(15.0)
    for unit in units[1:]:  # the IDR never came
        recording.add(unit)
    assert (recording.units, recording.skipped) == ([], 2)
    with pytest.raises(ValueError, match="no H.264 key frame was received"):
        recording.write_mp4("unused.mp4")


def test_last_png_still_works_in_h264(tmp_path, capsys):
    """The last frame, decoded from the stream, is the picture the server encoded."""
    world, log = FakeWorld(), WorldLog()
    out = tmp_path / "last.png"
    with serve(build_app(world, log)) as addr:
        assert main(["--url", f"ws://{addr}/v1/realtime/world", "--format", "h264", "--keys", "d",
                     "--chunks", "3", "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[2] == f"wrote {out}"
    # The client's last chunk is chunk 2 (the server may have made more before the close):
    # its second frame is the session's frame 5.
    session = log.sessions[-1]
    assert session.sent[2] == (2, ["delta", "delta"])
    x, y = session.positions[2]
    assert x > 8 and y == 8  # D held (from the chunk the event reached on)
    encoded = Image.fromarray(render(world.height, world.width, 5, x, y)).resize((256, 256), Image.NEAREST)
    with Image.open(out) as got:
        assert got.size == (256, 256)
        error = np.abs(np.asarray(got.convert("RGB"), np.int16) - np.asarray(encoded, np.int16))
    assert error.mean() < 3, error.mean()


def test_refusals_are_one_line_and_a_status(tmp_path, capsys):
    log = WorldLog()
    with serve(build_app(FakeWorld(encoder=False), log)) as addr:
        assert main(["--url", f"ws://{addr}/v1/realtime/world", "--format", "h264", "--chunks", "1"]) == 1
    assert capsys.readouterr().err == "server error: format_unavailable: this server has no H.264 encoder\n"
    assert [c["format"] for c in log.creates] == ["h264"]
    for argv, message in ((["--out", "run.mp4"], "--out *.mp4 needs --format h264"),
                          (["--bitrate-kbps", "900"], "--bitrate-kbps and --profile go with --format h264")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err
