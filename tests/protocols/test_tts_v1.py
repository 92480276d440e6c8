"""tts.v1 wire format: exact frames in, exact frames and error codes out."""

import asyncio
import json
import wave

import pytest

from protocols import tts_v1
from protocols.tts_v1 import (
    AudioDone,
    AudioStart,
    Error,
    InputDone,
    InputText,
    ProtocolError,
    ResponseCancel,
    ResponseCancelled,
    ResponseDone,
    SessionClose,
    SessionClosed,
    SessionConfig,
    SessionUpdate,
    SessionUpdated,
    encode,
    parse_client,
    parse_server,
)

VOICES = ("en_US-joe-medium",)


def _code(raw, voices=VOICES):
    with pytest.raises(ProtocolError) as info:
        parse_client(raw, voices)
    return info.value.code


def test_client_messages_parse_to_frozen_values():
    assert parse_client(
        '{"type":"session.update","voice":"en_US-joe-medium","sample_rate":24000,"format":"pcm16","speed":1.5}', VOICES
    ) == SessionUpdate("en_US-joe-medium", 24000, "pcm16", 1.5)
    assert parse_client('{"type":"session.update","speed":1}', VOICES) == SessionUpdate(speed=1.0)
    assert parse_client('{"type":"session.update"}') == SessionUpdate()
    assert parse_client('{"type":"input.text","text":" wor"}') == InputText(" wor")
    assert parse_client('{"type":"input.done"}') == InputDone()
    assert parse_client('{"type":"response.cancel","extra":1}') == ResponseCancel()
    assert parse_client('{"type":"session.close"}') == SessionClose()


def test_bad_input_gets_its_code():
    assert _code("{not json") == "bad_request"
    assert _code("[1, 2]") == "bad_request"
    assert _code('{"text":"hi"}') == "bad_request"
    assert _code(b'{"type":"input.done"}') == "bad_request"  # binary frame
    assert _code('{"type":"input.audio"}') == "unknown_type"
    assert _code('{"type":"session.update","voice":"en_GB-alan"}') == "unknown_voice"
    assert _code('{"type":"session.update","voice":7}') == "bad_request"
    assert _code('{"type":"session.update","sample_rate":16000}') == "unsupported_rate"
    assert _code('{"type":"session.update","sample_rate":24000.0}') == "bad_request"
    assert _code('{"type":"session.update","sample_rate":true}') == "bad_request"
    assert _code('{"type":"session.update","format":"opus"}') == "unsupported_format"
    assert _code('{"type":"session.update","speed":2.5}') == "bad_speed"
    assert _code('{"type":"session.update","speed":0.49}') == "bad_speed"
    assert _code('{"type":"session.update","speed":NaN}') == "bad_request"  # not JSON (protocols/jsonsafe.py)
    assert _code('{"type":"session.update","speed":"fast"}') == "bad_request"
    assert _code('{"type":"input.text"}') == "bad_request"
    assert _code('{"type":"input.text","text":5}') == "bad_request"
    assert _code('{"type":"input.text","text":""}') == "empty_text"
    assert _code(json.dumps({"type": "input.text", "text": "a" * 4097})) == "text_too_long"
    assert parse_client(json.dumps({"type": "input.text", "text": "a" * 4096})) == InputText("a" * 4096)


def test_error_messages_are_readable():
    with pytest.raises(ProtocolError) as info:
        parse_client('{"type":"session.update","sample_rate":16000}')
    assert info.value.message == "sample_rate 16000 is not supported; use one of 22050, 24000"
    assert str(info.value) == "unsupported_rate: sample_rate 16000 is not supported; use one of 22050, 24000"
    with pytest.raises(ProtocolError) as info:
        parse_client('{"type":"session.update","voice":"x"}', VOICES)
    assert info.value.message == "unknown voice 'x'; available: en_US-joe-medium"


def test_server_frames_are_exact():
    config = SessionConfig("en_US-joe-medium")
    assert encode(config.updated(VOICES)) == (
        '{"type":"session.updated","voice":"en_US-joe-medium","sample_rate":22050,'
        '"format":"pcm16","speed":1.0,"voices":["en_US-joe-medium"]}'
    )
    assert encode(AudioStart(0, 2, "Héllo.", 24000)) == (
        '{"type":"audio.start","utterance_index":0,"sentence_index":2,"text":"Héllo.","sample_rate":24000}'
    )
    assert encode(AudioDone(0, 2, 116472)) == '{"type":"audio.done","utterance_index":0,"sentence_index":2,"samples":116472}'
    assert encode(ResponseDone(0, 3, 200000)) == '{"type":"response.done","utterance_index":0,"sentences":3,"samples":200000}'
    assert encode(ResponseCancelled(1)) == '{"type":"response.cancelled","utterance_index":1}'
    assert encode(SessionClosed()) == '{"type":"session.closed"}'
    assert tts_v1.error("empty_text", "input.text needs non-empty text") == (
        '{"type":"error","code":"empty_text","message":"input.text needs non-empty text"}'
    )
    with pytest.raises(ValueError):
        tts_v1.error("oops", "not a code")


