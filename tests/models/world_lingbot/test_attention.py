"""One block through kv/: chunk-causal attention, sink + window, text K/V, transient forwards.

The paged path is checked against a dense reference that keeps every frame's K/V
in lists and picks the sink and the recent frames itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models.world.lingbot.attention import BlockKV, write_text
from models.world.lingbot.cache import kv_geometry, make_cache
from models.world.lingbot.config import CAMERA_CHANNELS
from models.world.lingbot.transformer import CausalLingBotWorldTransformer3DModel
from tests.models.world_lingbot.conftest import TINY

H = W = 4          # latent grid: 2x2 patches = 4 tokens per frame
TEXT = 5           # text tokens
FB = TINY.num_frames_per_block


class DenseKV:
    """Reference: every committed frame's K/V in lists; attends sink + recent + block."""

    def __init__(self, cfg, text_kv):
        self.cfg, self.text = cfg, text_kv
        self.frames: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(cfg.num_layers)]
        self.pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def n(self):
        return len(self.frames[0])

    start_frames = property(lambda self: (self.n,))
    rows = 1

    def self_attention(self, layer, q, k, v, update_cache):
        sink, rolling, n = self.cfg.sink_size, self.cfg.rolling_frames, self.n
        kept = list(range(min(sink, n))) + list(range(max(sink, n - rolling), n))
        ks = [self.frames[layer][i][0] for i in kept] + [k[0]]
        vs = [self.frames[layer][i][1] for i in kept] + [v[0]]
        kk, vv = torch.cat(ks)[None], torch.cat(vs)[None]
        if update_cache:
            self.pending[layer] = (k[0], v[0])
        return F.scaled_dot_product_attention(q.transpose(1, 2), kk.transpose(1, 2),
                                              vv.transpose(1, 2)).transpose(1, 2)

    def cross_kv(self, layer):
        return self.text[layer]

    def commit(self):
        for layer, (k, v) in self.pending.items():
            self.frames[layer].extend(zip(k.chunk(FB), v.chunk(FB)))
        self.pending = {}


def _model():
    torch.manual_seed(0)
    m = CausalLingBotWorldTransformer3DModel(TINY)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)
    return m.eval()


def _inputs(blocks: int):
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(1, TINY.in_channels, FB, H, W, generator=g) for _ in range(blocks)]
    cams = [torch.randn(1, CAMERA_CHANNELS, FB, H, W, generator=g) for _ in range(blocks)]
    return xs, cams, torch.randn(1, TEXT, TINY.text_dim, generator=g)


def _paged(model, text, sessions=("a",)):
    cache = make_cache(kv_geometry(TINY, H, W, text_tokens=TEXT, dtype=torch.float32), len(sessions))
    text_kv = model.project_text(text)
    for sid in sessions:
        cache.open(sid)
        write_text(cache, sid, [(k[0], v[0]) for k, v in text_kv])
    return cache


def _snapshot(cache):
    s = cache.storage
    return [t.clone() for t in s.k + s.v + s.cross_k + s.cross_v]


@torch.no_grad()
def test_blocks_match_the_dense_sink_and_window_reference():
    model = _model()
    xs, cams, text = _inputs(7)
    cache = _paged(model, text)
    dense = DenseKV(TINY, [(k, v) for k, v in model.project_text(text)])
    t_noisy, t_clean = torch.tensor([750.0]), torch.tensor([0.0])
    for b, (x, cam) in enumerate(zip(xs, cams)):
        batch = cache.begin_batch(["a"])
        kv = BlockKV(cache, batch)
        assert kv.start_frames == (b * FB,)
        # Held pages: the sink and the rolling frames (one page per frame), then the block.
        n = b * FB
        held = min(TINY.sink_size, n) + min(max(n - TINY.sink_size, 0), TINY.rolling_frames)
        assert batch.num_pages == (held + FB,)
        paged_t = model(x, t_noisy, kv, cam, update_cache=False)
        dense_t = model(x, t_noisy, dense, cam, update_cache=False)
        torch.testing.assert_close(paged_t, dense_t, rtol=1e-5, atol=1e-5)
        paged_c = model(x, t_clean, kv, cam, update_cache=True)
        dense_c = model(x, t_clean, dense, cam, update_cache=True)
        torch.testing.assert_close(paged_c, dense_c, rtol=1e-5, atol=1e-5)
        cache.commit_batch(batch)
        dense.commit()
    # After 7 blocks (21 frames): sink 0..2 and the 6 most recent frames 15..20.
    assert cache.committed_frames("a") == 21
    assert cache.session("a").num_held_blocks() == TINY.sink_size + TINY.rolling_frames
    assert TINY.sink_size + TINY.rolling_frames + FB == TINY.sliding_window_num_frames


