"""realtime/server/transport.py item 1: which first bytes can still become an HTTP request."""

from __future__ import annotations

import pytest

from realtime.server.transport import could_start_request

REQUEST = b"GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"


@pytest.mark.parametrize("n", range(len(REQUEST) + 1))
def test_every_prefix_of_a_request_can_start_one(n):
    assert could_start_request(REQUEST[:n]) is True


@pytest.mark.parametrize("received", [
    b"", b"P", b"GET / HTTP/1.", b"OPTIONS * HTTP/1.0\n", b"M-SEARCH * HTTP/1.1\r\n", b"GET http://a/b?c=%20 HTTP/1.1\r",
    b"GET / HTTP/1.1\r\n\x00 after the first line: h11 judges",
])
def test_other_request_lines_and_their_starts(received):
    assert could_start_request(received) is True


@pytest.mark.parametrize("received", [
    b"SSH-2.0-OpenSSH_9.6\r\n",  # a complete first line with no target and no version
    b"\r\n", b"\n",  # h11 refuses a blank line before the request line
    b" GET", b"\x16\x03\x01",  # a space, a TLS record: not a method
    b"GET\t", b"GET  /", b"GET /\x7f", b"GET / \xff",  # one space, visible ASCII, then HTTP/
    b"GET / http", b"GET / HTTP/1.1 ", b"GET / HTTP/11", b"GET / HTTP/1.1\r\r",
    b"GET / HTTP/1.1x\r\n", b"GET /\r\n",
])
def test_bytes_that_cannot(received):
    assert could_start_request(received) is False
