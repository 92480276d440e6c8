"""Replicas behind nginx on loopback: routing on ?session_id=, a dead replica, a drained one.

One cluster of three replicas serves the whole module (start-up is the expensive part);
the kill and drain tests each pick a live replica as their victim, so they hold in any order.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections import Counter
from pathlib import Path

import pytest
import websockets
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from deploy.replicas import Deployment
from protocols.routing import with_session_id
from protocols.world_v1 import CLOSE_GOING_AWAY
from tests.deploy.conftest import GPUS, Player, join, requires_nginx, settled

pytestmark = requires_nginx


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 90))


def live_addrs(cluster: Deployment) -> set[str]:
    return {r.addr for r in cluster.replicas if r.alive}


def test_process_layout(cluster: Deployment):
    # One process per replica, each in its own process group, with its own GPU and port.
    for replica, gpu in zip(cluster.replicas, GPUS):
        pid = replica.proc.pid
        env = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
        assert env["CUDA_VISIBLE_DEVICES"] == gpu
        argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        assert argv[argv.index("--port") + 1] == str(replica.spec.port)
        assert os.getpgid(pid) == pid
    assert len({r.spec.port for r in cluster.replicas} | {cluster.port}) == len(GPUS) + 1
    # nginx: an unprivileged master and worker, its files in a private folder, on loopback only.
    conf = (cluster.nginx.run_dir / "nginx.conf").read_text()
    assert f"listen 127.0.0.1:{cluster.port};" in conf
    uids = {int(Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0])
            for pid in _group_pids(cluster.nginx.proc.pid)}
    assert len(_group_pids(cluster.nginx.proc.pid)) >= 2  # master + worker
    assert 0 not in uids


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    pids.append(int(entry.name))
            except ProcessLookupError:
                pass
    return pids


def test_fifty_sessions_spread_and_reconnect_to_the_same_replica(cluster: Deployment):
    async def main() -> None:
        live = live_addrs(cluster)
        players = await asyncio.gather(*(join(cluster.addr, f"spread-{i}") for i in range(50)))
        try:
            placed = Counter(p.upstream for p in players)
            # Every replica got some of the 50 (hash shares are uneven, but never near zero).
            assert set(placed) == live, placed
            # Each replica's /v1/sessions shows exactly the sessions nginx sent it, none of the others'.
            await settled(players, live)
            for p in players:
                assert (await p.client.next_chunk(credit=False)).chunk_index == 0
            # A reconnect with the same session_id lands on the same replica.
            again = players[:10]
            for p in again:
                await p.client.close()
                await p.stop()
            rejoined = await asyncio.gather(*(join(cluster.addr, p.session_id) for p in again))
            assert [r.upstream for r in rejoined] == [p.upstream for p in again]
            players[:10] = rejoined
        finally:
            await asyncio.gather(*(p.stop() for p in players))

    run(main())


def test_robot_url_carries_the_session_id(cluster: Deployment):
    # The real openpi-client takes the whole URL (query included) as its host; the same
    # robot id reaches the same replica on every connection.
    url = with_session_id(f"ws://{cluster.addr}/v1/realtime/robot/openpi", "robot-7")
    robots = [WebsocketClientPolicy(host=url) for _ in range(2)]
    try:
        assert all(r.get_server_metadata() is not None for r in robots)
        upstreams = [r._ws.response.headers["X-Upstream"].split(",")[-1].strip() for r in robots]
        assert upstreams[0] == upstreams[1] and upstreams[0] in live_addrs(cluster)
    finally:
        for robot in robots:
            robot._ws.close()


async def _players_on_every_replica(cluster: Deployment, prefix: str, count: int) -> list[Player]:
    # One credit at a time, 10 chunks/s at most each: streaming, without saturating two cores.
    players = await asyncio.gather(*(join(cluster.addr, f"{prefix}-{i}", credits=1) for i in range(count)))
    for p in players:
        p.start(pace_s=0.1)
    return list(players)


def _victim(cluster: Deployment, players: list[Player]):
    """The live replica holding the most of ``players`` (and at least one other live replica)."""
    live = live_addrs(cluster)
    assert len(live) >= 2, "needs two live replicas"
    addr, _ = Counter(p.upstream for p in players if p.upstream in live).most_common(1)[0]
    return cluster.replica_at(addr)


def test_killed_replica_fails_only_its_sessions(cluster: Deployment):
    async def main() -> None:
        players = await _players_on_every_replica(cluster, "kill", 9)
        try:
            await asyncio.gather(*(p.until(2) for p in players))
            victim = _victim(cluster, players)
            mine = [p for p in players if p.upstream == victim.addr]
            others = [p for p in players if p.upstream != victim.addr]
            await settled(players, live_addrs(cluster))
            victim.kill()
            # Its sessions' sockets drop (no close frame: the process is gone) ...
            for p in mine:
                assert await p.closed() in (None, 1006)
            # ... the others keep streaming, every chunk in order.
            await asyncio.gather(*(p.until(3) for p in others))
            for p in others:
                assert p.indexes == list(range(len(p.indexes))), p.session_id
                assert p.client.ws.close_code is None
            await settled(others, live_addrs(cluster), timeout_s=0)
            # New sessions, including the dead replica's own ids, land on live replicas.
            fresh = await asyncio.gather(*(join(cluster.addr, p.session_id) for p in mine),
                                         *(join(cluster.addr, f"kill-new-{i}") for i in range(4)))
            try:
                assert {p.upstream for p in fresh} <= live_addrs(cluster)
                for p in fresh:
                    assert (await p.client.next_chunk(credit=False)).chunk_index == 0
            finally:
                await asyncio.gather(*(p.stop() for p in fresh))
        finally:
            await asyncio.gather(*(p.stop() for p in players))

    run(main())


def test_drained_replica_moves_no_session_and_loses_no_chunk(cluster: Deployment):
    async def main() -> None:
        players = await _players_on_every_replica(cluster, "drain", 9)
        try:
            await asyncio.gather(*(p.until(2) for p in players))
            victim = _victim(cluster, players)
            mine = [p for p in players if p.upstream == victim.addr]
            others = [p for p in players if p.upstream != victim.addr]
            held = await settled(players, live_addrs(cluster))
            del held[victim.addr]
            victim.drain()
            # Its sessions end with 1001 after their last committed chunk: the replica's
            # log names how many it committed, and each client got exactly those, in order.
            for p in mine:
                assert await p.closed() == CLOSE_GOING_AWAY
            # A drained server has done its job: it exits 0 (realtime/server/server.py).
            assert await asyncio.to_thread(victim.wait, 30.0) == 0
            log = victim.log_text()
            assert "Application shutdown complete" in log
            for p in mine:
                committed = int(re.search(rf"session {p.session_id}: drained after (\d+) committed chunks",
                                          log).group(1))
                assert p.indexes == list(range(committed)), p.session_id
            assert "Traceback" not in log
            # The other replicas' sessions stay where they are and keep streaming in order.
            await asyncio.gather(*(p.until(3) for p in others))
            for p in others:
                assert p.indexes == list(range(len(p.indexes))) and p.client.ws.close_code is None
            await settled(others, set(held), timeout_s=0)
            # New sessions, the drained replica's ids too, land on the replicas still serving.
            fresh = await asyncio.gather(*(join(cluster.addr, p.session_id) for p in mine))
            try:
                assert {p.upstream for p in fresh} <= set(held)
            finally:
                await asyncio.gather(*(p.stop() for p in fresh))
        finally:
            await asyncio.gather(*(p.stop() for p in players))

    run(main())


def test_a_replica_that_cannot_start_stops_the_rest(tmp_path):
    deployment = Deployment(2, serve_args=["--max-batch", "many"], log_dir=tmp_path)
    with pytest.raises(RuntimeError, match="exited while starting"):
        deployment.start()
    assert not any(r.alive for r in deployment.replicas)
    assert deployment.nginx.proc is None