def test_client_frames_are_exact_and_round_trip():
    assert encode(SessionUpdate(sample_rate=24000, format="pcm16")) == (
        '{"type":"session.update","sample_rate":24000,"format":"pcm16"}'
    )
    for msg in (SessionUpdate("en_US-joe-medium", 22050, "pcm16", 0.5), InputText("hi"), InputDone(), SessionClose()):
        assert parse_client(encode(msg), VOICES) == msg


def test_server_frames_round_trip():
    for msg in (
        SessionUpdated("v", 24000, "pcm16", 1.25, ("v", "w")),
        AudioStart(1, 0, "Hi.", 22050),
        AudioDone(1, 0, 9),
        ResponseDone(1, 1, 9),
        ResponseCancelled(3),
        SessionClosed(),
        Error("bad_request", "x"),
    ):
        assert parse_server(encode(msg)) == msg
    with pytest.raises(ProtocolError) as info:
        parse_server('{"type":"audio.done","utterance_index":0}')
    assert info.value.code == "bad_request"


def test_session_config_applies_partial_updates():
    config = SessionConfig("en_US-joe-medium")
    assert config == SessionConfig("en_US-joe-medium", 22050, "pcm16", 1.0)
    assert config.apply(SessionUpdate(sample_rate=24000)) == SessionConfig("en_US-joe-medium", 24000, "pcm16", 1.0)
    assert config.apply(SessionUpdate(speed=0.5)).apply(SessionUpdate()) == SessionConfig(
        "en_US-joe-medium", 22050, "pcm16", 0.5
    )


def test_error_codes_are_documented_set():
    assert tts_v1.ERROR_CODES == {
        "bad_request",
        "unknown_type",
        "unknown_voice",
        "unsupported_format",
        "unsupported_rate",
        "bad_speed",
        "empty_text",
        "text_too_long",
        "invalid_text",
        "message_too_large",
        "tts_unavailable",
        "closed_by_admin",
        "idle_timeout",
        "too_many_sessions",
        "loading",
        "going_away",
        "buffer_full",
        "internal",
    }


def test_every_tts_code_is_documented():
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocols_tts.md").read_text()
    table = doc.split("### Errors", 1)[1].split("\n\n", 2)[1]
    assert sorted(re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.M)) == sorted(tts_v1.ERROR_CODES)


# --- the Python client against a scripted tts.v1 peer on loopback ------------------------


def test_client_streams_and_writes_a_wav(tmp_path):
    from websockets.asyncio.server import serve

    from clients.tts import synthesize, write_wav

    pcm1, pcm2 = bytes(range(200)) * 4, b"\x01\x00" * 300
    received = []

    async def peer(ws):
        async for raw in ws:
            msg = parse_client(raw, VOICES)
            received.append(msg)
            if isinstance(msg, SessionUpdate):
                config = SessionConfig("en_US-joe-medium").apply(msg)
                await ws.send(encode(config.updated(VOICES)))
            elif isinstance(msg, InputDone):
                await ws.send(encode(AudioStart(0, 0, "Hello.", 24000)))
                await ws.send(pcm1[:500])
                await ws.send(pcm1[500:])
                await ws.send(encode(AudioDone(0, 0, 400)))
                await ws.send(encode(AudioStart(0, 1, "Bye.", 24000)))
                await ws.send(pcm2)
                await ws.send(encode(AudioDone(0, 1, 300)))
                await ws.send(encode(ResponseDone(0, 2, 700)))
            elif isinstance(msg, SessionClose):
                await ws.send(encode(SessionClosed()))

    async def main():
        async with serve(peer, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            return await synthesize("Hello. Bye.", "ws://127.0.0.1:%d" % port, sample_rate=24000, piece_chars=4)

    result = asyncio.run(main())
    assert received == [
        SessionUpdate(sample_rate=24000, format="pcm16"),
        InputText("Hell"),
        InputText("o. B"),
        InputText("ye."),
        InputDone(),
        SessionClose(),
    ]
    assert result.pcm == pcm1 + pcm2 and result.sample_rate == 24000 and result.samples == 700
    assert [(s.sentence_index, s.text, s.samples, s.received_bytes) for s in result.sentences] == [
        (0, "Hello.", 400, 800),
        (1, "Bye.", 300, 600),
    ]
    assert result.time_to_first_audio_s is not None and result.time_to_first_audio_s >= 0
    path = tmp_path / "speech.wav"
    write_wav(str(path), result.pcm, result.sample_rate)
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 24000, 700)
        assert w.readframes(700) == pcm1 + pcm2


def test_client_surfaces_server_errors():
    from websockets.asyncio.server import serve

    from clients.tts import ServerError, synthesize

    async def peer(ws):
        async for raw in ws:
            await ws.send(tts_v1.error("unsupported_rate", "no"))

    async def main():
        async with serve(peer, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            return await synthesize("x", "ws://127.0.0.1:%d" % port, sample_rate=24000, timeout=5)

    with pytest.raises(ServerError) as info:
        asyncio.run(main())
    assert info.value.code == "unsupported_rate"
