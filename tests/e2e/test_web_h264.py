"""The demo page's world.v1 ``h264`` (clients/web/h264_decoder.js) in real Chromium.

Debian's Chromium decodes H.264 with WebCodecs (``VideoDecoder.isConfigSupported`` says so
for constrained baseline and main; the tests that decode skip with the browser's answer
where it does not). The server is tests/support/h264_world.py, a small world.v1 server that
encodes with libx264 through PyAV (the ``video`` extra) and records what it sent, so the
page's counts are compared with the server's exactly.
"""

from __future__ import annotations

import re
import time
from typing import Any, Iterator

import numpy as np
import pytest

from tests.e2e.conftest import serve, tiny_app
from tests.e2e.test_web import Page, browser, pytestmark  # noqa: F401 - the shared fixture
from tests.support.h264_world import CODEC, FakeWorld, WorldLog, build_app

NO_AV = "PyAV is not installed (pip install 'realtime-sessions[video]'): the test server cannot encode H.264"
try:
    import av  # noqa: F401

    HAVE_AV = True
except ImportError:
    HAVE_AV = False
needs_av = pytest.mark.skipif(not HAVE_AV, reason=NO_AV)


def skip_unless_decodes_h264(p: Page) -> None:
    """Skip unless this Chromium's WebCodecs decodes the test server's codec (asked on the
    page: WebCodecs exists only in a secure context such as http://127.0.0.1)."""
    answer = p.page.evaluate("""async (codec) => {
        if (typeof VideoDecoder === "undefined") return "the page has no VideoDecoder";
        const {supported} = await VideoDecoder.isConfigSupported({codec, optimizeForLatency: true});
        return supported ? null : `VideoDecoder.isConfigSupported({codec: "${codec}"}) answered supported: false`;
    }""", CODEC)
    if answer is not None:
        pytest.skip(f"this Chromium cannot decode H.264: {answer}")


class Served:
    """The test server in a thread and the page on it."""

    def __init__(self, browser: Any, world: FakeWorld, init_script: str | None = None) -> None:
        self.log = WorldLog()
        self._serving = serve(build_app(world, self.log))
        self.addr = self._serving.__enter__()
        self.page = Page(browser, self.addr)
        if init_script is not None:
            # The page boots again with the script run first, as if the browser lacked the API.
            self.page.page.add_init_script(init_script)
            self.page.page.reload()
            self.page.wait("window.demo && (window.demo.ready || window.demo.bootError)")

    def ask_for(self, format: str) -> None:
        self.page.page.select_option("#world-format", format)
        self.page.page.click("#world-connect")

    def close(self) -> None:
        self.page.close()
        self._serving.__exit__(None, None, None)


@pytest.fixture
def served(browser) -> Iterator[Any]:
    opened: list[Served] = []

    def open_(world: FakeWorld = FakeWorld(), init_script: str | None = None) -> Served:
        opened.append(Served(browser, world, init_script))
        return opened[-1]

    yield open_
    for s in opened:
        s.close()


def square_at(pixels: np.ndarray) -> tuple[int, int]:
    """The top-left (x, y) of the white square in canvas pixels [H, W, 4] (the background's
    green is 60, the square's 255: JPEG's or H.264's error is far below the gap)."""
    ys, xs = np.nonzero(pixels[:, :, 1] > 160)
    return int(xs.min()), int(ys.min())


def expected_drops(sent: list[tuple[int, list[str]]]) -> int:
    """The deltas the page must drop for the chunks `sent`: from a gap (the first chunk, a
    chunk index that skips) until the next key frame."""
    dropped, need_key, last = 0, True, -1
    for index, kinds in sent:
        if last >= 0 and index != last + 1:
            need_key = True
        last = index
        for kind in kinds:
            if kind == "key":
                need_key = False
            elif need_key:
                dropped += 1
    return dropped


