"""The served path on the tiny checkpoint root: sessions batched in one forward on kv/ pages,
reset, swap to the host and back, close, admission, and the paged attention against the plain
caches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kv.capacity import format_bytes, session_bytes
from models.world.matrix_game.checkpoint import load_clip, load_vae, load_variant, variant_folder
from models.world.matrix_game.config import FRAMES_PER_BLOCK
from models.world.matrix_game.denoise import denoise_block
from models.world.matrix_game.model import RowInput, empty_kv
from models.world.matrix_game.pipeline import BlockRequest, MatrixGamePipeline, NoCapacity, default_image
from models.world.matrix_game.tiny_checkpoint import write_tiny_root
from models.world.matrix_game.window import block_windows
from models.world.noise import int64_bits, normal

HEIGHT, WIDTH = 32, 64


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_tiny_root(tmp_path_factory.mktemp("matrix_game_root"))


@pytest.fixture(scope="module")
def parts(root):
    return {v: (*load_variant(variant_folder(root, v)), load_vae(root), load_clip(root))
            for v in ("universal", "templerun")}


def pipeline(parts, sessions: int = 4, variant: str = "universal", **kw) -> MatrixGamePipeline:
    dit, var, vae, clip = parts[variant]
    return MatrixGamePipeline(dit, var, vae, clip, height=HEIGHT, width=WIDTH, max_sessions=sessions, **kw)


def actions(sid: str, block: int, T: int, keys: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct actions per session and block (a function of both only)."""
    g = torch.Generator().manual_seed(hash((sid, block)) % (1 << 31))
    kb = (torch.rand(T, keys, generator=g) > 0.5).float()
    return kb, 0.2 * torch.rand(T, 2, generator=g) - 0.1


def request(p: MatrixGamePipeline, sid: str, block: int) -> BlockRequest:
    kb, ms = actions(sid, block, p.frames_in_block(sid), p.cfg.action.keyboard_dim_in)
    return BlockRequest(sid, kb, ms if p.cfg.action.enable_mouse else None)


def run_alone(p: MatrixGamePipeline, sid: str, seed: int, blocks: int) -> list[np.ndarray]:
    p.open(sid, seed=seed)
    return [p.generate([request(p, sid, b)])[0] for b in range(blocks)]


def test_a_session_alone_equals_it_among_others_at_other_positions(parts):
    alone = run_alone(pipeline(parts), "a", 7, 3)
    p = pipeline(parts)
    p.open("b", seed=8)
    p.generate([request(p, "b", 0)])                     # b is a block ahead of a
    p.open("a", seed=7)
    p.open("c", seed=9)
    got = []
    for blk in range(3):
        reqs = [request(p, "a", blk), request(p, "b", blk + 1), request(p, "c", blk)]
        got.append(p.generate(reqs)[0])
    assert [f.shape for f in got] == [(9, HEIGHT, WIDTH, 3), (12, HEIGHT, WIDTH, 3), (12, HEIGHT, WIDTH, 3)]
    for a, b in zip(alone, got):
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1


def test_actions_change_frames(parts):
    p = pipeline(parts)
    p.open("x", seed=1)
    p.open("y", seed=1)
    T = p.frames_in_block("x")
    still = BlockRequest("x", torch.zeros(T, 4), torch.zeros(T, 2))
    moving = BlockRequest("y", torch.tensor([[1.0, 0, 0, 0]]).repeat(T, 1), torch.full((T, 2), 0.1))
    a, b = p.generate([still, moving])
    assert np.abs(a.astype(int) - b.astype(int)).max() > 0


def test_reset_replays_the_same_frames(parts):
    p = pipeline(parts)
    first = run_alone(p, "a", 3, 2)
    p.reset("a")
    again = [p.generate([request(p, "a", b)])[0] for b in range(2)]
    for x, y in zip(first, again):
        np.testing.assert_array_equal(x, y)


