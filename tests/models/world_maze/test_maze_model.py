"""The maze DiT: clip and per-frame paths agree, positions, the cache ring, weights, training pieces."""

import pytest
import torch

from models.world.maze.attention import frame_causal_mask
from models.world.maze.cache import FrameCache, window_slot, window_slots
from models.world.maze.model import FrameContext, MazeDiT, MazeDiTConfig, param_count
from models.world.maze.rollout import timesteps, to_model, to_u8, write_frame
from models.world.maze.training.train import lr_at, noise_plan, own_context
from models.world.maze.weights import load_model, read_metadata, save_weights

TINY = MazeDiTConfig(dim=64, depth=2, heads=1)


def tiny_model(seed: int = 0) -> MazeDiT:
    """A tiny model with its zero-initialised modulation made random, so every path matters."""
    torch.manual_seed(seed)
    m = MazeDiT(TINY).eval()
    for blk in m.blocks:
        torch.nn.init.normal_(blk.ada.weight, std=0.05)
    torch.nn.init.normal_(m.out.weight, std=0.05)
    torch.nn.init.normal_(m.ada_out.weight, std=0.05)
    return m


def test_default_geometry_and_size():
    m = MazeDiT()
    assert param_count(m) == 5_599_792
    assert (m.cfg.tokens, m.cfg.head_dim, m.cfg.patch_values) == (256, 64, 48)


def test_frame_causal_mask_with_window():
    m = frame_causal_mask(5, 1, torch.device("cpu"), flex=False, window=2).int()
    assert m.tolist() == [[1, 0, 0, 0, 0],
                          [1, 1, 0, 0, 0],
                          [1, 1, 1, 0, 0],
                          [1, 1, 1, 1, 0],
                          [1, 0, 1, 1, 1]]


def test_window_slots():
    assert [window_slot(f, 3) for f in range(8)] == [0, 1, 2, 3, 1, 2, 3, 1]
    assert window_slots(torch.arange(8), 3).tolist() == [0, 1, 2, 3, 1, 2, 3, 1]


def test_timesteps():
    assert timesteps(4) == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert timesteps(2, shift=3.0) == [1.0, 0.75, 0.0]


def test_pixels_round_trip():
    u8 = torch.randint(0, 256, (2, 64, 64, 3), dtype=torch.uint8)
    x = to_model(u8)
    assert x.shape == (2, 3, 64, 64) and float(x.min()) >= -1 and float(x.max()) <= 1
    assert torch.equal(to_u8(x), u8)


def test_clip_forward_equals_frame_by_frame_with_a_cache():
    """Training sees a whole clip at once; serving one frame at a time against cached K/V."""
    m = tiny_model()
    B, T, W = 2, 7, 3
    torch.manual_seed(1)
    x = torch.randn(B, T, 3, 64, 64)
    t = torch.zeros(B, T)      # clean frames: what the cache holds
    a = (torch.rand(B, T, 8) > 0.5).float()
    with torch.no_grad():
        ref = m.forward_clip(x, t, a, window=W)
        cache = FrameCache(TINY, B, W, "cpu")
        view = cache.view()
        out = []
        for i in range(T):
            f = torch.full((B,), i)
            out.append(m.forward_frame(x[:, i], t[:, i], a[:, i], f, f == 0, view))
            view.put(f, W, list(view.own))
    assert float((torch.stack(out, 1) - ref).abs().max()) < 1e-4
    assert cache.slot_valid.tolist() == [[True] * 4] * 2


def test_time_positions_are_periodic_in_64_frames():
    m = tiny_model()
    B = 1
    torch.manual_seed(2)
    x = torch.randn(3, B, 3, 64, 64)
    zeros, acts = torch.zeros(B), torch.zeros(B, 8)

    def run(positions: tuple[int, int, int]) -> torch.Tensor:
        ctx = FrameContext([torch.zeros(B, 1, 0, 64)] * 2, [torch.zeros(B, 1, 0, 64)] * 2,
                           torch.zeros(B, 0, dtype=torch.bool))
        ks, vs = [[] for _ in range(2)], [[] for _ in range(2)]
        for i, pos in enumerate(positions):
            ctx = FrameContext([torch.cat(k, 2) if k else torch.zeros(B, 1, 0, 64) for k in ks],
                               [torch.cat(v, 2) if v else torch.zeros(B, 1, 0, 64) for v in vs],
                               torch.ones(B, 256 * i, dtype=torch.bool))
            o = m.forward_frame(x[i], zeros, acts, torch.tensor([pos]), torch.tensor([i == 0]), ctx)
            for layer, (k, v) in enumerate(ctx.own):
                ks[layer].append(k)
                vs[layer].append(v)
        return o

    with torch.no_grad():
        a = run((0, 1, 2))
        shifted = run((0, 1 + 5, 2 + 5))      # the sink is position-free; only distances count
        wrapped = run((0, 1 + 64, 2 + 64))    # a whole period later
        apart = run((0, 1, 2 + 5))            # frame 1 now 6 frames back instead of 1
    assert float((a - shifted).abs().max()) < 1e-4
    assert float((a - wrapped).abs().max()) < 1e-4
    assert float((a - apart).abs().max()) > 1e-3  # ~2e-3 with these random weights


