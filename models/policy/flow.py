"""The built-in default policy: a small flow-matching action model (random weights).

It is shaped like pi0 at toy scale, so that the serving path (batching, upload,
a few denoising steps that reuse the observation's keys and values) is the real
thing, not a constant:

    cameras [B, 3, H, W, 3] uint8 ──conv patchify──> image tokens  [B, 3*(H/32)*(W/32), d]
    state   [B, S] float32      ──linear────────────> state token  [B, 1, d]
    prompt  str                 ──hashed byte 1-3-grams, bag────> prompt token [B, 1, d]
                                        │ (per layer: K, V computed once per call)
    noise x_1 [B, T, A] ──┐             v
                          └─> T action tokens + time(t) ──[self-attn, cross-attn, MLP] x L──> velocity v
    Euler, t = 1 -> 0 in num_inference_steps steps: x_{t+dt} = x_t + dt * v(x_t, t),  dt = -1/steps

The convention is pi0's: x_t = t * noise + (1 - t) * actions, so integrating the
velocity from t = 1 (pure noise) to t = 0 gives the action chunk.

Each robot's noise comes from its own generator: the ``seed`` sampling param if
given, otherwise a hash of (policy seed, session id, the session's committed call
count). So a robot's answer does not depend on which other robots share its
batch, and after a reset the same observations replay the same actions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.factory import BuildOptions, FactoryError
from models.policy.base import PolicyAdapter, PolicyWork
from models.policy.noise import CallSeeds
from protocols.openpi import PolicyMetadata

# Patch size of the two-stage conv stem (8 then 4).
PATCH = 32
PROMPT_BUCKETS = 4096
MAX_PROMPT_BYTES = 512
# Sessions whose call counter is kept; the least recently used beyond this are forgotten.


@dataclass(frozen=True)
class FlowPolicyConfig:
    action_horizon: int = 50
    action_dim: int = 32
    image_keys: tuple[str, ...] = (
        "observation/exterior_image_1_left",
        "observation/exterior_image_2_left",
        "observation/wrist_image_left",
    )
    image_resolution: tuple[int, int] = (224, 224)
    state_dim: int = 32
    d_model: int = 256
    num_heads: int = 4
    num_layers: int = 4
    num_inference_steps: int = 10
    seed: int = 0
    max_batch: int = 32

    def metadata(self) -> PolicyMetadata:
        return PolicyMetadata(
            action_horizon=self.action_horizon,
            action_dim=self.action_dim,
            image_keys=self.image_keys,
            image_resolution=self.image_resolution,
            state_dim=self.state_dim,
            extra={"policy": "flow-matching", "num_inference_steps": self.num_inference_steps},
        )


def prompt_buckets(prompt: str | None) -> np.ndarray:
    """Hashed byte 1-, 2- and 3-grams of the UTF-8 prompt, as bucket ids (stable across runs).

    "ab" -> unigrams a, b; bigram ab: 3 ids. An empty or missing prompt -> [0].
    """
    raw = (prompt or "").encode("utf-8")[:MAX_PROMPT_BYTES]
    if not raw:
        return np.zeros(1, np.int64)
    b = np.frombuffer(raw, np.uint8).astype(np.int64)
    grams = [b + 1]
    if b.size >= 2:
        grams.append(257 + (b[:-1] * 256 + b[1:]))
    if b.size >= 3:
        grams.append(257 + 65536 + (b[:-2] * 65536 + b[1:-1] * 256 + b[2:]))
    ids = np.concatenate(grams)
    # Knuth multiplicative hash into the table; bucket 0 is kept for "no prompt".
    return 1 + (ids * 2654435761 % (2**32)) % (PROMPT_BUCKETS - 1)


def sinusoid(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[N] -> [N, dim] sinusoidal embedding (as for diffusion timesteps)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = t.float()[:, None] * 1000.0 * freqs[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class _Block(nn.Module):
    """Pre-norm: self-attention over actions, cross-attention to the observation, MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.self_out = nn.Linear(d, d)
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.cross_out = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        return x.view(b, n, self.heads, d // self.heads).transpose(1, 2)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        b, h, n, dh = x.shape
        return x.transpose(1, 2).reshape(b, n, h * dh)

    def cond_kv(self, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.kv(cond).chunk(2, dim=-1)
        return self._split(k), self._split(v)

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, sk, sv = (self._split(t) for t in self.qkv(self.norm1(x)).chunk(3, dim=-1))
        x = x + self.self_out(self._merge(F.scaled_dot_product_attention(q, sk, sv)))
        q = self._split(self.q(self.norm2(x)))
        x = x + self.cross_out(self._merge(F.scaled_dot_product_attention(q, k, v)))
        return x + self.mlp(self.norm3(x))


class FlowActionModel(nn.Module):
    """Observation encoder + flow-matching action denoiser (see the module docstring)."""

    def __init__(self, cfg: FlowPolicyConfig) -> None:
        super().__init__()
        h, w = cfg.image_resolution
        if h % PATCH or w % PATCH:
            raise ValueError(f"image_resolution must be multiples of {PATCH}, got {cfg.image_resolution}")
        d = cfg.d_model
        self.cfg = cfg
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 8, stride=8), nn.GELU(), nn.Conv2d(64, d, 4, stride=4))
        tokens_per_cam = (h // PATCH) * (w // PATCH)
        self.image_pos = nn.Parameter(torch.randn(len(cfg.image_keys), tokens_per_cam, d) * 0.02)
        self.state_in = nn.Linear(max(cfg.state_dim, 1), d)
        self.prompt_bag = nn.EmbeddingBag(PROMPT_BUCKETS, d, mode="mean")
        self.cond_norm = nn.LayerNorm(d)
        self.action_in = nn.Linear(cfg.action_dim, d)
        self.action_pos = nn.Parameter(torch.randn(cfg.action_horizon, d) * 0.02)
        self.time_mlp = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList(_Block(d, cfg.num_heads) for _ in range(cfg.num_layers))
        self.out_norm = nn.LayerNorm(d)
        self.action_out = nn.Linear(d, cfg.action_dim)

    def encode(
        self, images: torch.Tensor, state: torch.Tensor, prompt_ids: torch.Tensor, prompt_offsets: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """images [B, C, H, W, 3] uint8, state [B, S] -> per layer (K, V) of the observation tokens."""
        return self.kv_of(self.condition(images, state, prompt_ids, prompt_offsets))

    def kv_of(self, cond: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (K, V) of the observation tokens ``condition`` made."""
        return [blk.cond_kv(cond) for blk in self.blocks]

    def condition(
        self, images: torch.Tensor, state: torch.Tensor, prompt_ids: torch.Tensor, prompt_offsets: torch.Tensor
    ) -> torch.Tensor:
        """The observation tokens [B, C * tokens + 2, d]: every camera's, then the state's and the prompt's."""
        b, c, h, w, _ = images.shape
        x = images.reshape(b * c, h, w, 3).permute(0, 3, 1, 2).float() / 127.5 - 1.0
        pr = self.prompt_bag(prompt_ids, prompt_offsets)                 # [B, d]
        tok = self.image_features(x, pr).flatten(2).transpose(1, 2)  # [B*C, tokens, d]
        tok = tok.reshape(b, c, -1, tok.shape[-1]) + self.image_pos
        tok = tok.reshape(b, -1, tok.shape[-1])
        if self.cfg.state_dim == 0:
            state = torch.zeros(b, 1, device=images.device)
        st = self.state_features(state, pr)[:, None, :]
        return self.cond_norm(torch.cat([tok, st, pr[:, None, :]], dim=1))

    def state_features(self, state: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        """The state token [B, d] of state [B, S] (``prompt`` [B, d] for a subclass that reads the
        state in the light of the prompt)."""
        return self.state_in(state)

    def image_features(self, x: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        """The stem over camera images [B*C, 3, H, W] in [-1, 1] (robot-major) -> [B*C, d, h, w];
        ``prompt`` [B, d], each robot's prompt embedding, is there for a stem conditioned on it
        (the maze policy's)."""
        return self.stem(x)

    def velocity(self, x: torch.Tensor, t: torch.Tensor, kvs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """x [B, T, A] at time t [B] -> velocity [B, T, A]."""
        h = self.action_in(x) + self.action_pos + self.time_mlp(sinusoid(t, self.cfg.d_model))[:, None]
        for blk, (k, v) in zip(self.blocks, kvs):
            h = blk(h, k, v)
        return self.action_out(self.out_norm(h))

    def sample(self, noise: torch.Tensor, kvs: list[tuple[torch.Tensor, torch.Tensor]], steps: int) -> torch.Tensor:
        """Euler from t = 1 (noise) to t = 0 (actions) in ``steps`` steps."""
        x, dt = noise, -1.0 / steps
        for i in range(steps):
            t = torch.full((x.shape[0],), 1.0 + i * dt, device=x.device)
            x = x + dt * self.velocity(x, t, kvs)
        return x


class FlowMatchingPolicy(PolicyAdapter):
    """The default policy: ``FlowActionModel`` with seeded random weights, batched across robots.

    ``model`` (a trained ``FlowActionModel`` or subclass, e.g. the maze policy) replaces
    the random weights; ``metadata`` then says what that model advertises.
    """

    def __init__(self, cfg: FlowPolicyConfig = FlowPolicyConfig(), *, device: str = "cpu", name: str = "flow-policy",
                 model: FlowActionModel | None = None, metadata: PolicyMetadata | None = None) -> None:
        self.cfg = cfg
        self.name = name
        self.max_batch = cfg.max_batch
        self.metadata = metadata or cfg.metadata()
        self.device = torch.device(device)
        if model is None:
            # Weights from a private CPU generator: identical on every machine and device.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed)
                model = FlowActionModel(cfg)
        self.model = model.to(self.device).eval()
        self.seeds = CallSeeds(cfg.seed)

    def describe(self) -> Mapping[str, Any]:
        params = sum(p.numel() for p in self.model.parameters())
        return {**super().describe(), "device": str(self.device), "parameters": params}

    # ------------------------------------------------------------------ engine thread
    def infer_batch(self, works: Sequence[PolicyWork]) -> list[Mapping[str, Any]]:
        cfg = self.cfg
        images = np.stack([np.stack([w.observation.images[k] for k in cfg.image_keys]) for w in works])
        state = np.stack([w.observation.state for w in works]) if cfg.state_dim else np.zeros((len(works), 1), np.float32)
        buckets = [prompt_buckets(w.observation.prompt) for w in works]
        offsets = np.cumsum([0] + [len(b) for b in buckets[:-1]])
        noise = torch.stack([torch.randn(cfg.action_horizon, cfg.action_dim, generator=self.seeds.generator(w))
                             for w in works])
        dev = self.device
        with torch.inference_mode():
            kvs = self.model.encode(
                torch.from_numpy(images).to(dev, non_blocking=True),
                torch.from_numpy(state).to(dev, non_blocking=True),
                torch.from_numpy(np.concatenate(buckets)).to(dev),
                torch.from_numpy(offsets).to(dev),
            )
            noise = noise.to(dev)
            actions = torch.empty_like(noise)
            # Robots may ask for different step counts: one Euler loop per distinct count,
            # each over its rows of the shared observation K/V.
            steps_of = [w.sampling.num_inference_steps or cfg.num_inference_steps for w in works]
            for steps in sorted(set(steps_of)):
                rows = torch.tensor([i for i, s in enumerate(steps_of) if s == steps], device=dev)
                if len(rows) == len(works):
                    actions = self.model.sample(noise, kvs, steps)
                else:
                    sub = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in kvs]
                    actions[rows] = self.model.sample(noise.index_select(0, rows), sub, steps)
            out = actions.float().cpu().numpy()
        return [{"actions": out[i]} for i in range(len(works))]

    def end_tick(self, session_id: str, committed: bool) -> None:
        self.seeds.end_tick(session_id, committed)

    def drop_session(self, session_id: str) -> None:
        self.seeds.drop_session(session_id)


def build(path: str | None, options: BuildOptions) -> FlowMatchingPolicy:
    """Factory-table entry ``flow`` (the default policy; seeded random weights, no path)."""
    if path is not None:
        raise FactoryError("flow has seeded random weights and takes no path")
    cfg = FlowPolicyConfig() if options.max_batch is None else FlowPolicyConfig(max_batch=options.max_batch)
    return FlowMatchingPolicy(cfg, device=options.device)
