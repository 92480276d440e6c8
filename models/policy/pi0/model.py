"""pi0 (Black et al. 2024): a PaliGemma prefix and a Gemma action expert trained by flow matching.

The module tree reproduces LeRobot's ``PI0Pytorch`` parameter names exactly (the
loader prefixes them with ``model.``)::

    paligemma_with_expert.paligemma.model.vision_tower.vision_model.*   SigLIP (transformers' SiglipVisionModel)
    paligemma_with_expert.paligemma.model.multi_modal_projector.linear  1152 -> 2048
    paligemma_with_expert.paligemma.model.language_model.*              Gemma-2B (embed_tokens, layers, norm)
    paligemma_with_expert.gemma_expert.model.*                          Gemma-300M (layers, norm; no embedding)
    state_proj, action_in_proj, action_time_mlp_in/_out, action_out_proj

One call::

    cameras  --SigLIP + projector-->  C x 256 image tokens ─┐
    prompt   --embed * sqrt(2048)-->  48 prompt tokens     ─┴─> prefix [B, C*256+48]
        Gemma-2B over the prefix once: per layer K, V  ->  kv [depth, 2, B, kv_len, 256]
        (kv_len: prefix + suffix rounded up to 16; one K/V head)
    x_1 = noise [B, 50, 32]; Euler t = 1 -> 0 in ``steps`` steps, dt = -1/steps:
        suffix = [state_proj(state), mlp(action_in_proj(x_t) ++ time(t))]   [B, 51, 1024]
        Gemma-300M layer l attends to kv[l]'s prefix and its own 51 tokens  ->  v = action_out_proj(...)
        x_{t+dt} = x_t + dt * v

Attention (``make_att_2d_masks``, pi0's): token i sees token j iff both are real
(not padding) and ``cumsum(ar)[j] <= cumsum(ar)[i]``, with ``ar`` = 0 for every
prefix token, 1 for the state token, 1 for the first action and 0 for the other
actions. So the prefix is bidirectional and never sees the suffix; the state sees
the prefix and itself; the actions see the prefix, the state and each other.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import SiglipVisionConfig, SiglipVisionModel

from models.policy.pi0.config import LAYER_NORM_EPS, Pi0Config
from models.policy.pi0.gemma import GemmaLayer, GemmaStack, apply_rope, rope


def make_att_2d_masks(pad: torch.Tensor, ar: torch.Tensor) -> torch.Tensor:
    """pad [B, N] bool (real token), ar [B, N] int -> [B, N, N] bool, True where query i may see key j."""
    cum = torch.cumsum(ar.long(), dim=1)
    return (cum[:, None, :] <= cum[:, :, None]) & pad[:, None, :] & pad[:, :, None]


def time_embedding(t: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """t [B] -> [B, dim]: sin then cos of t * 2pi / period, periods geometric from min to max."""
    if dim % 2:
        raise ValueError(f"time embedding dim must be even, got {dim}")
    frac = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** frac
    angle = (2.0 * math.pi / period)[None, :] * t.double()[:, None]
    return torch.cat([angle.sin(), angle.cos()], dim=1).float()


def suffix_ar(chunk: int) -> list[int]:
    """The suffix's ``ar`` values: a new block for the state, one block for all actions."""
    return [1, 1] + [0] * (chunk - 1)


class _Projector(nn.Module):
    def __init__(self, cfg: Pi0Config) -> None:
        super().__init__()
        self.linear = nn.Linear(cfg.vision.hidden, cfg.vlm.width)


class _VisionTower(nn.Module):
    """``vision_tower.vision_model.{embeddings, encoder, post_layernorm}``, LeRobot's names.

    transformers < 5.2x nests SigLIP's transformer as ``SiglipVisionModel.vision_model``;
    later versions flattened it (and rename old keys on load). Either way the
    transformer sits here under ``vision_model``, so the checkpoint's keys load as saved."""

    def __init__(self, vcfg: SiglipVisionConfig) -> None:
        super().__init__()
        outer = SiglipVisionModel(vcfg)
        self.vision_model = getattr(outer, "vision_model", outer)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.vision_model(pixel_values=pixels).last_hidden_state


class _PaliGemmaModel(nn.Module):
    def __init__(self, cfg: Pi0Config) -> None:
        super().__init__()
        v = cfg.vision
        vcfg = SiglipVisionConfig(
            hidden_size=v.hidden, intermediate_size=v.intermediate, num_hidden_layers=v.layers,
            num_attention_heads=v.heads, patch_size=v.patch, image_size=cfg.image_resolution[0],
            hidden_act="gelu_pytorch_tanh", layer_norm_eps=LAYER_NORM_EPS, vision_use_head=False,
        )
        vcfg._attn_implementation = "sdpa"
        self.vision_tower = _VisionTower(vcfg)
        self.multi_modal_projector = _Projector(cfg)
        self.language_model = GemmaStack(cfg.vlm, cfg.vocab_size)


class _PaliGemma(nn.Module):
    def __init__(self, cfg: Pi0Config) -> None:
        super().__init__()
        self.model = _PaliGemmaModel(cfg)


