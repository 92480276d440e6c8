"""The VITS text encoder's forward, rewritten for speed on the model's own weights.

The text encoder is the largest part of a sentence's time to first audio (six
transformer layers over every phoneme id of the sentence, before any duration is
known). Its math is unchanged here; three things ``transformers.VitsTextEncoder``
does slowly are done differently:

1. **Relative-position attention on its band.** VITS adds, for every query i and
   key j with |j - i| <= window (4 for Piper voices), a learned relative term to
   the logits (``q_i . k_rel[j - i]``) and to the output (``p_ij * v_rel[j - i]``).
   transformers computes both as dense [T, 2T - 1] matrices (the relative
   embeddings zero-padded to every offset) and moves between relative and
   absolute indexing by padding and reshaping: three T x T x d products and
   several T x T copies per layer for 2 * window + 1 non-zero diagonals. Here the
   terms go onto those diagonals only::

       logits (T x T)            band (T x 9) = q @ k_rel^T
       x x x x x . . .
       x x x x x x . .           row i of the band goes to logits[i, i - 4 .. i + 4]
       . x x x x x x .           (``diagonal(o)`` views, o = -4 .. 4, clipped at the
       . . x x x x x x            sentence edges, where the dense form adds zeros)

2. **The feed-forward convs as one matrix product each**, time-major
   (``conv_matmul.ConvAsMatmul``): for these shapes (192 -> 768 -> 192 channels,
   a few hundred ids) faster than the oneDNN conv, and no transposes.
3. **Q, K and V in one product** ([C, 3C] weights stacked once at load).

The result equals ``VitsTextEncoder.forward`` up to float rounding (the dense
form adds the same products plus exact zeros; the sums run in another order);
``tests/models/tts/test_tts_text_encoder.py`` asserts it, padded batches included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from models.tts.conv_matmul import ConvAsMatmul


@dataclass
class EncoderOutput:
    """``hidden`` [B, T, H], ``means`` and ``log_variances`` [B, T, C]."""

    hidden: torch.Tensor
    means: torch.Tensor
    log_variances: torch.Tensor


class _Layer:
    """One ``VitsEncoderLayer``'s weights in the forms ``_layer`` uses."""

    def __init__(self, layer: nn.Module) -> None:
        attn, ff = layer.attention, layer.feed_forward
        self.attention = attn
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        # q is scaled after its bias, as VitsAttention does: fold the scale into both.
        scales = (attn.scaling, 1.0, 1.0)
        self.qkv_weight = torch.cat([p.weight.detach() * s for p, s in zip(projections, scales)]).T.contiguous()
        self.qkv_bias = (
            None if attn.q_proj.bias is None else torch.cat([p.bias.detach() * s for p, s in zip(projections, scales)])
        )
        pad = (0, 0) if ff.padding is None else (ff.padding[0], ff.padding[1])
        self.conv_1 = ConvAsMatmul(ff.conv_1, *pad)
        self.conv_2 = ConvAsMatmul(ff.conv_2, *pad)
        self.act_fn = ff.act_fn
        self.layer_norm = layer.layer_norm
        self.final_layer_norm = layer.final_layer_norm


class TextEncoder:
    """``VitsTextEncoder.forward`` over the module's own weights (see the module doc)."""

    def __init__(self, text_encoder: nn.Module) -> None:
        self.module = text_encoder
        self.layers = [_Layer(layer) for layer in text_encoder.encoder.layers]
        self.project = ConvAsMatmul(text_encoder.project, 0, 0)

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, padding_mask: torch.Tensor) -> EncoderOutput:
        """``input_ids`` [B, T] whose item b is valid where ``padding_mask`` [B, T, 1] is 1."""
        te = self.module
        h = te.embed_tokens(input_ids) * math.sqrt(te.config.hidden_size)
        key_bias = _key_bias(padding_mask)
        h = h * padding_mask
        for layer in self.layers:
            h = _layer(layer, h, padding_mask, key_bias)
        h = h * padding_mask
        stats = self.project(h) * padding_mask
        means, log_variances = torch.split(stats, te.config.flow_size, dim=2)
        return EncoderOutput(h, means, log_variances)


def _layer(layer: _Layer, h: torch.Tensor, padding_mask: torch.Tensor, key_bias: torch.Tensor | None) -> torch.Tensor:
    h = layer.layer_norm(h + band_attention(layer, h, key_bias))
    # VitsFeedForward: mask, conv, act, mask, conv, mask (the convs' zero padding
    # is the pad ConvAsMatmul adds).
    x = layer.act_fn(layer.conv_1(h * padding_mask)) * padding_mask
    return layer.final_layer_norm(h + layer.conv_2(x) * padding_mask)


def band_attention(layer: _Layer, hidden: torch.Tensor, key_bias: torch.Tensor | None) -> torch.Tensor:
    """``VitsAttention.forward(hidden)`` (self-attention) with the relative terms
    on their band. ``key_bias`` [B, 1, 1, T]: 0 for real keys, the dtype's
    minimum for padding (None when nothing is padded)."""
    attn = layer.attention
    bsz, length, embed = hidden.shape
    heads, d = attn.num_heads, attn.head_dim
    qkv = torch.matmul(hidden, layer.qkv_weight)
    if layer.qkv_bias is not None:
        qkv = qkv + layer.qkv_bias
    q, k, v = qkv.view(bsz, length, 3, heads, d).permute(2, 0, 3, 1, 4)  # each [B, h, T, d]
    logits = torch.matmul(q, k.transpose(-2, -1))  # [B, h, T, T]
    window = attn.window_size or 0
    reach = min(window, length - 1)
    if window:
        band = torch.matmul(q, attn.emb_rel_k[0].transpose(0, 1))  # [B, h, T, 2w + 1]
        for o in range(-reach, reach + 1):
            # logits[i, i + o] += band[i, o + w] for the rows that have column i + o.
            rows = slice(max(0, -o), length - max(0, o))
            logits.diagonal(o, dim1=-2, dim2=-1).add_(band[:, :, rows, o + window])
    if key_bias is not None:
        logits = logits + key_bias
    probs = torch.softmax(logits, dim=-1)
    out = torch.matmul(probs, v)  # [B, h, T, d]
    if window:
        weights = probs.new_zeros(bsz, heads, length, 2 * window + 1)
        for o in range(-reach, reach + 1):
            rows = slice(max(0, -o), length - max(0, o))
            weights[:, :, rows, o + window] = probs.diagonal(o, dim1=-2, dim2=-1)
        out = out + torch.matmul(weights, attn.emb_rel_v[0])
    return attn.out_proj(out.transpose(1, 2).reshape(bsz, length, embed))


def _key_bias(padding_mask: torch.Tensor) -> torch.Tensor | None:
    """[B, T, 1] float padding mask -> additive key bias, None without padding."""
    if bool(padding_mask.min() > 0):
        return None
    keep = padding_mask[:, :, 0] > 0
    bias = torch.zeros(keep.shape, dtype=padding_mask.dtype, device=padding_mask.device)
    bias.masked_fill_(~keep, torch.finfo(padding_mask.dtype).min)
    return bias[:, None, None, :]
