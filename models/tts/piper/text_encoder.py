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

``products``: the number format of the Q/K/V and feed-forward products (the
encoder's time, ``models.cpu_format``); attention itself, the output projection
and the final projection to the prior's statistics stay float32.

The result equals ``VitsTextEncoder.forward`` up to float rounding (the dense
form adds the same products plus exact zeros; the sums run in another order);
``tests/models/tts_piper/test_tts_text_encoder.py`` asserts it, padded batches included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from models.tts.piper.conv_matmul import ConvAsMatmul, product


@dataclass
class EncoderOutput:
    """``hidden`` [B, T, H], ``means`` and ``log_variances`` [B, T, C]; with
    ``rows``, only the first ``rows`` positions, and ``last_input`` [B, T_in, H]
    (the last layer's input) for ``TextEncoder.rest``."""

    hidden: torch.Tensor
    means: torch.Tensor
    log_variances: torch.Tensor
    last_input: torch.Tensor | None = None


class _Layer:
    """One ``VitsEncoderLayer``'s weights in the forms ``_layer`` uses."""

    def __init__(self, layer: nn.Module, products: torch.dtype) -> None:
        attn, ff = layer.attention, layer.feed_forward
        self.attention = attn
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        # q is scaled after its bias, as VitsAttention does: fold the scale into both.
        scales = (attn.scaling, 1.0, 1.0)
        self.qkv_weight = torch.cat([p.weight.detach() * s for p, s in zip(projections, scales)]).T.contiguous().to(products)
        self.qkv_bias = (
            None if attn.q_proj.bias is None else torch.cat([p.bias.detach() * s for p, s in zip(projections, scales)])
        )
        pad = (0, 0) if ff.padding is None else (ff.padding[0], ff.padding[1])
        self.conv_1 = ConvAsMatmul(ff.conv_1, *pad, products)
        self.conv_2 = ConvAsMatmul(ff.conv_2, *pad, products)
        self.act_fn = ff.act_fn
        self.layer_norm = layer.layer_norm
        self.final_layer_norm = layer.final_layer_norm


class TextEncoder:
    """``VitsTextEncoder.forward`` over the module's own weights (see the module doc)."""

    def __init__(self, text_encoder: nn.Module, products: torch.dtype = torch.float32) -> None:
        self.module = text_encoder
        self.layers = [_Layer(layer, products) for layer in text_encoder.encoder.layers]
        self.project = ConvAsMatmul(text_encoder.project, 0, 0)
        convs = (self.layers[-1].conv_1, self.layers[-1].conv_2)
        # Rows beyond a slice that the last layer's feed-forward reads (1 per "same" conv).
        self.ffn_reach = sum(c.pad[1] for c in convs)
        self._splittable = all(c.pad[0] == c.pad[1] == (c.kernel - 1) // 2 and c.dilation == 1 for c in convs)

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, padding_mask: torch.Tensor, rows: int | None = None) -> EncoderOutput:
        """``input_ids`` [B, T] whose item b is valid where ``padding_mask`` [B, T, 1] is 1.

        ``rows``: the outputs of the first ``rows`` positions only. Attention is
        global, so every layer but the last still runs over all positions; the
        last one runs its queries and feed-forward over the first rows (plus
        the feed-forward's reach) and ``rest`` does the others later."""
        te = self.module
        h = te.embed_tokens(input_ids) * math.sqrt(te.config.hidden_size)
        key_bias = _key_bias(padding_mask)
        h = h * padding_mask
        for layer in self.layers[:-1]:
            h = _layer(layer, h, padding_mask, key_bias)
        length = h.shape[1]
        if rows is None or not self._splittable or rows + self.ffn_reach >= length:
            return self._finish(_layer(self.layers[-1], h, padding_mask, key_bias), padding_mask)
        out = _layer_rows(self.layers[-1], h, padding_mask, key_bias, 0, rows, self.ffn_reach)
        result = self._finish(out, padding_mask[:, :rows])
        result.last_input = h
        return result

    @torch.inference_mode()
    def rest(self, last_input: torch.Tensor, start: int) -> EncoderOutput:
        """Positions [start, T) of one unpadded sentence whose first ``start`` came
        from ``__call__(..., rows=start)``; ``last_input`` [1, T, H] is its ``last_input``."""
        if not 0 < start < last_input.shape[1]:
            raise ValueError("rest from position %d of a %d-id sentence" % (start, last_input.shape[1]))
        mask = last_input.new_ones(1, last_input.shape[1], 1)
        out = _layer_rows(self.layers[-1], last_input, mask, None, start, last_input.shape[1], self.ffn_reach)
        return self._finish(out, mask[:, start:])

    def _finish(self, h: torch.Tensor, padding_mask: torch.Tensor) -> EncoderOutput:
        h = h * padding_mask
        stats = self.project(h) * padding_mask
        means, log_variances = torch.split(stats, self.module.config.flow_size, dim=2)
        return EncoderOutput(h, means, log_variances)


def _layer(layer: _Layer, h: torch.Tensor, padding_mask: torch.Tensor, key_bias: torch.Tensor | None) -> torch.Tensor:
    h = layer.layer_norm(h + band_attention(layer, h, key_bias))
    # VitsFeedForward: mask, conv, act, mask, conv, mask (the convs' zero padding
    # is the pad ConvAsMatmul adds).
    x = layer.act_fn(layer.conv_1(h * padding_mask)) * padding_mask
    return layer.final_layer_norm(h + layer.conv_2(x) * padding_mask)


def _layer_rows(
    layer: _Layer,
    h: torch.Tensor,
    padding_mask: torch.Tensor,
    key_bias: torch.Tensor | None,
    lo: int,
    hi: int,
    reach: int,
) -> torch.Tensor:
    """Rows [lo, hi) of ``_layer(layer, h, ...)``: queries for [lo - reach, hi + reach)
    (clipped) against every key, then the two "same" convs, each zero-padded
    only at the sequence's own ends and one row shorter on each inner end::

        attention rows   [a .................................. b)     a = lo - 2, b = hi + 2
        conv_1 rows          [a + 1 ....................... b - 1)   (a = 0: from 0)
        conv_2 rows              [lo ................... hi)
    """
    length = h.shape[1]
    a, b = max(0, lo - reach), min(length, hi + reach)
    x = layer.layer_norm(h[:, a:b] + band_attention(layer, h, key_bias, (a, b)))
    # VitsFeedForward as in _layer: mask, conv, act, mask, conv, mask.
    y, ya, yb = x * padding_mask[:, a:b], a, b
    for i, conv in enumerate((layer.conv_1, layer.conv_2)):
        left, right = conv.pad
        pad = (left if ya == 0 else 0, right if yb == length else 0)
        y = conv(y, pad)
        ya, yb = ya + left - pad[0], yb - right + pad[1]
        y = (layer.act_fn(y) if i == 0 else y) * padding_mask[:, ya:yb]
    # x holds rows [a, b), y rows [ya, yb); both cover [lo, hi).
    return layer.final_layer_norm(x[:, lo - a : hi - a] + y[:, lo - ya : hi - ya])


def band_attention(
    layer: _Layer, hidden: torch.Tensor, key_bias: torch.Tensor | None, rows: tuple[int, int] | None = None
) -> torch.Tensor:
    """``VitsAttention.forward(hidden)`` (self-attention) with the relative terms
    on their band. ``key_bias`` [B, 1, 1, T]: 0 for real keys, the dtype's
    minimum for padding (None when nothing is padded). ``rows`` = (a, b): the
    outputs of queries [a, b) only, against every key."""
    attn = layer.attention
    bsz, length, embed = hidden.shape
    heads, d = attn.num_heads, attn.head_dim
    a, b = (0, length) if rows is None else rows
    qkv = product(hidden, layer.qkv_weight)
    if layer.qkv_bias is not None:
        qkv = qkv + layer.qkv_bias
    q, k, v = qkv.view(bsz, length, 3, heads, d).permute(2, 0, 3, 1, 4)  # each [B, h, T, d]
    q = q[:, :, a:b]
    n = b - a
    logits = torch.matmul(q, k.transpose(-2, -1))  # [B, h, n, T]
    window = attn.window_size or 0
    reach = min(window, length - 1)
    if window:
        band = torch.matmul(q, attn.emb_rel_k[0].transpose(0, 1))  # [B, h, n, 2w + 1]
        for o in range(-reach, reach + 1):
            # logits[r, a + r + o] += band[r, o + w] for the rows r that have that key.
            diag = a + o
            rows_o = slice(max(0, -diag), min(n, length - diag))
            logits.diagonal(diag, dim1=-2, dim2=-1).add_(band[:, :, rows_o, o + window])
    if key_bias is not None:
        logits = logits + key_bias
    probs = torch.softmax(logits, dim=-1)
    out = torch.matmul(probs, v)  # [B, h, n, d]
    if window:
        weights = probs.new_zeros(bsz, heads, n, 2 * window + 1)
        for o in range(-reach, reach + 1):
            diag = a + o
            rows_o = slice(max(0, -diag), min(n, length - diag))
            weights[:, :, rows_o, o + window] = probs.diagonal(diag, dim1=-2, dim2=-1)
        out = out + torch.matmul(weights, attn.emb_rel_v[0])
    return attn.out_proj(out.transpose(1, 2).reshape(bsz, n, embed))


def _key_bias(padding_mask: torch.Tensor) -> torch.Tensor | None:
    """[B, T, 1] float padding mask -> additive key bias, None without padding."""
    if bool(padding_mask.min() > 0):
        return None
    keep = padding_mask[:, :, 0] > 0
    bias = torch.zeros(keep.shape, dtype=padding_mask.dtype, device=padding_mask.device)
    bias.masked_fill_(~keep, torch.finfo(padding_mask.dtype).min)
    return bias[:, None, None, :]
