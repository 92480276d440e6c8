"""``python -m clients.world`` as the README has a reader type it."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from clients.world import main


def test_help_names_the_program_and_explains_the_options(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("usage: python -m clients.world ")
    assert "--host HOST the server's address (default: 127.0.0.1)" in text
    assert "--port PORT the server's port (default: 8000)" in text
    assert "--url URL the whole WebSocket URL instead of --host and --port (default: ws://HOST:PORT/v1/realtime/world)" in text
    assert "--session SESSION session id to create; must not be in use on the server (default: a fresh cli-XXXXXXXX)" in text
    assert "--chunks CHUNKS how many chunks to play" in text


def test_plays_a_session_on_a_real_server(tiny_server, tmp_path, capsys):
    out = tmp_path / "last.png"
    assert main(["--url", f"ws://{tiny_server}/v1/realtime/world", "--keys", "wj", "--chunks", "3",
                 "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[0])["type"] == "session.created"
    assert lines[1].startswith("3 frames in ")
    assert lines[2] == f"wrote {out}"
    with Image.open(out) as image:
        assert image.size == (256, 256)


def test_two_runs_at_once_each_get_their_own_session(tiny_server, capsys):
    """No --session: each run makes a fresh id (a fixed default failed the second run with
    session_exists); --host and --port name the server."""
    import threading

    host, port = tiny_server.rsplit(":", 1)
    results: list[int] = []
    runs = [threading.Thread(target=lambda: results.append(
        main(["--host", host, "--port", port, "--keys", "", "--chunks", "2"]))) for _ in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(60)
    assert results == [0, 0]
    created = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    ids = {c["session_id"] for c in created}
    assert len(ids) == 2 and all(i.startswith("cli-") and len(i) == 12 for i in ids)


def test_a_refusal_and_an_unreachable_server_are_one_line_and_a_status(tiny_server, capsys):
    url = f"ws://{tiny_server}/v1/realtime/world"
    assert main(["--url", url, "--session", "cli-bad", "--keys", "wz", "--chunks", "1"]) == 1
    assert capsys.readouterr().err.startswith("server error: bad_request: controls[0].data: keys.v1: unknown key 'z'")
    assert main(["--url", "ws://127.0.0.1:1/v1/realtime/world", "--chunks", "1"]) == 2
    assert capsys.readouterr().err.startswith("cannot talk to ws://127.0.0.1:1/v1/realtime/world: ")
    with pytest.raises(SystemExit):
        main(["--chunks", "0"])
    assert "--chunks: must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--port", "99999"])
    assert "--port: must be a port, 1..65535, got 99999" in capsys.readouterr().err


def test_the_tts_client_explains_every_option(capsys):
    from clients.tts import main as tts_main

    with pytest.raises(SystemExit):
        tts_main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("usage: python -m clients.tts ")
    for option in ("--host", "--port", "--url", "--out", "--rate", "--voice", "--speed", "--piece-chars",
                   "--timeout", "--session"):
        shown = text.split(f" {option} ", 1)[1].split(" --", 1)[0] if f" {option} " in text else ""
        assert len(shown.split()) >= 4, f"{option} is not explained: {shown!r}"
