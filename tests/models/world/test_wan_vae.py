"""Streaming Wan VAE decode against diffusers' one-shot decode, on a tiny random AutoencoderKLWan."""

import pytest
import torch
from diffusers import AutoencoderKLWan

from kv import KVGeometry, ModelState, PagedKVCache, Residency
from models.world.wan_vae import StreamingWanDecoder

Z, LH, LW = 4, 2, 3  # latent channels, latent height, width -> 16 x 24 pixels


def _tiny_vae(**kw) -> AutoencoderKLWan:
    torch.manual_seed(0)
    cfg = dict(base_dim=8, z_dim=Z, dim_mult=[1, 2, 2, 2], num_res_blocks=1, latents_mean=[0.0] * Z,
               latents_std=[1.0] * Z)
    cfg.update(kw)
    return AutoencoderKLWan(**cfg).eval()


@pytest.fixture(scope="module")
def vae() -> AutoencoderKLWan:
    return _tiny_vae()


@pytest.fixture(scope="module")
def latents() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(2, Z, 5, LH, LW)


@pytest.fixture(scope="module")
def one_shot(vae, latents) -> torch.Tensor:
    with torch.no_grad():
        return vae.decode(latents).sample


def _blocks(dec, state, z, cuts):
    return torch.cat([dec.decode(state, z[:, :, a:b]) for a, b in zip(cuts, cuts[1:])], dim=2)


@pytest.mark.parametrize("cuts", [(0, 5), (0, 1, 4, 5), (0, 1, 2, 3, 4, 5)])
def test_blocks_equal_one_shot_bit_for_bit_float32(vae, latents, one_shot, cuts):
    dec = StreamingWanDecoder(vae)
    state = dec.new_state(2, LH, LW)
    out = _blocks(dec, state, latents, cuts)
    assert out.shape == (2, 3, 17, 16, 24) == one_shot.shape
    assert torch.equal(out, one_shot)
    assert state.latent_frames == 5


def test_output_frame_counts(vae):
    dec = StreamingWanDecoder(vae)
    assert (dec.temporal_upsample, dec.spatial_upsample) == (4, 8)
    assert dec.output_frames(0, 1) == 1
    assert dec.output_frames(0, 3) == 9
    assert dec.output_frames(3, 3) == 12
    assert dec.output_frames(5, 0) == 0


def test_frames_yield_each_frame_after_its_latent_frame(vae, latents, one_shot):
    dec = StreamingWanDecoder(vae)
    state = dec.new_state(2, LH, LW)
    _blocks(dec, state, latents, (0, 2))  # 5 output frames so far
    gen = dec.frames(state, latents[:, :, 2:5])
    first = next(gen)
    # Only the block's first latent frame was decoded to produce its first frame.
    assert state.latent_frames == 3
    assert first.shape == (2, 3, 16, 24)
    assert torch.equal(first, one_shot[:, :, 5])
    rest = list(gen)
    assert len(rest) == 11 and state.latent_frames == 5
    assert torch.equal(torch.stack([first, *rest], 2), one_shot[:, :, 5:17])


def test_bf16_within_dtype_tolerance(latents, one_shot):
    vae16 = _tiny_vae().to(torch.bfloat16)
    dec = StreamingWanDecoder(vae16)
    state = dec.new_state(2, LH, LW)
    out = _blocks(dec, state, latents.to(torch.bfloat16), (0, 1, 3))
    with torch.no_grad():
        ref16 = vae16.decode(latents[:, :, :3].to(torch.bfloat16)).sample
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), ref16.float(), atol=2e-2, rtol=0)
    assert (out.float() - one_shot[:, :, :9]).abs().max().item() < 0.1


def test_state_bytes_exact(vae):
    dec = StreamingWanDecoder(vae)
    # float32 caches of [B, C, 2, h, w], one per causal conv (24 here), batch 2:
    # conv_in 4ch + 9 x 16ch at 2x3, 8 + 4 x 16ch at 4x6, 8 + 3 x 16ch at 8x12, 5 x 8ch at 16x24.
    per_frame_px = (4 + 9 * 16) * 6 + (8 + 4 * 16) * 24 + (8 + 3 * 16) * 96 + 5 * 8 * 384
    expected = 4 * 2 * 2 * per_frame_px
    assert expected == 373_632
    assert dec.state_bytes(2, LH, LW) == expected
    state = dec.new_state(2, LH, LW)
    assert state.nbytes == expected
    assert len(state.caches) == 24


def test_swap_round_trip_is_bit_exact(vae, latents, one_shot):
    dec = StreamingWanDecoder(vae)
    state = dec.new_state(2, LH, LW)
    a = dec.decode(state, latents[:, :, :3])
    before = [c.clone() for c in state.caches]
    ptrs = [c.data_ptr() for c in state.caches]
    state.to_host()
    assert all(c.data_ptr() != p for c, p in zip(state.caches, ptrs))
    state.to_device("cpu")
    assert all(torch.equal(c, b) for c, b in zip(state.caches, before))
    b = dec.decode(state, latents[:, :, 3:])
    assert torch.equal(torch.cat([a, b], 2), one_shot)