@torch.no_grad()
def test_no_mask_inside_the_block_and_causal_across_blocks():
    model = _model()
    xs, cams, text = _inputs(2)
    outs = []
    for last in (xs[1], xs[1].clone().index_fill_(2, torch.tensor([2]), 0.0)):
        cache = _paged(model, text)
        for x in (xs[0], last):
            batch = cache.begin_batch(["a"])
            out = model(x, torch.tensor([500.0]), BlockKV(cache, batch), cams[0], update_cache=True)
            cache.commit_batch(batch)
        outs.append((out, cache))
    # Changing the block's last frame changes its first frame's output (bidirectional in
    # the block) but no cached key of the earlier block (causal across blocks).
    assert not torch.allclose(outs[0][0][:, :, 0], outs[1][0][:, :, 0])
    for layer in range(TINY.num_layers):
        ka, kb = outs[0][1].storage.k[layer], outs[1][1].storage.k[layer]
        first, second = outs[0][1].table("a").held[:FB], outs[0][1].table("a").held[FB:]
        assert first == outs[1][1].table("a").held[:FB]
        assert torch.equal(ka[torch.tensor(first)], kb[torch.tensor(first)])
        assert not torch.equal(ka[torch.tensor(second)], kb[torch.tensor(second)])


@torch.no_grad()
def test_transient_forward_leaves_every_cache_byte_untouched():
    model = _model()
    xs, cams, text = _inputs(5)
    cache = _paged(model, text, sessions=("a", "b"))
    for x, cam in zip(xs[:4], cams[:4]):  # past the sink and into the rolling window
        batch = cache.begin_batch(["a", "b"])
        model(torch.cat([x, x]), torch.tensor([0.0, 0.0]), BlockKV(cache, batch),
              torch.cat([cam, cam]), update_cache=True)
        cache.commit_batch(batch)
    batch = cache.begin_batch(["a", "b"])
    before = _snapshot(cache)
    free, frames = cache.num_free_blocks, cache.committed_frames("a")
    for t in (999.0, 750.0, 500.0, 250.0):
        model(torch.cat([xs[4], xs[4]]), torch.tensor([t, t]), BlockKV(cache, batch),
              torch.cat([cams[4], cams[4]]), update_cache=False)
    after = _snapshot(cache)
    assert len(before) == 4 * TINY.num_layers
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert cache.num_free_blocks == free and cache.committed_frames("a") == frames
    # The committing pass does write (the test can fail).
    model(torch.cat([xs[4], xs[4]]), torch.tensor([0.0, 0.0]), BlockKV(cache, batch),
          torch.cat([cams[4], cams[4]]), update_cache=True)
    assert not all(torch.equal(a, b) for a, b in zip(before, _snapshot(cache)))


@torch.no_grad()
def test_text_kv_is_written_once_and_kept_until_reset():
    model = _model()
    xs, cams, text = _inputs(3)
    cache = _paged(model, text)
    cross = [t.clone() for t in cache.storage.cross_k + cache.storage.cross_v]
    for x, cam in zip(xs, cams):
        batch = cache.begin_batch(["a"])
        model(x, torch.tensor([0.0]), BlockKV(cache, batch), cam, update_cache=True)
        cache.commit_batch(batch)
    assert all(torch.equal(a, b) for a, b in zip(cross, cache.storage.cross_k + cache.storage.cross_v))
    cache.reset("a", keep_cross=True)
    assert cache.has_cross("a") and cache.committed_frames("a") == 0
    cache.reset("a", keep_cross=False)
    assert not cache.has_cross("a")


@pytest.mark.parametrize("frames", [1, 2, 4, 6])
def test_a_forward_that_is_not_one_block_is_refused(frames):
    model = _model()
    _, _, text = _inputs(1)
    cache = _paged(model, text)
    kv = BlockKV(cache, cache.begin_batch(["a"]))
    x = torch.randn(1, TINY.in_channels, frames, H, W)
    with pytest.raises(ValueError, match=f"exactly one block of {FB} latent frames, got {frames}"):
        model(x, torch.tensor([0.0]), kv)
