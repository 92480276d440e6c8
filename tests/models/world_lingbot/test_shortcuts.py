"""The opt-in shortcuts on the tiny checkpoint: the exact path unchanged without them, the passes
each one runs, the K/V layout ``reuse_kv`` commits, FP8 and the TAEHV decoder through the factory."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from models.world.base import WorldTick
from models.world.lingbot import build
from models.world.lingbot import pipeline as pipeline_module
from models.world.lingbot.attention import BlockKV
from models.world.lingbot.checkpoint import load_components
from models.world.lingbot.decoders import wan_decoder
from models.world.lingbot.fp8 import FP8Linear, quantize_linears, restore_linears
from models.world.lingbot.pipeline import DMD_TIMESTEPS, BlockRequest, LingBotPipeline, shifted_sigma
from models.world.lingbot.vae_io import latent_stats

H = W = 32   # latent 4 x 4: 4 tokens per latent frame
KEYS = ([{"w"}] * 3, [{"d"}, {"l"}, set()], [{"i"}] * 3, [set(), {"a"}, {"w"}])


@pytest.fixture(scope="module")
def components(tiny_checkpoint):
    return load_components(tiny_checkpoint)


def _pipeline(components, sessions=2, **kw):
    return LingBotPipeline(components, height=H, width=W, max_sessions=sessions, text_tokens=8,
                           condition_latents=2, **kw)


def _image(seed=0):
    return np.random.default_rng(seed).integers(0, 256, (H, W, 3), dtype=np.uint8)


class Passes:
    """Every transformer forward of a pipeline: its input, timestep and whether it commits."""

    def __init__(self, pipe: LingBotPipeline) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor, bool]] = []
        self.handle = pipe.model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        self.calls.append((args[0].clone(), args[1].clone(), bool(kwargs.get("update_cache", False))))

    def take(self) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
        out, self.calls = self.calls, []
        return out

    def __enter__(self) -> "Passes":
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def _reference_denoise(pipe: LingBotPipeline):
    """The exact path as it was written before the shortcuts: 4 transient passes at
    (1000, 750, 500, 250), then the committing pass on x0 at t = 0."""
    def denoise(noise, cond, camera, kv, rows):
        dev, dt = pipe.device, pipe.dtype
        sigmas = [shifted_sigma(t, pipe.flow_shift) for t in DMD_TIMESTEPS]
        x = noise(0).to(dt)
        x0 = x
        for i, sigma in enumerate(sigmas):
            t = torch.full((rows,), sigma * 1000.0, device=dev)
            flow = pipe.model(torch.cat([x, cond], 1), t, kv, camera, update_cache=False)
            x0 = x.float() - sigma * flow
            if i + 1 < len(sigmas):
                x = ((1 - sigmas[i + 1]) * x0 + sigmas[i + 1] * noise(i + 1)).to(dt)
        x0 = x0.to(dt)
        pipe.model(torch.cat([x0, cond], 1), torch.zeros(rows, device=dev), kv, camera, update_cache=True)
        return x0
    return denoise


def _latents(pipe: LingBotPipeline) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    real = pipe._denoise
    pipe._denoise = lambda *a: seen.append(real(*a).clone()) or seen[-1]
    return seen


def test_without_options_the_exact_path_runs_bit_for_bit(components):
    ours, before = _pipeline(components), _pipeline(components)
    assert (ours.passes_per_block, ours.reuse_kv, ours.block_decoder.name) == (5, False, "wan")
    before._denoise = _reference_denoise(before)
    lat_ours, lat_before = _latents(ours), _latents(before)
    for p in (ours, before):
        p.open("a", "a red house", image=_image(0), seed=3)
        p.open("b", "snow", seed=4)
    for keys in KEYS:
        a = ours.generate([BlockRequest("a", keys=keys), BlockRequest("b", keys=keys[::-1])])
        b = before.generate([BlockRequest("a", keys=keys), BlockRequest("b", keys=keys[::-1])])
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert all(torch.equal(x, y) for x, y in zip(lat_ours, lat_before)) and len(lat_ours) == len(KEYS)
    for layer in range(ours.cfg.num_layers):
        assert torch.equal(ours.cache.storage.k[layer], before.cache.storage.k[layer])
    # The Wan decoder gets the latents de-normalised, as the pipeline did before.
    x = torch.randn(1, 16, 3, 4, 4)
    mean, std = latent_stats(components.vae, x)
    assert torch.equal(wan_decoder(components.vae).prepare(x), (x * std + mean).to(torch.float32))


@pytest.mark.parametrize("steps", [1, 2, 3, 4])
@pytest.mark.parametrize("reuse_kv", [False, True], ids=["commit", "reuse_kv"])
def test_n_steps_run_n_passes_and_the_committing_one_unless_reused(components, steps, reuse_kv):
    exact, pipe = _pipeline(components), _pipeline(components, steps=steps, reuse_kv=reuse_kv)
    assert pipe.passes_per_block == steps + (0 if reuse_kv else 1)
    with Passes(pipe) as spy:   # the two pipelines share the transformer (and so the hook)
        for p in (exact, pipe):
            p.open("a", "x", image=_image(1), seed=7)
        for k, keys in enumerate(KEYS[:2]):
            exact.generate([BlockRequest("a", keys=keys)])
            ref = spy.take()
            pipe.generate([BlockRequest("a", keys=keys)])
            calls = spy.take()
            assert len(calls) == pipe.passes_per_block and len(ref) == 5
            want = [False] * (steps - 1) + [True] if reuse_kv else [False] * steps + [True]
            assert [c for _, _, c in calls] == want
            sigmas = [shifted_sigma(t, 5.0) for t in DMD_TIMESTEPS[:steps]]
            assert torch.equal(torch.stack([c[1] for c in calls[:steps]]), torch.tensor([[s * 1000.0] for s in sigmas]))
            if not reuse_kv:
                assert calls[-1][1].tolist() == [0.0]
            if k == 0:
                # A block's first passes see the exact path's inputs, bit for bit (same noise draws).
                for (x, t, _), (xe, te, _) in zip(calls[:steps], ref[:steps]):
                    assert torch.equal(x, xe) and torch.equal(t, te)
    if steps == 4 and not reuse_kv:
        assert torch.equal(pipe.cache.storage.k[0], exact.cache.storage.k[0])


class RecordingKV(BlockKV):
    """BlockKV that records what the committing pass writes and what the denoising passes read."""

    written: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    read_tables: list[tuple[list[int], int]] = []

    def self_attention(self, layer, q, k, v, update_cache):
        if update_cache:
            if layer == 0:
                RecordingKV.written.append([])
            RecordingKV.written[-1].append((k[0].clone(), v[0].clone()))
        elif layer == 0:
            held = self.batch.num_pages[0] - self.batch.chunk_pages
            RecordingKV.read_tables.append((self.batch.block_tables[0, :held].tolist(), held))
        return super().self_attention(layer, q, k, v, update_cache)


def test_reuse_kv_commits_the_same_layout_and_the_next_block_reads_what_it_committed(components, monkeypatch):
    monkeypatch.setattr(pipeline_module, "BlockKV", RecordingKV)
    RecordingKV.written, RecordingKV.read_tables = [], []
    exact, reuse = _pipeline(components, sessions=1), _pipeline(components, sessions=1, reuse_kv=True)
    for p in (exact, reuse):
        p.open("a", "x", image=_image(2), seed=9)
    F = reuse.cfg.num_frames_per_block
    previous = None
    for keys in KEYS:
        exact.generate([BlockRequest("a", keys=keys)])
        RecordingKV.written, RecordingKV.read_tables = [], []
        reuse.generate([BlockRequest("a", keys=keys)])
        # One committing forward (the last denoising pass), writing every layer once.
        assert len(RecordingKV.written) == 1 and len(RecordingKV.written[0]) == reuse.cfg.num_layers
        # Layout: the same blocks held, in the same order, the same frames, the same free count.
        assert reuse.cache.table("a").held == exact.cache.table("a").held
        assert reuse.cache.committed_frames("a") == exact.cache.committed_frames("a")
        assert reuse.cache.num_free_blocks == exact.cache.num_free_blocks
        if previous is not None:
            # This block's denoising passes read the pages the block before committed, which
            # still hold what that block's last denoising pass computed.
            pages, written = previous
            assert len(RecordingKV.read_tables) == reuse.passes_per_block - 1 > 0
            assert all(set(pages.tolist()) <= set(table) for table, _ in RecordingKV.read_tables)
            for layer, (k, v) in enumerate(written):
                assert torch.equal(reuse.cache.storage.k[layer][pages].reshape(k.shape), k)
                assert torch.equal(reuse.cache.storage.v[layer][pages].reshape(v.shape), v)
        # The block's pages hold what its last denoising pass computed (not the exact path's).
        pages = torch.tensor(reuse.cache.table("a").held[-F:])
        for layer, (k, v) in enumerate(RecordingKV.written[0]):
            stored_k = reuse.cache.storage.k[layer][pages].reshape(k.shape)
            stored_v = reuse.cache.storage.v[layer][pages].reshape(v.shape)
            assert torch.equal(stored_k, k) and torch.equal(stored_v, v)
            assert not torch.equal(stored_k, exact.cache.storage.k[layer][pages].reshape(k.shape))
        previous = (pages, RecordingKV.written[0])


def test_shortcuts_through_the_factory_reach_the_pipeline_and_the_details(tiny_checkpoint):
    opts = dict(device="cpu", max_batch=1, frames_per_chunk=None, steps=None, gpu_memory_fraction=0.5,
                height=H, width=W)
    world = build(str(tiny_checkpoint), SimpleNamespace(
        **opts, model_options=(("steps", "2"), ("reuse_kv", "1"), ("fp8", "ffn+attn"))))
    p, d = world.pipeline, world.details()
    assert (len(p.sigmas), p.reuse_kv, p.passes_per_block) == (2, True, 2)
    assert d["shortcuts"] == "steps=2&reuse_kv=1&fp8=ffn+attn" and d["transformer_passes_per_block"] == 2
    assert d["kv_from"] == "last denoising pass" and d["decoder"] == "wan"
    assert d["fp8"]["groups"] == ["ffn", "attn"] and d["fp8"]["layers"] == 2 * 4
    assert d["fp8"]["kernels"] == ["emulated"]
    assert not [n for n, m in p.model.named_modules() if n.endswith(".ffn.0") and not isinstance(m, FP8Linear)]
    tick = WorldTick("s", "s-0", 0, (0,), "a cave", (frozenset("w"),) * 12, seed=2)
    with Passes(p) as spy:
        chunk = world.run_batch([tick])[0]
        world.end_tick("s", committed=True)
        assert chunk.frames.shape == (12, H, W, 3) and len(spy.take()) == 2
    exact = build(str(tiny_checkpoint), SimpleNamespace(**opts))
    d = exact.details()
    assert (d["shortcuts"], d["fp8"], d["transformer_passes_per_block"], d["kv_from"]) == (
        None, None, 5, "committing pass")
    with pytest.raises(ValueError, match="option steps=7: must be an integer in 1..4"):
        build(str(tiny_checkpoint), SimpleNamespace(**opts, model_options=(("steps", "7"),)))
    with pytest.raises(ValueError, match="lingbot takes its denoising steps from its entry"):
        build(str(tiny_checkpoint), SimpleNamespace(**{**opts, "steps": 2}))


def test_fp8_blocks_stay_finite_and_near_the_exact_path(components):
    latents = []
    for groups in ((), ("ffn", "attn", "cross")):   # one transformer: the exact run first, then FP8
        replaced = quantize_linears(components.transformer, groups)
        try:
            pipe = _pipeline(components, sessions=1)
            pipe.open("a", "x", image=_image(3), seed=5)
            latents.append(_latents(pipe))
            for keys in KEYS:
                pipe.generate([BlockRequest("a", keys=keys)])
        finally:
            restore_linears(components.transformer, replaced)
    assert not any(isinstance(m, FP8Linear) for m in components.transformer.modules())
    for a, b in zip(*latents):
        assert torch.isfinite(b).all() and not torch.equal(a, b)
        assert ((a - b).norm() / a.norm()).item() < 0.25


def test_a_taehv_decoder_from_a_path_decodes_the_blocks(tiny_checkpoint, tmp_path):
    taehv = pytest.importorskip("models.world.taehv")
    path = tmp_path / "taew2_1.pth"
    torch.save(taehv.random_state_dict(seed=1), path)
    opts = dict(device="cpu", max_batch=1, frames_per_chunk=None, steps=None, gpu_memory_fraction=0.5,
                height=H, width=W)
    world = build(str(tiny_checkpoint), SimpleNamespace(**opts, model_options=(("decoder", f"taehv:{path}"),)))
    p = world.pipeline
    assert world.details()["decoder"] == "taehv" and p.block_decoder.name == "taehv"
    assert p.geometry.model_state_bytes == p.decoder.state_bytes(1, H // 8, W // 8)
    frames = []
    for k in range(2):
        frames.append(world.run_batch([WorldTick("s", f"s-{k}", k, (k,), "a cave", (frozenset("w"),) * 12,
                                                 seed=2)])[0].frames)
        world.end_tick("s", committed=True)
    assert all(f.shape == (12, H, W, 3) and f.dtype == np.uint8 for f in frames) and frames[1].std() > 0
    bad = tmp_path / "bad.pth"
    sd = taehv.random_state_dict(seed=1)
    sd["decoder.99.weight"] = torch.zeros(1)
    torch.save(sd, bad)
    with pytest.raises(ValueError, match=r"^option decoder: .*bad.pth: unknown tensor 'decoder.99.weight'"):
        build(str(tiny_checkpoint), SimpleNamespace(**opts, model_options=(("decoder", f"taehv:{bad}"),)))