def test_weights_round_trip(tmp_path):
    m = tiny_model()
    save_weights(m, tmp_path / "w.safetensors", extra={"steps": 7})
    assert read_metadata(tmp_path / "w.safetensors") == {"config": TINY.to_dict(), "steps": 7}
    back = load_model(tmp_path / "w.safetensors")
    assert back.cfg == TINY and not back.training
    for (k, v), (k2, v2) in zip(m.state_dict().items(), back.state_dict().items()):
        assert k == k2 and torch.equal(v.half().float(), v2)


def test_write_frame_fills_sink_then_ring():
    m = tiny_model()
    cache = FrameCache(TINY, 1, 2, "cpu")
    view = cache.view()
    for f in range(4):
        write_frame(m, view, torch.zeros(1, 3, 64, 64), torch.zeros(1, 8), torch.tensor([f]), 2)
    assert cache.slot_valid.tolist() == [[True, True, True]]
    assert cache.bytes_per_row == 2 * 2 * (3 * 256) * 64 * 4


def test_noise_plan_levels():
    gen = torch.Generator().manual_seed(0)
    t, _ = noise_plan(4096, 16, torch.device("cpu"), gen)
    assert t.shape == (4096, 16) and float(t.min()) >= 0 and float(t.max()) <= 1
    assert float(t[:, 0].max()) <= 0.1                         # the sink is always context
    assert abs(float((t[:, 1:] == 1).float().mean()) - 0.1 * (1 - 0.25)) < 0.02  # ~10% of targets
    assert float((t[:, 1:] > 0.5).float().mean()) > 0.45      # leaning towards noise


def test_noise_plan_marks_the_context_prefix():
    gen = torch.Generator().manual_seed(1)
    t, ctx = noise_plan(512, 16, torch.device("cpu"), gen)
    assert bool(ctx[:, 0].all())
    # The context is a prefix: once a frame is a target, every later frame is.
    assert bool((ctx[:, 1:] <= ctx[:, :-1]).all())
    assert float(t[ctx].max()) <= 0.1
    assert 0.4 < float((ctx.sum(1) > 1).float().mean()) < 0.6   # half the clips have a longer prefix


def test_own_context_replaces_only_picked_context_frames():
    torch.manual_seed(0)
    m = tiny_model()
    x0 = torch.rand(6, 4, 3, 64, 64) * 2 - 1
    a = torch.zeros(6, 4, 8)
    gen = torch.Generator().manual_seed(2)
    t, _ = noise_plan(6, 4, torch.device("cpu"), gen)
    is_ctx = torch.tensor([[True, True, True, False]] * 3 + [[True, False, False, False]] * 3)
    x_in, skip = own_context(m, x0, a, t, is_ctx, 1.0, None, gen)
    assert skip.tolist() == [[False, True, True, False]] * 3 + [[False] * 4] * 3
    assert torch.equal(x_in[~skip], x0[~skip])                 # sink, targets and other clips untouched
    assert not torch.equal(x_in[skip], x0[skip])
    assert float(x_in.abs().max()) <= 1.0
    none, skip0 = own_context(m, x0, a, t, is_ctx, 0.0, None, gen)
    assert none is x0 and not bool(skip0.any())


def test_lr_schedule():
    assert lr_at(0, 0.0, 1.0, 10) == 0.1
    assert lr_at(100, 0.0, 1.0, 10) == 1.0
    assert abs(lr_at(100, 1.0, 1.0, 10) - 0.1) < 1e-12


def test_set_gelu_switches_every_mlp_between_the_trained_tanh_and_the_exact_gelu():
    torch.manual_seed(0)
    m = MazeDiT(MazeDiTConfig(dim=64, depth=2, heads=1))
    assert m.gelu == "tanh"
    x = torch.linspace(-6, 6, 10_001)
    tanh = m.blocks[0].mlp[1](x)
    m.set_gelu("erf")
    assert m.gelu == "erf" and all(b.mlp[1].approximate == "none" for b in m.blocks)
    erf = m.blocks[1].mlp[1](x)
    assert torch.equal(erf, torch.nn.functional.gelu(x))
    assert 4e-4 < (erf - tanh).abs().max() < 5e-4  # GELUS' bound
    with pytest.raises(ValueError, match="gelu must be one of"):
        m.set_gelu("relu")
