"""realtime/server/auth.py: ``ApiKeyGuard`` on bare ASGI scopes (every accepted form, each
refusal, the open paths, the subprotocol answer, the redacted query, the constant-time
compare) and ``warn_if_exposed``. Through a real server and real clients:
tests/e2e/test_api_keys.py."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from realtime.server import auth
from realtime.server.auth import ApiKeyGuard, check_keys, warn_if_exposed

KEY = "sk-live-3f9a7c21d4e8b6a0"
OTHER = "sk-live-0000111122223333"


def ws_scope(path: str = "/v1/realtime/world", headers: list | None = None, query: bytes = b"",
             subprotocols: list[str] | None = None) -> dict[str, Any]:
    return {"type": "websocket", "path": path, "root_path": "", "query_string": query, "headers": headers or [],
            "subprotocols": subprotocols or [], "client": ("10.0.0.5", 50000),
            "extensions": {"websocket.http.response": {}}}


def http_scope(path: str, headers: list | None = None, query: bytes = b"") -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": path, "root_path": "", "query_string": query,
            "headers": headers or [], "client": ("10.0.0.5", 50000)}


class Run:
    """One request through a guard in front of an app that accepts or answers 200."""

    def __init__(self, keys: tuple[str, ...] = (KEY,), metrics_require_key: bool = False,
                 accept: dict[str, Any] | None = None) -> None:
        self.reached: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self.accept = accept or {"type": "websocket.accept", "subprotocol": None, "headers": []}
        self.guard = ApiKeyGuard(self.app, keys=keys, metrics_require_key=metrics_require_key,
                                 on_refused=self.refused.append)

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.reached.append(scope)
        if scope["type"] == "websocket":
            await receive()
            await send(self.accept)
        else:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    def __call__(self, scope: dict[str, Any]) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "websocket.connect"} if scope["type"] == "websocket" else {"type": "http.request"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        asyncio.run(self.guard(scope, receive, send))
        return sent


def status(sent: list[dict[str, Any]]) -> int:
    """101 for an accepted WebSocket, else the response's status."""
    first = sent[0]
    return 101 if first["type"] == "websocket.accept" else first["status"]


def bearer(key: str) -> list:
    return [(b"authorization", b"Bearer " + key.encode())]


# ---------------------------------------------------------------------------- accepted forms
@pytest.mark.parametrize("scope", [
    ws_scope(headers=[(b"authorization", b"Bearer " + KEY.encode())]),
    ws_scope(headers=[(b"authorization", b"bearer " + KEY.encode())]),  # schemes are case-insensitive
    ws_scope(headers=[(b"authorization", b"Api-Key " + KEY.encode())]),  # openpi-client's form
    ws_scope(headers=[(b"authorization", b"API-KEY " + KEY.encode())]),
    ws_scope(query=b"api_key=" + KEY.encode()),
    ws_scope(query=b"session_id=s1&api_key=" + KEY.encode()),  # a page-style URL, routed by session_id
    ws_scope(query=b"api%5Fkey=sk%2Dlive%2D3f9a7c21d4e8b6a0"),  # percent-encoded name and value
    ws_scope(subprotocols=["realtime", "realtime.api-key." + KEY]),
    ws_scope(path="/", headers=[(b"authorization", b"Api-Key " + KEY.encode())]),  # OpenPI's root path
    http_scope("/v1/models", headers=[(b"authorization", b"Bearer " + KEY.encode())]),
    http_scope("/v1/sessions", query=b"api_key=" + KEY.encode()),
], ids=["bearer", "bearer-lower", "api-key", "api-key-upper", "query", "query-page", "query-encoded",
        "subprotocol", "openpi-root", "http-bearer", "http-query"])
def test_every_accepted_form_reaches_the_app(scope):
    run = Run()
    assert status(run(scope)) in (101, 200)
    assert len(run.reached) == 1 and run.refused == []