def test_reset_and_free(vae, latents, one_shot):
    dec = StreamingWanDecoder(vae)
    state = dec.new_state(2, LH, LW)
    dec.decode(state, latents[:, :, 3:5])
    state.reset()
    assert state.latent_frames == 0
    assert torch.equal(_blocks(dec, state, latents, (0, 2, 5)), one_shot)
    state.free()
    assert state.freed and state.nbytes == 0
    with pytest.raises(RuntimeError, match="freed"):
        dec.decode(state, latents[:, :, :1])


def test_bad_latents_change_nothing(vae, latents):
    dec = StreamingWanDecoder(vae)
    state = dec.new_state(2, LH, LW)
    dec.decode(state, latents[:, :, :1])
    before = [c.clone() for c in state.caches]
    for bad in (latents[:1, :, :1], latents[:, :, :1, :1], latents[:, :, 0], latents[:, :3, :1]):
        with pytest.raises(ValueError, match="do not match"):
            dec.decode(state, bad)
    assert state.latent_frames == 1
    assert all(torch.equal(c, b) for c, b in zip(state.caches, before))


def test_wan22_layout_refused():
    with pytest.raises(ValueError, match="Wan 2.1"):
        StreamingWanDecoder(_tiny_vae(is_residual=True, patch_size=2, in_channels=12, out_channels=12))


def test_channels_last_within_float_tolerance(latents, one_shot):
    dec = StreamingWanDecoder(_tiny_vae(), channels_last=True)
    state = dec.new_state(2, LH, LW)
    out = _blocks(dec, state, latents, (0, 3, 7))
    assert torch.allclose(out, one_shot, atol=1e-5, rtol=0)


def test_residency_swaps_the_decode_state_with_the_session(vae, latents, one_shot):
    dec = StreamingWanDecoder(vae)
    nbytes = dec.state_bytes(2, LH, LW)
    g = KVGeometry(num_layers=1, kv_heads=1, head_dim=4, tokens_per_frame=2, block_size=2, sink_frames=1,
                   window_frames=1, dtype=torch.float32, branches=("positive", "negative"),
                   model_state_bytes=nbytes)
    cache = PagedKVCache(g, 16, max_sessions=1)
    r = Residency(cache, host_budget_bytes=10 * nbytes)
    r.open("a")
    state = dec.new_state(2, LH, LW)
    assert isinstance(state, ModelState)
    r.attach_state("a", state)
    a = dec.decode(state, latents[:, :, :2])
    ptrs = [c.data_ptr() for c in state.caches]
    r.open("b")                               # one slot: a and its decode state go to the host
    assert r.is_swapped("a") and r.metrics()["swap_out_bytes"] == nbytes
    assert all(c.data_ptr() != p for c, p in zip(state.caches, ptrs))
    r.close("b")
    r.ensure_resident(["a"])
    b = dec.decode(r.state("a"), latents[:, :, 2:])
    assert torch.equal(torch.cat([a, b], 2), one_shot)
    r.close("a")
    assert state.freed


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_cuda_graph_and_pinned_swap_bit_exact_float32(latents):
    vae = _tiny_vae().cuda()
    z = latents.cuda()
    with torch.no_grad():
        ref = vae.decode(z).sample
    dec = StreamingWanDecoder(vae, cuda_graph=True)
    state = dec.new_state(2, LH, LW)
    a = _blocks(dec, state, z, (0, 1, 2, 3))  # first (eager), steady eager, then captured + replayed
    assert state._graph is not None
    state.to_host()
    assert all(c.is_pinned() for c in state.caches) and state._graph is None
    state.to_device("cuda")
    b = _blocks(dec, state, z, (3, 4, 5))  # recaptured on the moved caches
    assert torch.equal(torch.cat([a, b], 2), ref)



def test_default_config_state_bytes_at_480x832_bf16():
    with torch.device("meta"):  # shapes only, nothing allocated
        vae = AutoencoderKLWan().to(torch.bfloat16)
    dec = StreamingWanDecoder(vae)
    # 2 frames * 2 bytes * sum(C_in * pixels) over the 32 causal convs, by level:
    # 60x104: conv_in 16 + mid 4 x 384 + up0 6 x 384 + time conv 384 = 4,240 channels
    # 120x208: up1 192 + 5 x 384 + time conv 384 = 2,496; 240x416: up2 192 + 5 x 192 = 1,152
    # 480x832: up3 96 + 5 x 96 + conv_out 96 = 672
    px = 4240 * 6240 + 2496 * 24960 + 1152 * 99840 + 672 * 399360
    assert dec.state_bytes(1, 60, 104) == 2 * 2 * px == 1_888_573_440   # 1,801 MiB per session
    assert len(dec.cache_shapes(1, 60, 104)) == 32
    assert dec.output_frames(0, 21) == 81