class _Expert(nn.Module):
    def __init__(self, cfg: Pi0Config) -> None:
        super().__init__()
        self.model = GemmaStack(cfg.expert, None)


class _PaliGemmaWithExpert(nn.Module):
    def __init__(self, cfg: Pi0Config) -> None:
        super().__init__()
        self.paligemma = _PaliGemma(cfg)
        self.gemma_expert = _Expert(cfg)


class Pi0Model(nn.Module):
    """The network; ``Pi0Policy`` (policy.py) feeds it robots' observations."""

    def __init__(self, cfg: Pi0Config) -> None:
        super().__init__()
        self.cfg = cfg
        w = cfg.expert.width
        self.paligemma_with_expert = _PaliGemmaWithExpert(cfg)
        self.state_proj = nn.Linear(cfg.max_state_dim, w)
        self.action_in_proj = nn.Linear(cfg.max_action_dim, w)
        self.action_time_mlp_in = nn.Linear(2 * w, w)
        self.action_time_mlp_out = nn.Linear(w, w)
        self.action_out_proj = nn.Linear(w, cfg.max_action_dim)

    @property
    def vlm(self) -> GemmaStack:
        return self.paligemma_with_expert.paligemma.model.language_model

    @property
    def expert(self) -> GemmaStack:
        return self.paligemma_with_expert.gemma_expert.model

    @property
    def dtype(self) -> torch.dtype:
        return self.action_in_proj.weight.dtype

    # ------------------------------------------------------------------ prefix
    def embed_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, 3, H, W] in [-1, 1] -> [N, tokens_per_image, vlm width]."""
        pg = self.paligemma_with_expert.paligemma.model
        feats = pg.vision_tower(pixels.to(self.dtype))
        # No 1/sqrt(width) here and no sqrt(width) on the sequence: openpi scales only
        # the text embedding (transformers' PaliGemma divides images by what its Gemma
        # then multiplies back, which nets to the same).
        return pg.multi_modal_projector.linear(feats)

    def embed_prefix(self, images: torch.Tensor, present: tuple[int, ...], tokens: torch.Tensor,
                     token_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """images [B, len(present), 3, H, W] of the cameras in ``present`` (slots of
        ``cfg.image_features``); tokens/token_valid [B, T] -> (embs [B, L, W], pad [B, L]).

        A missing camera is pi0's -1 image with mask false: its tokens are never seen
        by a real token, so zeros stand in for them and SigLIP does not run on them."""
        cfg, b = self.cfg, tokens.shape[0]
        n, width = cfg.tokens_per_image, cfg.vlm.width
        dev = tokens.device
        feats = self.embed_images(images.flatten(0, 1)).view(b, len(present), n, width) if present else None
        # Pieces in the checkpoint's camera order; no index tensors, so this captures in a CUDA graph.
        pieces, pads = [], []
        for slot in range(len(cfg.image_features)):
            if slot in present:
                pieces.append(feats[:, present.index(slot)])
                pads.append(torch.ones(b, n, dtype=torch.bool, device=dev))
            else:
                pieces.append(torch.zeros(b, n, width, dtype=self.dtype, device=dev))
                pads.append(torch.zeros(b, n, dtype=torch.bool, device=dev))
        lang = self.vlm.embed_tokens(tokens) * math.sqrt(width)
        embs = torch.cat([*pieces, lang.to(self.dtype)], dim=1)
        return embs, torch.cat([*pads, token_valid], dim=1)

    def prefix_kv(self, embs: torch.Tensor, pad: torch.Tensor, kv: torch.Tensor) -> None:
        """Run Gemma-2B over the prefix; write each layer's rotated K and V into
        ``kv[layer, 0 / 1, :, :L]`` (kv: [depth, 2, B, kv_len, head_dim], one K/V head)."""
        spec, length = self.cfg.vlm, embs.shape[1]
        # The prefix is bidirectional: only padding keys are hidden. A padding query sees
        # the real keys (at least <bos>), so no row is empty and no NaN is made.
        bias = _bias(pad[:, None, None, :], self.dtype)
        cos, sin = rope(torch.cumsum(pad.long(), dim=1) - 1, spec.head_dim, self.dtype)
        x = embs
        last = len(self.vlm.layers) - 1
        for i, layer in enumerate(self.vlm.layers):
            q, k, v = _qkv(layer, x, spec.num_heads, spec.head_dim, cos, sin)
            kv[i, 0, :, :length] = k
            kv[i, 1, :, :length] = v
            if i == last:
                break  # the last layer's output feeds nothing the actions use
            x = _finish(layer, x, _attend(q, k, v, bias))

    # ------------------------------------------------------------------ suffix
    def velocity(self, x_t: torch.Tensor, t: torch.Tensor, state_emb: torch.Tensor, kv: torch.Tensor,
                 bias: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One expert pass: x_t [B, chunk, A] float32 at time t [B] -> velocity [B, chunk, A] float32.

        ``state_emb`` [B, 1, W] and the attention inputs are the same for every step."""
        cfg, spec, dt = self.cfg, self.cfg.expert, self.dtype
        temb = time_embedding(t, spec.width, cfg.min_period, cfg.max_period).to(dt)
        a = self.action_in_proj(x_t.to(dt))
        at = torch.cat([a, temb[:, None, :].expand_as(a)], dim=2)
        at = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(at)))
        x = torch.cat([state_emb, at], dim=1)
        start, end = cfg.prefix_len, cfg.prefix_len + cfg.suffix_len
        for i, layer in enumerate(self.expert.layers):
            q, k, v = _qkv(layer, x, spec.num_heads, spec.head_dim, cos, sin)
            kv[i, 0, :, start:end] = k
            kv[i, 1, :, start:end] = v
            x = _finish(layer, x, _attend(q, kv[i, 0], kv[i, 1], bias))
        out = self.expert.norm(x[:, -cfg.chunk_size:])
        return self.action_out_proj(out).float()

    def suffix_inputs(self, state: torch.Tensor, prefix_pad: torch.Tensor,
                      ar: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The step-invariant suffix inputs: (state_emb, attention bias, cos, sin).

        ``ar`` [B, L+S]: 0 for the prefix, then ``suffix_ar`` (a device tensor made once,
        so that this runs inside a CUDA graph capture)."""
        cfg = self.cfg
        mask = suffix_mask(prefix_pad, ar, cfg.suffix_len, cfg.kv_len)
        # Query rows are (token, head) pairs, token-major: see _attend.
        bias = _bias(mask.repeat_interleave(cfg.expert.num_heads, dim=1)[:, None], self.dtype)
        pos = prefix_pad.long().sum(dim=1, keepdim=True) + torch.arange(cfg.suffix_len, device=prefix_pad.device)[None]
        cos, sin = rope(pos, cfg.expert.head_dim, self.dtype)
        state_emb = self.state_proj(state.to(self.dtype))[:, None, :]
        return state_emb, bias, cos, sin

    def sample(self, noise: torch.Tensor, steps: int, state_emb: torch.Tensor, kv: torch.Tensor,
               bias: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Euler from t = 1 (noise) to t = 0 in ``steps`` steps -> actions [B, chunk, A] float32."""
        x, dt = noise.float(), -1.0 / steps
        for i in range(steps):
            t = torch.full((x.shape[0],), 1.0 + i * dt, device=x.device)
            x = euler_step(x, self.velocity(x, t, state_emb, kv, bias, cos, sin), dt)
        return x

    def kv_buffer(self, batch: int, device: torch.device | str) -> torch.Tensor:
        spec, cfg = self.cfg.vlm, self.cfg
        return torch.zeros(spec.depth, 2, batch, cfg.kv_len, spec.head_dim, dtype=self.dtype, device=device)

    def fuse(self) -> None:
        """Fused q|k|v and gate|up matrices (views keep the checkpoint's names); see gemma.py."""
        for stack in (self.vlm, self.expert):
            for layer in stack.layers:
                layer.fuse()
            stack.norm.fuse()


def suffix_mask(prefix_pad: torch.Tensor, ar: torch.Tensor, suffix_len: int, kv_len: int) -> torch.Tensor:
    """The suffix's rows of pi0's mask: [B, S, kv_len] bool, alignment columns hidden."""
    b = prefix_pad.shape[0]
    suffix_pad = torch.ones(b, suffix_len, dtype=torch.bool, device=prefix_pad.device)
    full = make_att_2d_masks(torch.cat([prefix_pad, suffix_pad], dim=1), ar)[:, -suffix_len:, :]
    return F.pad(full, (0, kv_len - full.shape[-1]), value=False)


def euler_step(x: torch.Tensor, v: torch.Tensor, dt: float) -> torch.Tensor:
    return x + dt * v


def _qkv(layer: GemmaLayer, x: torch.Tensor, nh: int, d: int, cos: torch.Tensor,
         sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> q [B, T, H, D] and k, v [B, T, D] (one K/V head), q and k rotated."""
    b, t, _ = x.shape
    qkv = layer.self_attn.project(layer.input_layernorm(x)).view(b, t, nh + 2, d)
    qk = apply_rope(qkv[:, :, :nh + 1], cos, sin)
    return qk[:, :, :nh], qk[:, :, nh], qkv[:, :, nh + 1]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Multi-query attention with the query heads folded into the rows.

    With one K/V head, H heads over T tokens are one head over T * H rows (row
    t * H + h is token t's head h), so q [B, T, H, D] becomes [B, 1, T*H, D] with no
    transpose, K/V [B, L, D] need no copy per head, and the output reshapes straight to
    [B, T, H * D]. ``bias`` [B, 1, T*H or 1, L]: 0 where visible, -inf where hidden."""
    b, t, h, d = q.shape
    out = F.scaled_dot_product_attention(q.reshape(b, 1, t * h, d), k[:, None], v[:, None], attn_mask=bias)
    return out.view(b, t, h * d)


def _bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool mask -> additive bias (fill kernels only: this runs inside graph captures)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def _finish(layer: GemmaLayer, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    x = x + layer.self_attn.o_proj(att)
    return x + layer.mlp(layer.post_attention_layernorm(x))