def test_any_of_several_keys_is_accepted():
    run = Run(keys=(OTHER, KEY))
    assert status(run(ws_scope(headers=bearer(KEY)))) == 101
    assert status(run(ws_scope(headers=bearer(OTHER)))) == 101
    assert status(run(ws_scope(headers=bearer("sk-live-nope")))) == 401


def test_a_non_ascii_key_is_compared_as_utf8():
    key = "clé-secrète"
    run = Run(keys=(key,))
    assert status(run(ws_scope(headers=[(b"authorization", b"Bearer " + key.encode("utf-8"))]))) == 101
    assert status(run(ws_scope(query=b"api_key=cl%C3%A9-secr%C3%A8te"))) == 101
    assert status(run(ws_scope(headers=[(b"authorization", b"Bearer " + key.encode("latin-1"))]))) == 401


# ---------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("scope", [
    ws_scope(),
    ws_scope(headers=bearer(OTHER)),
    ws_scope(query=b"api_key=" + OTHER.encode()),
    ws_scope(subprotocols=["realtime.api-key." + OTHER]),
    ws_scope(headers=bearer(KEY[:-1])),  # a prefix of the key
    ws_scope(headers=bearer(KEY + "0")),
], ids=["missing", "wrong-bearer", "wrong-query", "wrong-subprotocol", "prefix", "longer"])
def test_a_websocket_without_a_valid_key_is_refused_401_before_the_app(scope):
    run = Run()
    sent = run(scope)
    assert run.reached == [] and run.refused == ["unauthorized"]
    start, body = sent
    assert start["type"] == "websocket.http.response.start" and start["status"] == 401
    assert (b"www-authenticate", b"Bearer") in start["headers"]
    assert body["type"] == "websocket.http.response.body" and body["body"].startswith(b"unauthorized: ")


def test_an_http_request_without_a_valid_key_is_refused_401_with_a_json_body():
    run = Run()
    start, body = run(http_scope("/v1/models", headers=bearer(OTHER)))
    assert run.reached == [] and run.refused == ["unauthorized"]
    assert start["status"] == 401
    headers = dict(start["headers"])
    assert headers[b"www-authenticate"] == b"Bearer" and headers[b"content-type"] == b"application/json"
    assert int(headers[b"content-length"]) == len(body["body"])
    error = json.loads(body["body"])["error"]
    assert error["code"] == "unauthorized" and "Authorization: Bearer KEY" in error["message"]


@pytest.mark.parametrize("value", [
    b"", b"Bearer", b"Bearer ", b"Bearer  " + KEY.encode(), b" Bearer " + KEY.encode(), b"Bearer " + KEY.encode() + b" ",
    b"Bearer\t" + KEY.encode(), b"Bearer" + KEY.encode(), b"Basic " + KEY.encode(), b"Bearer " + KEY.encode() + b"\xc3\xa9",
    b"Bearer \xff\xfe\x00", b"\xff\xfe", b"Token " + KEY.encode(),
])
def test_a_malformed_authorization_header_is_a_plain_401(value):
    run = Run()
    assert status(run(ws_scope(headers=[(b"authorization", value)]))) == 401
    assert status(run(http_scope("/v1/models", headers=[(b"authorization", value)]))) == 401


@pytest.mark.parametrize("query", [
    b"api_key", b"api_key=", b"api_key=&api_key=", b"api_key=%ff%fe", b"api_key=%", b"&&&", b"api_key=" + KEY.encode() + b"%20",
])
def test_a_malformed_query_is_a_plain_401(query):
    assert status(Run()(ws_scope(query=query))) == 401


def test_an_empty_subprotocol_key_is_a_plain_401():
    assert status(Run()(ws_scope(subprotocols=["realtime.api-key.", "realtime"]))) == 401


