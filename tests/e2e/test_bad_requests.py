"""Requests a client got wrong are answered and closed, and leave no traceback or ERROR in the
server log (realtime/server/transport.py item 1): raw sockets against a real server process."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from deploy.server_process import PROBLEM, ServerProcess
from realtime.server.transport import MAX_HEADER_BYTES
from tests.support.raw_http import exchange as raw_exchange


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(policy="") as proc:
        yield proc
        assert proc.problems() == []


def exchange(server: ServerProcess, chunks: list[bytes], pause_s: float = 0.0,
             timeout_s: float = 5.0) -> tuple[bytes, float, list[str]]:
    """Send ``chunks`` and read until the server closes; returns (everything read, seconds,
    the log lines no client may cause that appeared meanwhile)."""
    before = len(server.log_text().splitlines())
    data, took = raw_exchange(server.addr, chunks, pause_s, timeout_s)
    time.sleep(0.2)  # an app task that raised would have logged by now
    problems = [line for line in server.log_text().splitlines()[before:] if PROBLEM.search(line)]
    return data, took, problems


def request(line: str, *headers: str, body: bytes = b"") -> bytes:
    return ("\r\n".join([line, "Host: a", *headers]) + "\r\n\r\n").encode() + body


CHUNKED = "Transfer-Encoding: chunked"

# Each: a head h11 takes (uvicorn starts the app for it) and a body it refuses. The app's
# answer then raised in h11: "Exception in ASGI application ... LocalProtocolError".
BAD_BODIES = {
    "bad chunk size, GET /healthz": request("GET /healthz HTTP/1.1", CHUNKED, body=b"zz\r\n"),
    "bad chunk size, POST /healthz": request("POST /healthz HTTP/1.1", CHUNKED, body=b"zz\r\n"),
    "bad chunk size, PUT /v1/models": request("PUT /v1/models HTTP/1.1", CHUNKED, body=b"zz\r\n"),
    "bad chunk size, unknown path": request("POST /no/such/path HTTP/1.1", CHUNKED, body=b"zz\r\n"),
    "bad chunk size, HEAD": request("HEAD /healthz HTTP/1.1", CHUNKED, body=b"zz\r\n"),
    "chunk size past 20 digits": request("POST /healthz HTTP/1.1", CHUNKED, body=b"f" * 24 + b"\r\n"),
    "chunk without its CRLF": request("POST /healthz HTTP/1.1", CHUNKED, body=b"3\r\nabcXX0\r\n\r\n"),
    "bad trailer": request("POST /healthz HTTP/1.1", CHUNKED, body=b"0\r\nno colon\r\n\r\n"),
    "HTTP/1.0 with chunked": request("POST /healthz HTTP/1.0", CHUNKED, body=b"zz\r\n"),
    "upgrade with a bad chunked body": request(
        "GET /v1/realtime/world HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13", CHUNKED, body=b"zz\r\n"),
}


@pytest.mark.parametrize("raw", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_a_refused_body_is_answered_400_without_a_traceback(server, raw):
    data, took, problems = exchange(server, [raw])
    assert data.startswith(b"HTTP/1.1 400 "), data[:80]
    assert data.count(b"HTTP/1.1 ") == 1, data  # the app's answer does not follow
    assert problems == []
    assert took < 3


@pytest.mark.parametrize("path", ["/healthz", "/v1/models"])
def test_a_body_refused_after_the_app_answered_closes_without_a_traceback(server, path):
    # The app answers from the head; the bad body comes later. uvicorn's 400 then raised in
    # h11 ("Fatal error on transport ... LocalProtocolError"): the answer stands, and the
    # connection closes.
    data, took, problems = exchange(server, [request(f"GET {path} HTTP/1.1", CHUNKED), b"zz\r\n"], pause_s=0.3)
    assert data.startswith(b"HTTP/1.1 200 "), data[:80]
    assert data.count(b"HTTP/1.1 ") == 1, data
    assert problems == []
    assert took < 3


SMUGGLING = {
    "Content-Length and Transfer-Encoding": request(
        "POST /healthz HTTP/1.1", "Content-Length: 5", CHUNKED, body=b"0\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n"),
    "two Content-Lengths": request("POST /healthz HTTP/1.1", "Content-Length: 5", "Content-Length: 6",
                                   body=b"abcdef"),
    "a bad Content-Length": request("POST /healthz HTTP/1.1", "Content-Length: x"),
    "a space before the colon": request("POST /healthz HTTP/1.1", "Transfer-Encoding : chunked", body=b"0\r\n\r\n"),
    "a control byte in a header name": request("GET /healthz HTTP/1.1", "X\x01: y"),
    "a NUL in a header value": request("GET /healthz HTTP/1.1", "X: a\x00b"),
    "no Host in HTTP/1.1": b"GET /healthz HTTP/1.1\r\n\r\n",
}


@pytest.mark.parametrize("raw", SMUGGLING.values(), ids=SMUGGLING.keys())
def test_an_ambiguous_or_malformed_head_gets_400_and_a_close(server, raw):
    # Content-Length with Transfer-Encoding was served (405) and kept alive: what followed the
    # chunked body was read as the next request (RFC 9112 section 6.1: close after it).
    data, took, problems = exchange(server, [raw])
    assert data.startswith(b"HTTP/1.1 400 "), data[:80]
    assert data.count(b"HTTP/1.1 ") == 1, data
    assert problems == []
    assert took < 3


def test_a_transfer_coding_other_than_chunked_gets_501(server):
    data, took, problems = exchange(server, [request("POST /healthz HTTP/1.1", "Transfer-Encoding: gzip, chunked",
                                                     body=b"0\r\n\r\n")])
    assert data.startswith(b"HTTP/1.1 501 "), data[:80]
    assert data.count(b"HTTP/1.1 ") == 1, data
    assert problems == []
    assert took < 3


def test_a_body_past_its_content_length_is_refused_as_the_next_request(server):
    data, took, problems = exchange(server, [request("POST /healthz HTTP/1.1", "Content-Length: 2",
                                                     body=b"abGARBAGE\x01\r\n\r\n")])
    assert data.startswith(b"HTTP/1.1 405 "), data[:80]
    assert data.count(b"HTTP/1.1 400 ") == 1, data
    assert problems == []
    assert took < 3


def head_of(size: int, line: str = "GET /healthz HTTP/1.1") -> bytes:
    """A request head of exactly ``size`` bytes, its final blank line included."""
    head = request(line, "X-Pad: ")
    pad = size - len(head)
    assert pad >= 0
    return head[:-4] + b"p" * pad + b"\r\n\r\n"


def test_a_head_of_max_header_bytes_is_served_and_one_byte_more_is_431(server):
    assert len(head_of(MAX_HEADER_BYTES)) == MAX_HEADER_BYTES
    data, _, problems = exchange(server, [head_of(MAX_HEADER_BYTES, "GET /healthz HTTP/1.0")])
    assert data.startswith(b"HTTP/1.1 200 "), data[:80]
    data, took, problems = exchange(server, [head_of(MAX_HEADER_BYTES + 1)])
    assert data.startswith(b"HTTP/1.1 431 "), data[:80]
    assert data.endswith(b"\r\n\r\nrequest head over %d bytes\n" % MAX_HEADER_BYTES), data
    assert problems == []
    assert took < 3


@pytest.mark.parametrize("size", [20_000, 100_000, 250_000])
def test_a_big_plain_head_sent_at_once_gets_431(server, size):
    # It arrives complete in one read (or a few): a 100 KB header line was answered 200.
    data, took, problems = exchange(server, [head_of(size)])
    assert data.startswith(b"HTTP/1.1 431 "), data[:80]
    assert problems == []
    assert took < 3


def test_a_head_padded_with_whitespace_counts_as_sent(server):
    # h11 strips the whitespace around a value: the limit counts the bytes received.
    head = request("GET /healthz HTTP/1.1", "X-Pad:" + " " * MAX_HEADER_BYTES + "v")
    data, _, problems = exchange(server, [head])
    assert data.startswith(b"HTTP/1.1 431 "), data[:80]
    assert problems == []


NOT_HTTP = {
    "an SSH banner": b"SSH-2.0-OpenSSH_9.6\r\n",
    "an SMTP greeting": b"EHLO example.com\r\n",
    "binary junk": bytes(range(0x80, 0xa0)),
    "a NUL after the method": b"GET\x00",
    "a tab for a space": b"GET\t/ HTTP/1.1\r\n",
    "two spaces": b"GET  / HTTP/1.1\r\n",
    "a lowercase version": b"GET / http/1.1\r\n",
    "a version cut short": b"GET / HTTP/1\r\n",
    "a request line with no version": b"GET /\r\nHost: a\r\n",
    "a TLS ClientHello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
}


@pytest.mark.parametrize("raw", NOT_HTTP.values(), ids=NOT_HTTP.keys())
def test_bytes_that_cannot_start_a_request_get_400_at_once(server, raw):
    # Before: no answer until the 10 s head timeout closed the socket (except TLS).
    data, took, problems = exchange(server, [raw])
    assert data.startswith(b"HTTP/1.1 400 "), data[:80]
    assert took < 2
    assert problems == []


def test_a_request_sent_one_byte_at_a_time_is_still_served(server):
    raw = request("GET /healthz?x=1 HTTP/1.1", "Connection: close")
    data, _, problems = exchange(server, [raw[i:i + 1] for i in range(len(raw))], pause_s=0.002)
    assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b"OK"), data[:80]
    assert problems == []