@needs_av
def test_an_h264_session_draws_every_frame_it_receives_and_moves_with_the_keys(served):
    chunks = 60  # 8 s at 2 frames a chunk, 15 frames/s; then the server stops
    s = served(FakeWorld(chunks=chunks))
    p = s.page
    skip_unless_decodes_h264(p)
    s.ask_for("h264")
    p.wait("demo.world.format === 'h264' && demo.world.chunkIndex >= 3")
    session = s.log.sessions[-1]
    assert s.log.creates[-1]["format"] == "h264"
    assert p.js("[demo.world.codec, demo.world.formatFallback]") == [CODEC, None]
    # Drawn counts of whole chunks (the jpeg session before may have been cut mid-chunk).
    drawn = "[demo.world.framesDrawn, demo.world.chunksDrawn, demo.world.chunkIndex]"
    frames_before, chunks_before, index_before = p.js(drawn)
    # The canvas shows the server's picture: the square where the server put it.
    index, before = p.canvas()
    assert square_at(before) == session.positions[index] == (8, 8)
    # In the server's colours: the stream is full range (as JPEG) and the browser draws it so
    # (read as limited range, the background's green of 60 would come out near 51).
    assert np.abs(before[60:90, 40:120, 1].astype(int) - 60).max() <= 3
    # D held: the square walks right, frame after frame.
    p.focus_page()
    p.hold("d", 1.0)
    p.wait("demo.world.held.length === 0")
    time.sleep(0.5)
    index, after = p.canvas()
    x, y = session.positions[index]
    assert x > 8 and y == 8
    assert square_at(after) == (x, y)
    assert not np.array_equal(before, after)
    # Bitrate and decode time beside the other stats.
    p.wait("demo.world.bytesPerS > 0 && demo.world.decodeMs !== null")
    assert re.fullmatch(r"h264 · \d+ kB/s · decode \d+\.\d ms", p.js("document.getElementById('hud-video').textContent"))
    # The server's last chunk drawn: every frame it sent was decoded, and every chunk from
    # the first count on was drawn whole, two frames each.
    p.wait(f"demo.world.chunkIndex === {chunks - 1}")
    frames_now, chunks_now, _ = p.js(drawn)
    sent = session.sent
    assert [index for index, _ in sent] == list(range(chunks))
    assert [kinds for _, kinds in sent if "key" in kinds] == [["key", "delta"]] and sent[0][1] == ["key", "delta"]
    video = p.js("demo.world.video")
    assert video["framesDecoded"] == 2 * chunks
    assert chunks_now - chunks_before == chunks - 1 - index_before
    assert frames_now - frames_before == 2 * (chunks_now - chunks_before)
    assert (video["deltasDropped"], video["decodeErrors"], video["keyFrameRequests"]) == (0, 0, 0)
    assert s.log.keyframe_requests == 0
    p.screenshot("#world-panel", "world-h264.png")
    assert p.console_errors == []


@needs_av
def test_the_real_server_in_h264_is_drawn_frame_for_frame_and_follows_the_keys(browser):
    """The tiny world on the real server (realtime/video.py's libx264): one frame a chunk,
    every one decoded and drawn; held keys change the picture."""
    with serve(tiny_app()) as addr:
        p = Page(browser, addr)
        try:
            skip_unless_decodes_h264(p)
            p.wait("demo.world.chunkIndex >= 0")
            p.page.select_option("#world-format", "h264")
            p.page.click("#world-connect")
            p.wait("demo.world.format === 'h264' && demo.world.chunkIndex >= 3")
            assert p.js("demo.world.codec") == "avc1.42C01F"
            p.focus_page()
            frames_before, chunks_before = p.js("[demo.world.framesDrawn, demo.world.chunksDrawn]")
            _, before = p.canvas()
            p.hold("w", 1.0)
            p.wait("demo.world.held.length === 0")
            _, after = p.canvas()
            assert not np.array_equal(before, after)
            frames_now, chunks_now = p.js("[demo.world.framesDrawn, demo.world.chunksDrawn]")
            assert chunks_now > chunks_before and frames_now - frames_before == chunks_now - chunks_before
            video = p.js("demo.world.video")
            assert video["framesDecoded"] >= chunks_now - chunks_before
            assert (video["deltasDropped"], video["decodeErrors"], video["keyFrameRequests"]) == (0, 0, 0)
            assert p.console_errors == []
        finally:
            p.close()


@needs_av
def test_after_a_gap_the_page_asks_for_a_key_frame_and_drops_deltas_until_it_comes(served):
    """Chunk 0 (the session's IDR) and chunk 6 never arrive: the page sees deltas before any
    key frame, then a chunk index that skips; each time it asks once and resumes at the IDR."""
    s = served(FakeWorld(drop_chunks=frozenset({0, 6}), chunks=16))
    p = s.page
    skip_unless_decodes_h264(p)
    s.ask_for("h264")
    p.wait("demo.world.format === 'h264' && demo.world.chunkIndex === 15")
    session = s.log.sessions[-1]
    sent = session.sent
    assert len(sent) == 14
    frames_sent = sum(len(kinds) for _, kinds in sent)
    dropped = expected_drops(sent)
    assert dropped >= 3  # chunk 1's two deltas, chunk 7's two at least
    video = p.js("demo.world.video")
    assert video["framesDecoded"] + video["deltasDropped"] == frames_sent
    assert (video["keyFrameRequests"], video["deltasDropped"], video["decodeErrors"]) == (2, dropped, 0)
    assert s.log.keyframe_requests == 2
    # Each request was answered by the next chunk the server made, with an IDR first.
    assert sent[0] == (1, ["delta", "delta"]) and sent[1] == (2, ["key", "delta"])
    after_jump = [i for i, (index, _) in enumerate(sent) if index == 7][0]
    assert sent[after_jump] == (7, ["delta", "delta"]) and sent[after_jump + 1] == (8, ["key", "delta"])
    assert p.console_errors == []


