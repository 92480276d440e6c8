"""DreamZero's K/V in kv/'s pool: the geometry and its figures, the state, and sampling over the pool
equal to sampling over plain K/V tensors (two sessions as rows of one forward included, at one
window position and at different ones)."""

from __future__ import annotations

import pytest
import torch

from kv import PagedKVCache, session_bytes
from kv.capacity import required_bytes
from models.policy.dreamzero.cache import BRANCHES, PagedRows, SessionState, cross_rows, kv_geometry, state_bytes
from models.policy.dreamzero.config import DROID, TINY
from models.policy.dreamzero.denoise import Branch, denoise_chunk, write_frames
from models.policy.dreamzero.window import plan_call

H = W = 4      # latent 4x4: 4 tokens a frame at patch 2x2


def test_droid_geometry_and_its_figures():
    g = kv_geometry(DROID, (44, 80), image_tokens=257, dtype=torch.bfloat16)
    assert (g.tokens_per_frame, g.block_size, g.sink_frames, g.window_frames, g.frames_per_tick) == (880, 880, 1, 6, 2)
    assert g.branches == BRANCHES and not g.worker_slot and g.page_bytes == 720_896_000
    # Cross K/V: 2 branches x 40 layers x (K, V) x (512 + 257) tokens x 5120 x 2 bytes; y: 20 x 9 x 44 x 80 float32.
    assert g.model_state_bytes == 2 * 40 * 2 * 769 * 5120 * 2 + 20 * 9 * 44 * 80 * 4 == 1_262_464_000
    assert session_bytes(g) == 2 * 7 * 720_896_000 + 1_262_464_000 == 11_355_008_000
    assert required_bytes(g, 1) == 15_680_384_000


def test_the_window_walk_fits_sink_and_window(tiny):
    cfg = tiny.config
    g = kv_geometry(cfg, (H, W), image_tokens=5, dtype=torch.float32)
    held, start = 0, 0
    for call in range(7):
        plan = plan_call(start, cfg)
        held = len(plan.write) if plan.restart else held + len(plan.write)
        # What a call attends (held + its denoised chunk) is the model's window at most.
        assert held <= g.sink_frames + g.window_frames and held + len(plan.denoise) <= cfg.local_attn_size
        start = plan.next_start


