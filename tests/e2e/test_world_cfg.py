"""The two-branch CFG world (cfg-tiny) through a real server: create options, s = 1, swap, busy."""

from __future__ import annotations

import asyncio

import numpy as np

from clients.world import WorldClient
from kv.capacity import required_bytes
from models.world.cfg import CFGWorldConfig, CFGWorldCore
from models.world.cfg.adapter import CFGWorld, to_image
from realtime.server.app import build_app
from realtime.server.config import PolicyConfig, ServerConfig, TTSConfig, WorldConfig
from realtime.server.inventory import Inventory, build_inventory
from tests.e2e.conftest import serve

PROMPT = "a red door"


def cfg_app(**kw):
    model = CFGWorld(max_batch=1, **kw)  # batches of one: each session's frames are its own, bit for bit
    inventory = Inventory()
    inventory.adapters[model.name] = model
    config = ServerConfig(world=WorldConfig(models=(model.name,)), policy=PolicyConfig(policy=""),
                          tts=TTSConfig(enabled=False))
    return build_app(config, inventory), model


def reference(negative: str, scale: float, steps: int, *, branch: str = "guided") -> list[np.ndarray]:
    """The session's frames from a core of its own (seed 0, as the adapter's), never swapped."""
    core = CFGWorldCore(seed=0)
    core.open("ref", PROMPT, negative, guidance_scale=scale)
    return [to_image(getattr(core.step(["ref"])["ref"], branch)) for _ in range(steps)]


def url(addr: str) -> str:
    return f"ws://{addr}/v1/realtime/world"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


async def frames_of(client: WorldClient, n: int, first: int = 0) -> list[np.ndarray]:
    chunks = [await client.next_chunk(credit=False) for _ in range(n)]
    assert [c.chunk_index for c in chunks] == list(range(first, first + n))
    return [f for c in chunks for f in c.frames()]


def test_scale_one_is_the_positive_branch_alone_and_options_are_checked():
    app, model = cfg_app()
    with serve(app) as addr:
        async def main():
            async with WorldClient.connect(url(addr)) as c:
                for options, text in (({"guidance_scale": 25}, "option guidance_scale must be a number in [0.0, 20.0]"),
                                      ({"steps": 2}, "world cfg-tiny does not take option(s) steps"),
                                      ({"negative_prompt": 3}, "option negative_prompt must be a string")):
                    await c.send({"type": "session.create", "session_id": "x", "options": options})
                    err = await c.expect("error")
                    assert err["code"] == "bad_request" and text in err["message"], err
                assert app.state.live_sessions.sessions() == [] and model.core.cache.num_resident == 0
            served = {}
            for sid, negative, scale in (("one", "blurry", 1.0), ("other-neg", "dark and noisy", 1.0),
                                         ("four", "blurry", 4.0)):
                async with WorldClient.connect(url(addr)) as c:
                    await c.create(sid, prompt=PROMPT, credits=3, format="rgb8",
                                   options={"guidance_scale": scale, "negative_prompt": negative})
                    served[sid] = await frames_of(c, 3)
                    await c.close()
            positive = reference("blurry", 1.0, 3, branch="positive")
            assert all(np.array_equal(a, b) for a, b in zip(served["one"], positive))
            # s = 1 ignores the negative branch entirely: another negative prompt, the same frames.
            assert all(np.array_equal(a, b) for a, b in zip(served["other-neg"], positive))
            assert all(np.array_equal(a, b) for a, b in zip(served["four"], reference("blurry", 4.0, 3)))
            assert not np.array_equal(served["four"][1], served["one"][1])

        run(main())


def test_lru_swap_moves_both_branches_and_the_state_bit_exactly():
    g = CFGWorldConfig().geometry()
    app, model = cfg_app(budget_bytes=required_bytes(g, 1, ticks_in_flight=1))  # room for one resident session
    assert model.plan.capacity == 1 and model.core.cache.pool.num_blocks == model.plan.num_blocks
    with serve(app) as addr:
        async def main():
            async with WorldClient.connect(url(addr)) as a, WorldClient.connect(url(addr)) as b:
                opts = {"guidance_scale": 3.0, "negative_prompt": "blurry"}
                await a.create("a", prompt=PROMPT, credits=2, format="rgb8", options=opts)
                got_a = await frames_of(a, 2)
                await b.create("b", prompt=PROMPT, credits=2, format="rgb8", options=opts)
                assert model.core.residency.is_swapped("a")
                m = model.core.residency.metrics()
                # Both branches' 2 committed frames' pages and the guided-frame state went to the host.
                assert m["swap_outs"] == 1 and m["swap_out_bytes"] == 2 * 2 * g.page_bytes + g.model_state_bytes
                got_b = await frames_of(b, 2)
                await a.credit(2)
                got_a += await frames_of(a, 2, first=2)
                assert model.core.residency.is_swapped("b") and model.core.residency.metrics()["swap_ins"] == 1
                want = reference("blurry", 3.0, 4)
                assert all(np.array_equal(x, y) for x, y in zip(got_a, want))
                assert all(np.array_equal(x, y) for x, y in zip(got_b, want[:2]))
                assert a.errors == [] and b.errors == []

        run(main())


def test_a_session_that_cannot_fit_is_busy_and_names_need_and_free():
    g = CFGWorldConfig().geometry()
    app, model = cfg_app(budget_bytes=required_bytes(g, 1, ticks_in_flight=1), host_budget_bytes=0)
    with serve(app) as addr:
        async def main():
            async with WorldClient.connect(url(addr)) as a, WorldClient.connect(url(addr)) as b:
                await a.create("a", prompt=PROMPT, credits=1, format="rgb8")
                await frames_of(a, 1)
                await b.send({"type": "session.create", "session_id": "b", "options": {"guidance_scale": 2}})
                err = await b.expect("error")
                per_session = required_bytes(g, 2) - required_bytes(g, 1)
                assert err == {"type": "error", "code": "busy", "message":
                               f"no room for a new session: it needs {per_session / 1024:.3g} KiB of KV memory; "
                               "free: 0 B on the device (1 session held, 1 resident slot) and 0 B of the "
                               "0 B host swap budget (each session counted at its most)"}
                assert model.core.cache.session_ids == ["a"] and not model.core.residency.is_swapped("a")
                await a.credit(1)
                await frames_of(a, 1, first=1)  # the resident session is untouched

        run(main())


def test_cli_budget_sizes_the_pool_and_a_real_server_refuses_with_busy():
    from realtime.server.cli import config_from_args, parse_args

    g = CFGWorldConfig().geometry()
    two = required_bytes(g, 2, ticks_in_flight=1)
    args = parse_args(["serve", "--models", "cfg-tiny", "--max-batch", "1", "--no-tts", "--policy", "",
                       "--kv-budget-gib", repr(two / (1 << 30)), "--kv-host-gib", "0"])
    config = config_from_args(args)
    app = build_app(config, build_inventory(config))  # the registry and the factory build the model
    model = app.state.inventory.adapters["cfg-tiny"]
    assert (model.plan.capacity, model.plan.required_bytes) == (2, two)
    with serve(app) as addr:
        async def main():
            clients = [WorldClient.connect(url(addr)) for _ in range(3)]
            async with clients[0] as a, clients[1] as b, clients[2] as c:
                await a.create("a", credits=1)
                await b.create("b", credits=1)
                await c.send({"type": "session.create", "session_id": "c"})
                err = await c.expect("error")
                assert err["code"] == "busy" and "(2 sessions held, 2 resident slots)" in err["message"]
                assert [(await x.next_chunk(credit=False)).chunk_index for x in (a, b)] == [0, 0]

        run(main())