def test_swap_to_host_and_back_is_bit_exact(parts):
    ref = {sid: run_alone(pipeline(parts), sid, seed, 3) for sid, seed in (("a", 1), ("b", 2))}
    p = pipeline(parts, sessions=1)                       # one resident session: every tick swaps
    p.open("a", seed=1)
    p.open("b", seed=2)
    got = {"a": [], "b": []}
    for blk in range(3):
        for sid in ("a", "b"):
            got[sid].append(p.generate([request(p, sid, blk)])[0])
    assert p.residency.metrics()["swap_outs"] >= 4
    for sid in ref:
        for x, y in zip(ref[sid], got[sid]):
            np.testing.assert_array_equal(x, y)


def test_close_frees_pages_slots_and_state(parts):
    p = pipeline(parts, sessions=2)
    free = p.cache.num_free_blocks
    p.open("a", seed=1)
    state = p._state("a")
    p.generate([request(p, "a", 0)])
    assert p.cache.num_free_blocks < free
    p.close("a")
    assert p.cache.num_free_blocks == free and "a" not in p.sessions and "a" not in p.cache
    assert state.nbytes == 0
    p.close("a")                                          # idempotent


def test_a_failed_block_commits_nothing_and_a_dropped_one_closes_the_world(parts):
    p = pipeline(parts)
    p.open("a", seed=1)
    bad = BlockRequest("a", torch.zeros(5, 4), torch.zeros(5, 2))
    with pytest.raises(ValueError, match="keyboard must be"):
        p.run([bad])
    assert p.at_start("a") and p.cache.committed_frames("a") == 0
    p.run([request(p, "a", 0)])
    p.end("a", committed=False)
    assert "a" not in p.sessions


def test_no_room_is_a_refusal_that_changes_nothing(parts):
    p = pipeline(parts, sessions=1, host_budget_bytes=0)
    p.open("a", seed=1)
    p.run([request(p, "a", 0)])
    with pytest.raises(NoCapacity):
        p.open("b", seed=2)                               # a is in flight: nothing to swap out
    p.end("a", committed=True)
    assert p.sessions["a"].blocks == 1 and "b" not in p.sessions


def test_temple_run_has_no_mouse_and_seven_keys(parts):
    p = pipeline(parts, variant="templerun")
    p.open("t", seed=1)
    T = p.frames_in_block("t")
    (frames,) = p.generate([BlockRequest("t", torch.eye(7)[torch.arange(T) % 7])])
    assert frames.shape == (9, HEIGHT, WIDTH, 3)
    with pytest.raises(ValueError, match="keyboard must be"):
        p.run([BlockRequest("t", torch.zeros(12, 4))])


