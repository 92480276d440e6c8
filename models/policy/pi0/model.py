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
from models.policy.pi0.gemma import GemmaLayer, GemmaStack, rope, stack_and_view
from models.policy.pi0.layers import EAGER, LayerFns, LayerWeights, VisionWeights, project, run_stack


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
        self.heads = vcfg.num_attention_heads
        self._weights: tuple[VisionWeights, ...] | None = None  # set by fuse()

    def fuse(self) -> None:
        """Each encoder layer as ``VisionWeights`` (q|k|v stacked; the named parameters become views)."""
        if self._weights is not None:
            return
        weights = []
        for layer in self.vision_model.encoder.layers:
            att, mlp = layer.self_attn, layer.mlp
            qkv = (att.q_proj, att.k_proj, att.v_proj)
            weights.append(VisionWeights(
                layer.layer_norm1.weight, layer.layer_norm1.bias,
                stack_and_view(*qkv), stack_and_view(*qkv, attr="bias"), att.out_proj.weight, att.out_proj.bias,
                layer.layer_norm2.weight, layer.layer_norm2.bias, mlp.fc1.weight, mlp.fc1.bias,
                mlp.fc2.weight, mlp.fc2.bias))
        self._weights = tuple(weights)

    def forward(self, pixels: torch.Tensor, fns: LayerFns = EAGER) -> torch.Tensor:
        """pixels [N, 3, H, W] -> [N, patches, hidden]: transformers' embeddings and final
        norm around ``fns.vision`` (layers.py), the encoder's layers."""
        self.fuse()
        vm = self.vision_model
        x = run_stack(fns.vision, vm.embeddings(pixels), [(w, self.heads) for w in self._weights])
        return vm.post_layernorm(x)


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
        # Set by fuse(): per-layer weight tuples, the action half of action_time_mlp_in,
        # and per step count the time half (time_bias).
        self._weights: tuple[tuple[LayerWeights, ...], tuple[LayerWeights, ...]] | None = None
        self._time_in_a: torch.Tensor | None = None
        self._time_bias: dict[int, torch.Tensor] = {}

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
    def embed_images(self, pixels: torch.Tensor, fns: LayerFns = EAGER) -> torch.Tensor:
        """pixels [N, 3, H, W] in [-1, 1] -> [N, tokens_per_image, vlm width]."""
        pg = self.paligemma_with_expert.paligemma.model
        feats = pg.vision_tower(pixels.to(self.dtype), fns)
        # No 1/sqrt(width) here and no sqrt(width) on the sequence: openpi scales only
        # the text embedding (transformers' PaliGemma divides images by what its Gemma
        # then multiplies back, which nets to the same).
        return pg.multi_modal_projector.linear(feats)

    def embed_prefix(self, images: torch.Tensor, present: tuple[int, ...], tokens: torch.Tensor,
                     token_valid: torch.Tensor, fns: LayerFns = EAGER) -> tuple[torch.Tensor, torch.Tensor]:
        """images [B, len(present), 3, H, W] of the cameras in ``present`` (slots of
        ``cfg.image_features``); tokens/token_valid [B, T] -> (embs [B, L, W], pad [B, L]).

        A missing camera is pi0's -1 image with mask false: its tokens are never seen
        by a real token, so zeros stand in for them and SigLIP does not run on them."""
        cfg, b = self.cfg, tokens.shape[0]
        n, width = cfg.tokens_per_image, cfg.vlm.width
        dev = tokens.device
        feats = self.embed_images(images.flatten(0, 1), fns).view(b, len(present), n, width) if present else None
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

    def prefix_kv(self, embs: torch.Tensor, pad: torch.Tensor, kv: torch.Tensor, fns: LayerFns = EAGER) -> None:
        """Run Gemma-2B over the prefix; write each layer's rotated K and V into
        ``kv[layer, 0 / 1, :, :L]`` (kv: [depth, 2, B, kv_len, head_dim], one K/V head).
        ``fns``: the layer functions (layers.py), eager or compiled."""
        spec = self.cfg.vlm
        weights = self.layer_weights()[0]
        # The prefix is bidirectional: only padding keys are hidden. A padding query sees
        # the real keys (at least <bos>), so no row is empty and no NaN is made.
        bias = _bias(pad[:, None, None, :], self.dtype)
        cos, sin = rope(torch.cumsum(pad.long(), dim=1) - 1, spec.head_dim, self.dtype)
        x = run_stack(fns.prefix, embs, [(w, kv[i], cos, sin, bias, spec.num_heads)
                                         for i, w in enumerate(weights[:-1])])
        # The last layer's output feeds nothing the actions use: its K/V are all that is needed.
        project(x, weights[-1], kv[len(weights) - 1], 0, cos, sin, spec.num_heads, fns.weight_stream)

    # ------------------------------------------------------------------ suffix
    def velocity(self, x_t: torch.Tensor, step_bias: torch.Tensor, state_emb: torch.Tensor, kv: torch.Tensor,
                 bias: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fns: LayerFns = EAGER) -> torch.Tensor:
        """One expert pass: x_t [B, chunk, A] float32 -> velocity [B, chunk, A] float32.

        ``step_bias`` [W] is this step's row of ``time_bias`` (the time half of
        ``action_time_mlp_in``); ``state_emb`` [B, 1, W] and the attention inputs are the
        same for every step."""
        cfg, spec = self.cfg, self.cfg.expert
        weights = self.layer_weights()[1]
        a = self.action_in_proj(x_t.to(self.dtype))
        # action_time_mlp_in(cat[a, time]) = W_a a + (W_t time + b); the bracket is per step only.
        at = self.action_time_mlp_out(F.silu(F.linear(a, self._time_in_a, step_bias)))
        x = run_stack(fns.expert, torch.cat([state_emb, at], dim=1),
                      [(w, kv[i], cfg.prefix_len, cos, sin, bias, spec.num_heads) for i, w in enumerate(weights)])
        out = self.expert.norm(x[:, -cfg.chunk_size:])
        return self.action_out_proj(out).float()

    def time_bias(self, steps: int) -> torch.Tensor:
        """[steps, W]: ``W_t time_embedding(t_i) + b`` of ``action_time_mlp_in`` at each Euler
        time t_i = 1 - i / steps (the same for every robot; cached per step count, computed
        outside any graph capture by the runner)."""
        hit = self._time_bias.get(steps)
        if hit is None:
            cfg, w = self.cfg, self.cfg.expert.width
            lin = self.action_time_mlp_in
            # t_i = 1 + i * dt as a float32, as sample()'s clock reads it.
            t = torch.tensor([1.0 + i * (-1.0 / steps) for i in range(steps)], dtype=torch.float32,
                             device=lin.weight.device)
            temb = time_embedding(t, w, cfg.min_period, cfg.max_period).to(self.dtype)
            hit = F.linear(temb, lin.weight[:, w:], lin.bias)
            self._time_bias[steps] = hit
        return hit

    def suffix_inputs(self, state: torch.Tensor, prefix_pad: torch.Tensor,
                      ar: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The step-invariant suffix inputs: (state_emb, attention bias, cos, sin).

        ``ar`` [B, L+S]: 0 for the prefix, then ``suffix_ar`` (a device tensor made once,
        so that this runs inside a CUDA graph capture)."""
        cfg = self.cfg
        mask = suffix_mask(prefix_pad, ar, cfg.suffix_len, cfg.kv_len)
        # Query rows are (token, head) pairs, token-major: see layers.attend.
        bias = _bias(mask.repeat_interleave(cfg.expert.num_heads, dim=1)[:, None], self.dtype)
        pos = prefix_pad.long().sum(dim=1, keepdim=True) + torch.arange(cfg.suffix_len, device=prefix_pad.device)[None]
        cos, sin = rope(pos, cfg.expert.head_dim, self.dtype)
        state_emb = self.state_proj(state.to(self.dtype))[:, None, :]
        return state_emb, bias, cos, sin

    def sample(self, noise: torch.Tensor, steps: int, state_emb: torch.Tensor, kv: torch.Tensor,
               bias: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fns: LayerFns = EAGER) -> torch.Tensor:
        """Euler from t = 1 (noise) to t = 0 in ``steps`` steps -> actions [B, chunk, A] float32."""
        x, dt = noise.float(), -1.0 / steps
        tb = self.time_bias(steps)
        for i in range(steps):
            x = euler_step(x, self.velocity(x, tb[i], state_emb, kv, bias, cos, sin, fns), dt)
        return x

    def kv_buffer(self, batch: int, device: torch.device | str) -> torch.Tensor:
        spec, cfg = self.cfg.vlm, self.cfg
        return torch.zeros(spec.depth, 2, batch, cfg.kv_len, spec.head_dim, dtype=self.dtype, device=device)

    def fuse(self) -> None:
        """Fused q|k|v and gate|up matrices (views keep the checkpoint's names); see gemma.py.
        Also the action half of ``action_time_mlp_in`` as its own matrix (``velocity``).
        Idempotent: policies sharing one model keep pointing at the same fused tensors,
        which their captured CUDA graphs read."""
        if self._weights is not None:
            return
        for stack in (self.vlm, self.expert):
            for layer in stack.layers:
                layer.fuse()
            stack.norm.fuse()
        self.paligemma_with_expert.paligemma.model.vision_tower.fuse()
        w = self.cfg.expert.width
        self._time_in_a = self.action_time_mlp_in.weight.detach()[:, :w].contiguous()
        self._time_bias.clear()
        self._weights = tuple(tuple(_layer_weights(layer) for layer in stack.layers) for stack in (self.vlm, self.expert))

    def layer_weights(self) -> tuple[tuple[LayerWeights, ...], tuple[LayerWeights, ...]]:
        """(Gemma-2B's, the expert's) layers as ``LayerWeights``; fuses on first use."""
        if self._weights is None:
            self.fuse()
        return self._weights


def _layer_weights(layer: GemmaLayer) -> LayerWeights:
    return LayerWeights(layer.input_layernorm.scale, layer.self_attn.qkv, layer.self_attn.o_proj.weight,
                        layer.post_attention_layernorm.scale, layer.mlp.gate_up, layer.mlp.down_proj.weight)


def suffix_mask(prefix_pad: torch.Tensor, ar: torch.Tensor, suffix_len: int, kv_len: int) -> torch.Tensor:
    """The suffix's rows of pi0's mask: [B, S, kv_len] bool, alignment columns hidden."""
    b = prefix_pad.shape[0]
    suffix_pad = torch.ones(b, suffix_len, dtype=torch.bool, device=prefix_pad.device)
    full = make_att_2d_masks(torch.cat([prefix_pad, suffix_pad], dim=1), ar)[:, -suffix_len:, :]
    return F.pad(full, (0, kv_len - full.shape[-1]), value=False)


def euler_step(x: torch.Tensor, v: torch.Tensor, dt: float) -> torch.Tensor:
    return torch.add(x, v, alpha=dt)  # x + dt * v in one kernel


def _bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool mask -> additive bias (fill kernels only: this runs inside graph captures)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