def _inputs(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return {"text": r(1, cfg.text_len, cfg.text_dim), "negative": r(1, cfg.text_len, cfg.text_dim),
            "image": r(1, 5, cfg.image_dim), "frames": r(1, cfg.out_dim, 3, H, W),
            "y": r(1, cfg.in_dim - cfg.out_dim, 5, H, W), "noise": r(1, cfg.out_dim, 2, H, W),
            "actions": r(1, cfg.action_horizon, cfg.action_dim), "state": r(1, 1, cfg.max_state_dim)}


def _state(dit, x) -> SessionState:
    return SessionState.build([dit.encode_context(x["text"], x["image"]),
                               dit.encode_context(x["negative"], x["image"])], x["y"])


@torch.no_grad()
def _plain(dit, x):
    """Two calls (frame 0, then frames 1-2) over plain K/V tensors: the chunk of the second call."""
    s = _state(dit, x)
    branches = [Branch(None, s.cross(b)) for b in (0, 1)]
    branches = write_frames(dit, branches, x["frames"][:, :, :1], x["y"][:, :, :1], 0)
    branches = write_frames(dit, branches, x["frames"][:, :, 1:3], x["y"][:, :, 1:3], 1)
    return branches, denoise_chunk(dit, branches, x["noise"], x["actions"], x["state"], x["y"][:, :, 3:5], 3,
                                   steps=2)


@torch.no_grad()
def test_two_sessions_over_the_pool_equal_each_over_plain_kv(tiny):
    dit, cfg = tiny.dit, tiny.config
    xs = [_inputs(cfg, seed) for seed in (0, 1)]
    want = [_plain(dit, x) for x in xs]
    g = kv_geometry(cfg, (H, W), image_tokens=5, dtype=torch.float32)
    # The adapter's y holds condition_latents frames (3 at TINY); these inputs carry 5.
    real = SessionState(_state(dit, xs[0]).tensors[:4] + (xs[0]["y"][:, :, :cfg.condition_latents],))
    assert g.model_state_bytes == state_bytes(cfg, 5, (H, W), torch.float32) == real.nbytes
    cache = PagedKVCache(g, 40, max_sessions=2, attention_backend="gather_sdpa")
    ids = ["a", "b"]
    for sid in ids:
        cache.open(sid)
    states = [_state(dit, x) for x in xs]
    branches = [Branch(None, cross_rows(states, b)) for b in (0, 1)]

    def cat(key, sl):
        return torch.cat([x[key][:, :, sl] for x in xs])
    # A call's passes share its batch: the t = 0 pass writes the chunk, the denoising passes
    # attend it (the first call's denoising is left out: the plain path has none).
    batch = cache.begin_batch(ids, frames=1, restart=True)
    write_frames(dit, branches, cat("frames", slice(0, 1)), cat("y", slice(0, 1)), 0,
                 paged=PagedRows(cache, batch, write=True))
    cache.commit_batch(batch)
    batch = cache.begin_batch(ids, frames=2)
    write_frames(dit, branches, cat("frames", slice(1, 3)), cat("y", slice(1, 3)), 1,
                 paged=PagedRows(cache, batch, write=True))
    video, actions = denoise_chunk(dit, branches, torch.cat([x["noise"] for x in xs]),
                                   torch.cat([x["actions"] for x in xs]), torch.cat([x["state"] for x in xs]),
                                   cat("y", slice(3, 5)), 3, steps=2, paged=PagedRows(cache, batch, write=False))
    cache.commit_batch(batch)
    # The pool holds each session's K/V as the plain path built them, branch by branch.
    for i, sid in enumerate(ids):
        for b, name in enumerate(BRANCHES):
            blocks = cache.table(sid, name).held
            for layer in range(cfg.num_layers):
                k, v = want[i][0][b].kv[layer]
                assert torch.equal(cache.storage.k[layer][blocks].reshape(k.shape[1:]), k[0])
                assert torch.equal(cache.storage.v[layer][blocks].reshape(v.shape[1:]), v[0])
    for i in range(2):
        # Two sessions are rows of one forward here (one each on the plain path): float32 rounding.
        torch.testing.assert_close(video[i:i + 1], want[i][1][0], rtol=0, atol=2e-6)
        torch.testing.assert_close(actions[i:i + 1], want[i][1][1], rtol=0, atol=2e-6)


@torch.no_grad()
def _plain_first(dit, x):
    """A session's first call over plain K/V tensors: frame 0, then the chunk of frames 1-2."""
    s = _state(dit, x)
    branches = write_frames(dit, [Branch(None, s.cross(b)) for b in (0, 1)], x["frames"][:, :, :1],
                            x["y"][:, :, :1], 0)
    return denoise_chunk(dit, branches, x["noise"], x["actions"], x["state"], x["y"][:, :, 1:3], 1, steps=2)


@torch.no_grad()
def test_sessions_at_different_window_positions_share_the_denoising_forward(tiny):
    # a's second call (writes frames 1-2, denoises 3-4) and b's first (writes frame 0, denoises
    # 1-2): two kv batches (a chunk of 2 frames, a restart of 1) and two t = 0 passes, then one
    # denoising forward of 4 rows, each with its own RoPE offset, pages and y.
    dit, cfg = tiny.dit, tiny.config
    xa, xb = _inputs(cfg, 0), _inputs(cfg, 1)
    want_a, want_b = _plain(dit, xa)[1], _plain_first(dit, xb)
    g = kv_geometry(cfg, (H, W), image_tokens=5, dtype=torch.float32)
    cache = PagedKVCache(g, 40, max_sessions=2, attention_backend="gather_sdpa")
    for sid in "ab":
        cache.open(sid)
    sa, sb = _state(dit, xa), _state(dit, xb)
    batch = cache.begin_batch(["a"], frames=1, restart=True)
    write_frames(dit, [Branch(None, sa.cross(b)) for b in (0, 1)], xa["frames"][:, :, :1], xa["y"][:, :, :1], 0,
                 paged=PagedRows(cache, batch, write=True))
    cache.commit_batch(batch)
    # b's batch first: its rows come first in the forward, a's kv rows are model rows 1 and 3.
    first = cache.begin_batch(["b"], frames=1, restart=True)
    write_frames(dit, [Branch(None, sb.cross(b)) for b in (0, 1)], xb["frames"][:, :, :1], xb["y"][:, :, :1], 0,
                 paged=PagedRows(cache, first, write=True))
    going = cache.begin_batch(["a"], frames=2)
    write_frames(dit, [Branch(None, sa.cross(b)) for b in (0, 1)], xa["frames"][:, :, 1:3], xa["y"][:, :, 1:3],
                 torch.tensor([1]), paged=PagedRows(cache, going, write=True))
    assert (first.num_pages, going.num_pages) == ((1, 1), (3, 3))
    rows = []
    hook = dit.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[0]))
    try:
        video, actions = denoise_chunk(
            dit, [Branch(None, cross_rows([sb, sa], b)) for b in (0, 1)], torch.cat([xb["noise"], xa["noise"]]),
            torch.cat([xb["actions"], xa["actions"]]), torch.cat([xb["state"], xa["state"]]),
            torch.cat([xb["y"][:, :, 1:3], xa["y"][:, :, 3:5]]), torch.tensor([1, 3]), steps=2,
            paged=PagedRows(cache, [first, going], write=False))
    finally:
        hook.remove()
    assert rows == [4, 4]                            # 2 steps, each one forward of 2 sessions x 2 branches
    for i, (v, a) in enumerate((want_b, want_a)):
        torch.testing.assert_close(video[i:i + 1], v, rtol=0, atol=2e-6)
        torch.testing.assert_close(actions[i:i + 1], a, rtol=0, atol=2e-6)
    assert not torch.allclose(actions[0], actions[1])


def test_paged_rows_take_one_batch_to_write():
    g = kv_geometry(TINY, (H, W), image_tokens=5, dtype=torch.float32)
    cache = PagedKVCache(g, 40, max_sessions=2, attention_backend="gather_sdpa")
    for sid in "ab":
        cache.open(sid)
    batches = [cache.begin_batch(["a"], frames=1, restart=True), cache.begin_batch(["b"], frames=2)]
    with pytest.raises(ValueError, match="a t = 0 pass writes one kv batch"):
        PagedRows(cache, batches, write=True)
    with pytest.raises(ValueError, match="got 0"):
        PagedRows(cache, [], write=False)


@torch.no_grad()
def test_a_state_moves_to_the_host_and_back_bit_exactly(tiny):
    s = _state(tiny.dit, _inputs(tiny.config, 2))
    before = [t.clone() for t in s.tensors]
    s.to_host()
    s.to_device("cpu")
    assert all(torch.equal(a, b) for a, b in zip(before, s.tensors))
    assert torch.equal(s.cross(1)[0].k_img, before[2][1, 0][None]) and torch.equal(s.y, before[4])
    s.free()
    assert s.nbytes == 0
