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
    assert "--url URL the server's world.v1 WebSocket (default: ws://127.0.0.1:8000/v1/realtime/world)" in text
    assert "--session SESSION session id to create" in text
    assert "--chunks CHUNKS how many chunks to play" in text


def test_plays_a_session_on_a_real_server(tiny_server, tmp_path, capsys):
    out = tmp_path / "last.png"
    assert main(["--url", f"ws://{tiny_server}/v1/realtime/world", "--keys", "wj", "--chunks", "3",
                 "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[0])["type"] == "session.created"
    assert lines[1].startswith("3 frames in ")
    assert lines[2] == f"wrote {out}"
    assert Image.open(out).size == (256, 256)


def test_a_refusal_and_an_unreachable_server_are_one_line_and_a_status(tiny_server, capsys):
    url = f"ws://{tiny_server}/v1/realtime/world"
    assert main(["--url", url, "--session", "cli-bad", "--keys", "wz", "--chunks", "1"]) == 1
    assert capsys.readouterr().err.startswith("server error: bad_request: controls[0].data: keys.v1: unknown key 'z'")
    assert main(["--url", "ws://127.0.0.1:1/v1/realtime/world", "--chunks", "1"]) == 2
    assert capsys.readouterr().err.startswith("cannot talk to ws://127.0.0.1:1/v1/realtime/world: ")
    with pytest.raises(SystemExit):
        main(["--chunks", "0"])
    assert "--chunks: must be >= 1, got 0" in capsys.readouterr().err