def test_without_webcodecs_the_page_asks_for_jpeg(served):
    s = served(init_script="delete window.VideoDecoder")
    p = s.page
    p.wait("demo.world.chunkIndex >= 0")
    before = len(s.log.creates)
    s.ask_for("h264")
    p.wait("demo.world.formatFallback !== null && demo.world.chunkIndex >= 2")
    assert p.js("[demo.world.format, demo.world.formatFallback, demo.world.video]") == [
        "jpeg", "this browser has no WebCodecs VideoDecoder", None]
    assert p.js("document.getElementById('world-format').value") == "jpeg"
    assert [c.get("format", "jpeg") for c in s.log.creates[before:]] == ["jpeg"]
    assert p.js("document.getElementById('hud-video').title") == \
        "jpeg instead of h264: this browser has no WebCodecs VideoDecoder"
    assert p.console_errors == []


def test_a_server_without_an_encoder_gets_jpeg_after_format_unavailable(served):
    s = served(FakeWorld(encoder=False))
    p = s.page
    p.wait("demo.world.chunkIndex >= 0")
    s.ask_for("h264")
    p.wait("demo.world.formatFallback !== null && demo.world.format === 'jpeg' && demo.world.chunkIndex >= 2")
    assert p.js("demo.world.formatFallback") == "format_unavailable: this server has no H.264 encoder"
    assert [c.get("format", "jpeg") for c in s.log.creates] == ["jpeg", "h264", "jpeg"]
    assert p.js("[demo.world.lastError, document.getElementById('world-error').hidden]") == [None, True]
    assert p.console_errors == []


@needs_av
def test_a_codec_the_browser_cannot_decode_falls_back_to_jpeg(served):
    s = served(FakeWorld(codec="avc1.FF001F"))
    p = s.page
    skip_unless_decodes_h264(p)
    p.wait("demo.world.chunkIndex >= 0")
    s.ask_for("h264")
    p.wait("demo.world.formatFallback !== null && demo.world.format === 'jpeg' && demo.world.chunkIndex >= 2")
    assert p.js("demo.world.formatFallback") == "this browser's VideoDecoder does not support avc1.FF001F"
    assert [c.get("format", "jpeg") for c in s.log.creates] == ["jpeg", "h264", "jpeg"]
    assert p.console_errors == []


def test_annexb_finds_each_nal_type_after_3_and_4_byte_start_codes(served):
    p = served().page
    got = p.page.evaluate("""async () => {
        const { nalTypes, isKeyFrame } = await import("/web/annexb.js");
        const au = (...bytes) => new Uint8Array(bytes);
        const idr = au(0, 0, 0, 1, 0x67, 0x42, 0, 0, 0, 1, 0x68, 0xce, 0, 0, 1, 0x65, 0x88, 0x84);
        const delta = au(0, 0, 0, 1, 0x41, 0x9a, 0, 0, 3, 1, 0x02);  // 00 00 03 01: escaped, not a start code
        return [nalTypes(idr), isKeyFrame(idr), nalTypes(delta), isKeyFrame(delta), nalTypes(au(0, 0, 1)), nalTypes(au())];
    }""")
    assert got == [[7, 8, 5], True, [1], False, [], []]


@needs_av
def test_a_decode_error_gets_a_new_decoder_and_a_key_frame(served):
    """Chunk 5's first unit is an IDR slice of noise with no parameter sets: Chromium's decoder
    fails (and closes itself); the page configures a new one, asks for a key frame once, and
    decodes everything from the IDR that answers it."""
    s = served(FakeWorld(corrupt_chunks=frozenset({5}), chunks=16))
    p = s.page
    skip_unless_decodes_h264(p)
    s.ask_for("h264")
    p.wait("demo.world.format === 'h264' && demo.world.chunkIndex === 15")
    sent = s.log.sessions[-1].sent
    assert sent[5] == (5, ["key", "delta"]) and sent[6] == (6, ["key", "delta"])
    video = p.js("demo.world.video")
    # Chunk 5's two frames went with the failed decoder; the other 15 chunks were decoded whole.
    assert (video["decodeErrors"], video["keyFrameRequests"], video["deltasDropped"], video["framesDecoded"]) == (
        1, 1, 0, 30)
    assert video["lastDecodeError"].startswith("EncodingError")  # Chromium 156: "EncodingError: Decoding error."
    assert s.log.keyframe_requests == 1
    assert p.console_errors == []


@needs_av
def test_a_reset_restarts_the_stream_without_a_gap(served):
    """After session.reset the server starts a new stream at chunk 0 with an IDR: the page
    decodes on, with no key-frame request and nothing dropped."""
    s = served()
    p = s.page
    skip_unless_decodes_h264(p)
    s.ask_for("h264")
    p.wait("demo.world.format === 'h264' && demo.world.chunkIndex >= 3")
    p.page.click("#world-reset")
    p.wait("demo.world.resets === 1 && demo.world.chunkIndex >= 3")
    sent = s.log.sessions[-1].sent
    restart = [i for i, (index, _) in enumerate(sent) if index == 0]
    assert len(restart) == 2 and [sent[i][1] for i in restart] == [["key", "delta"], ["key", "delta"]]
    video = p.js("demo.world.video")
    assert (video["keyFrameRequests"], video["deltasDropped"], video["decodeErrors"]) == (0, 0, 0)
    assert s.log.keyframe_requests == 0
    assert p.console_errors == []
