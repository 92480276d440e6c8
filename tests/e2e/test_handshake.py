"""Request heads are bounded and always answered: raw sockets against a real server process."""

from __future__ import annotations

import socket
import time
from typing import Iterator

import pytest

from deploy.server_process import ServerProcess
from realtime.server.transport import HEAD_TIMEOUT_S, MAX_HEADER_BYTES
from tests.support.raw_http import exchange

KEY = "dGhlIHNhbXBsZSBub25jZQ=="


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(policy="") as proc:
        yield proc
        assert proc.problems() == []


def upgrade(addr: str, *extra: str, path: str = "/v1/realtime/world") -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {addr}", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {KEY}", "Sec-WebSocket-Version: 13", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_normal_upgrade_still_switches_protocols(server):
    host, port = server.addr.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(upgrade(server.addr, "X-Fine: " + "a" * 4000))
        assert s.recv(4096).startswith(b"HTTP/1.1 101 ")


@pytest.mark.parametrize("size", [8193, 9000, 20000, 70000])
def test_one_header_line_over_8_kib_gets_431_and_a_close(server, size):
    data, took = exchange(server.addr, [upgrade(server.addr, "X-Big: " + "a" * size)])
    assert data.startswith(b"HTTP/1.1 431 "), data[:80]
    assert took < 3


def test_many_short_headers_over_the_total_limit_get_431(server):
    headers = [f"X-H{i}: " + "b" * 1000 for i in range(MAX_HEADER_BYTES // 1000 + 1)]
    data, took = exchange(server.addr, [upgrade(server.addr, *headers)])
    assert data.startswith(b"HTTP/1.1 431 "), data[:80]
    assert took < 3


def test_more_than_128_headers_get_431(server):
    data, _ = exchange(server.addr, [upgrade(server.addr, *(f"X-{i}: 1" for i in range(130)))])
    assert data.startswith(b"HTTP/1.1 431 "), data[:80]


def test_a_trickled_endless_header_is_cut_off(server):
    head = upgrade(server.addr)[:-2] + b"X-Endless: "
    chunks = [head] + [b"c" * 1024] * (2 * MAX_HEADER_BYTES // 1024)
    data, took = exchange(server.addr, chunks, pause_s=0.01)
    assert data.startswith(b"HTTP/1.1 431 "), data[:80]
    assert took < 5


def test_a_garbage_upgrade_is_answered_or_closed(server):
    data, took = exchange(server.addr, [b"GET /v1/realtime/world HTTP/1.1\r\nUpgrade: websocket\r\n"
                                        b"Connection: Upgrade\r\n\r\n"])
    assert data.startswith(b"HTTP/1.1 4"), data[:80]
    assert took < 3


def test_plain_http_with_a_huge_header_is_refused(server):
    data, _ = exchange(server.addr, [b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"d" * 300_000 + b"\r\n\r\n"])
    assert data.startswith(b"HTTP/1.1 431 "), data[:80]
    assert server.healthy()


def test_a_connection_whose_request_head_never_completes_is_closed(server):
    """Nothing sent, a head cut short, and the second head on a keep-alive connection cut
    short: each is closed once HEAD_TIMEOUT_S has passed (one client once held every file
    descriptor of the server with such sockets). The three wait side by side."""
    host, port = server.addr.split(":")
    socks = [socket.create_connection((host, int(port))) for _ in range(3)]
    socks[1].sendall(b"GET /v1/realtime/world HTTP/1.1\r\nHost: a\r\n")
    socks[2].sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
    first = b""
    while not first.endswith(b"OK"):
        first += socks[2].recv(4096)
    socks[2].sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n")  # before the 5 s keep-alive ends
    started = time.monotonic()
    closed_after = []
    for s in socks:
        s.settimeout(HEAD_TIMEOUT_S + 10 - (time.monotonic() - started))
        try:
            while s.recv(4096):
                pass
        except ConnectionResetError:
            pass
        closed_after.append(time.monotonic() - started)
        s.close()
    assert max(closed_after) < HEAD_TIMEOUT_S + 5, closed_after
    assert min(closed_after) > HEAD_TIMEOUT_S - 1, closed_after  # not before the deadline
    assert server.healthy()