def test_paged_blocks_equal_the_plain_caches(parts):
    """Three blocks of one session on kv/ pages and action state against ``denoise_block`` over
    ``SessionKV`` with the same condition, CLIP K/V, action windows and noise."""
    dit, var, vae, clip = parts["universal"]
    p = pipeline(parts)
    p.open("a", seed=5)
    s = p.sessions["a"]
    pixels = torch.from_numpy(default_image(5, HEIGHT, WIDTH)).permute(2, 0, 1).float() / 127.5 - 1
    cross = dit.project_image(clip.encode(pixels[None])[0])
    h, w = p.latent_hw
    kv = empty_kv(dit.config, p.tokens_per_frame)
    keys, mouse = [], []
    plain, served = [], []
    decode = p.decoder.new_state(1, h, w, "cpu")
    mean, std = p._stats(torch.zeros(1))
    for blk in range(3):
        req = request(p, "a", blk)
        keys.append(req.keyboard)
        mouse.append(req.mouse)
        served.append(p.generate([req])[0])
        start = blk * FRAMES_PER_BLOCK
        kh, mh = torch.cat(keys), torch.cat(mouse)
        row = RowInput(start, kv, cross, block_windows(kh, start, 3, 12, 4), block_windows(mh, start, 3, 12, 4))
        cond = s.condition[:, [min(f, s.condition.shape[1] - 1) for f in range(start, start + 3)]][None]
        seeds = torch.tensor([int64_bits(5)])
        noise = torch.stack([normal(seeds, torch.tensor([blk * len(var.steps) + i]), (16, 3, h, w))
                             for i in range(len(var.steps))])
        res = denoise_block(dit, cond, [row], noise, var.steps)
        kv = res.caches[0]
        video = p.decoder.decode(decode, res.latents * std + mean)[0]
        plain.append(((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0).numpy())
    for x, y in zip(plain, served):
        assert np.abs(x.astype(int) - y.astype(int)).max() <= 1


def test_the_taehv_decoder_streams_and_swaps_like_the_wan_vae(parts, tmp_path):
    from models.world.taehv import load_taehv, random_state_dict

    torch.save(random_state_dict(seed=0), tmp_path / "taew2_1.pth")
    taehv = load_taehv(tmp_path / "taew2_1.pth")
    ref = run_alone(pipeline(parts, taehv=taehv), "a", 1, 2)
    assert [f.shape for f in ref] == [(9, HEIGHT, WIDTH, 3), (12, HEIGHT, WIDTH, 3)]
    wan = run_alone(pipeline(parts), "a", 1, 1)
    assert np.abs(wan[0].astype(int) - ref[0].astype(int)).max() > 0
    p = pipeline(parts, sessions=1, taehv=taehv)
    assert p.decoder_name == "taehv"
    p.open("a", seed=1)
    p.open("b", seed=2)
    got = []
    for blk in range(2):
        got.append(p.generate([request(p, "a", blk)])[0])
        p.generate([request(p, "b", blk)])
    for x, y in zip(ref, got):
        np.testing.assert_array_equal(x, y)


def test_options_name_what_they_refuse():
    from models.world.matrix_game.options import MatrixGameOptions, OptionError, parse_options

    assert parse_options([]) == MatrixGameOptions()
    assert parse_options([("variant", "gta"), ("decoder", "taehv:/w/t.pth")]) == \
        MatrixGameOptions("gta_drive", "/w/t.pth")
    assert parse_options([("variant", "templerun"), ("decoder", "wan")]) == MatrixGameOptions("templerun")
    for pairs, text in (([("variant", "minecraft")], "variant=minecraft"), ([("steps", "2")], "unknown option 'steps'"),
                        ([("decoder", "taehv")], "decoder=taehv"), ([("decoder", "wan:/x")], "decoder=wan:/x")):
        with pytest.raises(OptionError, match=text):
            parse_options(pairs)


def test_the_factory_checks_options_before_loading(root):
    from models import factory
    from models.factory import BuildOptions, FactoryError, ModelEntry

    with pytest.raises((FactoryError, ValueError), match="variant=minecraft"):
        factory.validate(factory.parse_entry(f"matrix-game={root}?variant=minecraft"))
    with pytest.raises((FactoryError, ValueError), match="no such file"):
        factory.build(ModelEntry("matrix-game", str(root), (("decoder", "taehv:/nope.pth"),)),
                      BuildOptions(height=HEIGHT, width=WIDTH), kind="world")
    w = factory.build(ModelEntry("matrix-game", str(root), (("variant", "templerun"),)),
                      BuildOptions(height=HEIGHT, width=WIDTH, max_batch=2), kind="world")
    assert (w.variant, w.control_schemas, w.describe()["decoder"]) == ("templerun", ("keys.v1",), "wan")


def test_an_evicted_session_is_dropped_and_replays_from_its_start(parts):
    ref = run_alone(pipeline(parts), "a", 1, 2)
    p = pipeline(parts, sessions=1, host_budget_bytes=0)   # no room on the host: eviction drops
    dropped = []
    p.on_drop = dropped.append
    first = run_alone(p, "a", 1, 1)
    p.open("b", seed=2)                                     # a is idle: dropped to make room
    assert dropped == ["a"] and "a" not in p.sessions and "a" not in p.cache
    with pytest.raises(ValueError, match="not open"):
        p.run([request(p, "b", 0), BlockRequest("a", torch.zeros(12, 4), torch.zeros(12, 2))])
    assert p.at_start("b")                                  # the refused batch changed nothing
    p.close("b")
    again = run_alone(p, "a", 1, 2)
    np.testing.assert_array_equal(first[0], ref[0])
    for x, y in zip(ref, again):
        np.testing.assert_array_equal(x, y)


def test_admission_counts_every_session_at_its_most_and_a_refusal_changes_nothing(parts):
    p = pipeline(parts, sessions=1, host_budget_bytes=0)
    assert p.admit("a") is None and p.admit("a") is None     # admitting twice is one admission
    assert p.admit("b") == (
        f"no room for a new session: it needs {format_bytes(session_bytes(p.geometry))} of KV memory; "
        f"free: 0 B on the device (1 session held, 1 resident slot) and 0 B of the 0 B host swap budget "
        "(each session counted at its most)")
    run_alone(p, "a", 1, 1)
    before = (p.cache.num_free_blocks, dict(p.residency.metrics()), p.sessions["a"])
    assert p.admit("b") is not None
    assert (p.cache.num_free_blocks, dict(p.residency.metrics()), p.sessions["a"]) == before
    assert "b" not in p.sessions and "b" not in p.cache
    p.close("a")                                              # a closed: b fits
    assert p.admit("b") is None

    # One session's room on the host: a resident, b swapped in and out, c refused; none dropped.
    need = session_bytes(p.geometry)
    p = pipeline(parts, sessions=1, host_budget_bytes=need)
    dropped = []
    p.on_drop = dropped.append
    assert p.admit("a") is None and p.admit("b") is None
    assert "(2 sessions held, 1 resident slot)" in p.admit("c")
    p.open("a", seed=1)
    p.open("b", seed=2)                                       # a idle: swapped to the host, kept
    for blk in range(2):
        for sid in ("a", "b"):
            p.generate([request(p, sid, blk)])
    assert dropped == [] and p.residency.is_swapped("a") and p.admit("c") is not None
    p.close("b")
    assert p.admit("c") is None


def test_a_batch_decodes_in_one_call_and_streams_every_rows_frames_first_frames_first(parts):
    """Three sessions, one at its first block (9 frames) and two at later ones (12): one decoder
    call for the batch; every row's frames go to its on_frame in order, a latent frame's frames
    of every row before the next latent frame's, and they are the block ``generate`` returns."""
    alone = {sid: run_alone(pipeline(parts), sid, seed, blocks)[-1]
             for sid, seed, blocks in (("a", 1, 1), ("b", 2, 2), ("c", 3, 3))}
    p = pipeline(parts)
    for sid, seed in (("a", 1), ("b", 2), ("c", 3)):
        p.open(sid, seed=seed)
    p.generate([request(p, "c", 0), request(p, "b", 0)])
    p.generate([request(p, "c", 1)])
    calls, sent = [], []
    real = p.decoder.frames_batch
    p.decoder.frames_batch = lambda states, z: calls.append(len(states)) or real(states, z)
    reqs = []
    for sid, block in (("a", 0), ("b", 1), ("c", 2)):
        r = request(p, sid, block)
        reqs.append(BlockRequest(sid, r.keyboard, r.mouse, on_frame=lambda i, px, sid=sid: sent.append((sid, i, px))))
    out = dict(zip("abc", p.generate(reqs)))
    assert calls == [3]
    for sid in "abc":
        mine = [(i, px) for s, i, px in sent if s == sid]
        assert [i for i, _ in mine] == list(range(len(out[sid])))
        np.testing.assert_array_equal(np.concatenate([px for _, px in mine]), out[sid])
        assert np.abs(out[sid].astype(int) - alone[sid].astype(int)).max() <= 1
    # The latent frame each frame comes from (a first block: 1 frame, then 4 a latent frame).
    latent = [(0 if i == 0 else (i - 1) // 4 + 1) if s == "a" else i // 4 for s, i, _ in sent]
    assert latent == sorted(latent) and len(sent) == 9 + 12 + 12
