"""A model that fails mid-tick for one session, in a real server process: a plain
exception and a real ``torch.OutOfMemoryError`` inside the forward."""

from __future__ import annotations

import asyncio

import pytest

from clients.world import WorldClient


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


@pytest.mark.parametrize("fault,code", [("raise", "model_error"), ("oom", "out_of_memory")])
def test_one_session_fails_others_tick_and_reset_recovers(fault_server, fault, code):
    url = f"ws://{fault_server.addr}/v1/realtime/world"
    bad_id = f"{fault}-at-3-a"

    async def main() -> None:
        async with WorldClient.connect(url) as bad, WorldClient.connect(url) as good:
            await bad.create(bad_id, credits=0, seed=1, format="rgb8")
            await good.create("good", credits=0, seed=2, format="rgb8")
            acked = [(await bad.hold_keys(["W"]))["event_id"]]
            await bad.credit(8)
            await good.credit(4)
            chunks = [await bad.next_chunk(credit=False) for _ in range(3)]
            # Committed chunks 0..2 stand, the event applied at chunk 0 stays applied.
            assert [c.chunk_index for c in chunks] == [0, 1, 2]
            assert chunks[0].applied_event_ids == acked
            error = await bad.expect("error")
            assert error["code"] == "session_failed"
            assert error["pending_event_ids"] == []
            # The other session keeps ticking after the failure, in order.
            got = [(await good.next_chunk()).chunk_index for _ in range(8)]
            assert got == list(range(8))
            assert bad.chunks.empty()
            assert (await bad.reset())["type"] == "session.reset"
            await bad.credit(4)
            assert [(await bad.next_chunk(credit=False)).chunk_index for _ in range(4)] == [0, 1, 2, 3]
            assert (await good.next_chunk()).chunk_index == 8
            await bad.close()
            await good.close()

    run(main())
    assert fault_server.sample("realtime_tick_failures_total", model="maze", code=code) == 1
    assert fault_server.sample("realtime_engine_healthy") == 1
    # Every KV block back: the failed forward's scratch pages and both sessions' pages.
    assert fault_server.sample("realtime_kv_blocks", model="maze", state="used") == 0
    assert fault_server.sample("realtime_kv_sessions", model="maze", residency="resident") == 0
    assert "Traceback" not in fault_server.log_text()