def test_offered_keys_past_the_bound_are_not_looked_at():
    wrong = [(b"authorization", b"Bearer " + OTHER.encode())] * auth.MAX_OFFERED
    assert status(Run()(ws_scope(headers=[*wrong, *bearer(KEY)]))) == 401


# ---------------------------------------------------------------------------- open paths
@pytest.mark.parametrize("path", ["/", "/healthz", "/livez", "/version", "/web/app.js", "/web/style.css", "/metrics"])
def test_open_paths_need_no_key(path):
    run = Run()
    assert status(run(http_scope(path))) == 200 and run.refused == []


@pytest.mark.parametrize("path", ["/v1/models", "/v1/sessions", "/v1/sessions/world/abc", "/v1", "/favicon.ico",
                                  "/healthz/x", "/webx", "/metrics/"])
def test_other_http_paths_need_a_key(path):
    assert status(Run()(http_scope(path))) == 401


def test_every_websocket_path_needs_a_key():
    for path in ("/", "/v1/realtime/world", "/v1/realtime/tts", "/v1/realtime/robot/openpi", "/healthz", "/web/x"):
        assert status(Run()(ws_scope(path=path))) == 401, path


def test_metrics_needs_a_key_when_asked():
    run = Run(metrics_require_key=True)
    assert status(run(http_scope("/metrics"))) == 401
    assert status(run(http_scope("/metrics", headers=bearer(KEY)))) == 200
    assert status(run(http_scope("/healthz"))) == 200


def test_the_path_is_taken_below_the_root_path():
    scope = http_scope("/api/v1/models")
    scope["root_path"] = "/api"
    assert status(Run()(scope)) == 401
    scope = http_scope("/api/healthz")
    scope["root_path"] = "/api"
    assert status(Run()(scope)) == 200


def test_without_keys_everyone_passes():
    run = Run(keys=())
    assert status(run(ws_scope())) == 101
    assert status(run(http_scope("/v1/models"))) == 200
    assert status(run(http_scope("/metrics"))) == 200
    assert run.refused == []


def test_lifespan_passes_through():
    run = Run()

    async def main() -> None:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            run.reached.append(scope)

        await ApiKeyGuard(app, keys=(KEY,))({"type": "lifespan"}, None, None)

    asyncio.run(main())
    assert run.reached == [{"type": "lifespan"}]


# ---------------------------------------------------------------------------- subprotocols
def test_the_accept_names_the_offered_subprotocol_without_the_key():
    run = Run()
    sent = run(ws_scope(subprotocols=["realtime", "realtime.api-key." + KEY]))
    assert sent == [{"type": "websocket.accept", "subprotocol": "realtime", "headers": []}]


def test_the_accept_names_the_key_subprotocol_when_it_is_the_only_one():
    sent = Run()(ws_scope(subprotocols=["realtime.api-key." + KEY]))
    assert sent[0]["subprotocol"] == "realtime.api-key." + KEY


def test_a_subprotocol_the_app_chose_is_kept():
    accept = {"type": "websocket.accept", "subprotocol": "v2", "headers": []}
    sent = Run(accept=accept)(ws_scope(subprotocols=["v2", "realtime.api-key." + KEY]))
    assert sent[0]["subprotocol"] == "v2"


def test_a_key_subprotocol_is_answered_without_configured_keys_too():
    # A page that always offers its key still connects to a server that asks for none.
    sent = Run(keys=())(ws_scope(subprotocols=["realtime", "realtime.api-key.anything"]))
    assert sent[0]["subprotocol"] == "realtime"


def test_no_subprotocol_is_named_when_none_carries_a_key():
    sent = Run()(ws_scope(headers=bearer(KEY), subprotocols=["realtime"]))
    assert sent[0]["subprotocol"] is None


# ---------------------------------------------------------------------------- secrecy
@pytest.mark.parametrize("keys", [(), (KEY,)])
def test_a_query_key_is_redacted_in_the_scope_uvicorn_logs_from(keys):
    for offered in (KEY, OTHER):
        scope = ws_scope(query=b"session_id=s1&api_key=" + offered.encode() + b"&x=1")
        Run(keys=keys)(scope)
        assert scope["query_string"] == b"session_id=s1&api_key=redacted&x=1"
    scope = http_scope("/v1/models", query=b"api%5Fkey=" + KEY.encode())
    Run(keys=keys)(scope)
    assert scope["query_string"] == b"api%5Fkey=redacted"
    scope = http_scope("/healthz", query=b"session_id=s1")
    Run(keys=keys)(scope)
    assert scope["query_string"] == b"session_id=s1"


def test_no_part_of_a_key_is_logged(caplog):
    caplog.set_level(logging.DEBUG)
    run = Run()
    for scope in (ws_scope(headers=bearer(KEY + "x")), ws_scope(query=b"api_key=" + KEY.encode() + b"x"),
                  ws_scope(subprotocols=["realtime.api-key." + KEY + "x"]), http_scope("/v1/models", headers=bearer(KEY[:-2])),
                  ws_scope()):
        assert status(run(scope)) == 401
    assert run.refused == ["unauthorized"] * 5
    text = caplog.text
    assert text.count("unauthorized") == 5
    assert "1 API key(s) offered, none valid" in text and "(no API key)" in text
    assert "10.0.0.5" in text and "/v1/realtime/world" in text
    for piece in (KEY, KEY[:8], KEY[-8:], KEY[8:16], "3f9a", "b6a0"):
        assert piece not in text, piece
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4  # a wrong key is a warning, a missing one an info line


def test_every_offered_key_is_compared_with_every_key_in_constant_time(monkeypatch):
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", recording)
    keys = ("sk-a", KEY, "sk-c")
    run = Run(keys=keys)
    # The match is the second key: the third is compared all the same (no early exit).
    assert status(run(ws_scope(headers=bearer(KEY)))) == 101
    assert len(calls) == 3
    assert {b for _, b in calls} == set(run.guard.digests)
    # Digests of equal length: the time tells neither which key nor how long the keys are.
    assert all(len(a) == len(b) == 32 for a, b in calls)
    calls.clear()
    assert status(run(ws_scope(headers=bearer("nope"), query=b"api_key=" + KEY.encode()))) == 101
    assert len(calls) == 6
    calls.clear()
    assert status(run(ws_scope(headers=bearer("nope")))) == 401
    assert len(calls) == 3


# ---------------------------------------------------------------------------- configuration
@pytest.mark.parametrize("keys", [("",), ("sk a",), (" sk",), ("sk\n",), ("sk\x00",), (KEY, "")])
def test_keys_that_no_header_carries_are_refused_at_start(keys):
    with pytest.raises(ValueError) as info:
        check_keys(keys)
    assert all(key not in str(info.value) for key in keys if key)
    with pytest.raises(ValueError):
        ApiKeyGuard(lambda *a: None, keys=keys)


def test_check_keys_keeps_good_keys():
    assert check_keys([KEY, "clé"]) == (KEY, "clé")


@pytest.mark.parametrize(("host", "keys", "warned"), [
    ("127.0.0.1", (), False), ("localhost", (), False), ("::1", (), False), ("[::1]", (), False),
    ("127.0.0.2", (), False), ("0.0.0.0", (), True), ("::", (), True), ("", (), True),
    ("192.168.1.5", (), True), ("myhost.example", (), True), ("0.0.0.0", (KEY,), False),
])
def test_warn_if_exposed(caplog, host, keys, warned):
    caplog.set_level(logging.INFO, logger="realtime.server.auth")
    assert warn_if_exposed(host, keys) is warned
    records = [r for r in caplog.records if r.name == "realtime.server.auth"]
    assert len(records) == int(warned)
    if warned:
        assert records[0].levelno == logging.WARNING and "no API key" in records[0].getMessage()
