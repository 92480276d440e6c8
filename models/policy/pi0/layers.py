"""One layer of pi0 as a pure function over tensors, the unit that torch.compile traces.

SigLIP's encoder layer (``vision_layer``: layer norm, fused q|k|v, 16-head attention per
image, o, layer norm, gelu MLP) runs over every camera's 256 patches. Both Gemma stacks run
the same layer (norm, fused q|k|v, rope, multi-query attention over a
K/V cache layer, o, norm, gate|up, down); they differ in where their K/V go and which
keys they see::

    prefix  (Gemma-2B):   writes kv[:, :, 0:L]        attends kv[:, :, :L]       (bidirectional, pads hidden:
                                                      a bias per key)
    suffix  (Gemma-300M): writes kv[:, :, L:L+S]      attends kv[:, :, :kv_len]  (pi0's mask as a bias)

Both attend through expert_attention.py's kernel (query heads folded into rows); at the
prefix's 6,528 rows it took 38 us a layer against 53 us for scaled_dot_product_attention
(bench/results/pi0_prefix_profile_h200.json).

Residuals: a layer takes the residual stream as ``x + pending`` and returns (the stream after
its attention, its MLP's output), so the MLP's residual add happens at the top of the next
layer, in the same compiled function as that layer's norm, which inductor fuses with it: one
add kernel less per layer but the last, against one memset per stack pass for the first
layer's ``pending`` (zeros); after the last layer the caller adds it (``run_stack``).

The weights arrive as a ``LayerWeights`` tuple rather than through the module, so that a
compiled layer is traced once per stack and reused by all 18 layers (a module argument
would be guarded on its identity and recompiled per layer). ``kv`` is one layer of the
cache, ``[2, B, kv_len, head_dim]``: one argument, so the compiled function never sees two
aliasing inputs; it writes its keys in place, which torch.compile keeps as a fused store.

``weight_stream`` (default True) lets the Gemma layers' matmuls stream their weights where
skinny_linear.py finds that faster; False is ``F.linear`` throughout (the benchmarks' cuBLAS row).
It is an argument of the layer functions, so a compiled layer is traced per value.

``compiled()`` wraps the two layer functions with ``torch.compile`` (inductor, no
cudagraphs of its own: the runner captures the whole call in its own CUDA graph, see
runner.py). Inductor fuses the element-wise work of a layer (rms-norm, rope and the K/V
store, residual adds, gelu * up) into a few kernels, which is what the expert's 10 steps
x 18 layers at batch 1 are bound by (launches, not arithmetic).
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from models.policy.pi0.config import LAYER_NORM_EPS, RMS_EPS
from models.policy.pi0.expert_attention import expert_attention
from models.policy.pi0.gemma import apply_rope
from models.policy.pi0.skinny_linear import geglu, linear

log = logging.getLogger(__name__)


class LayerWeights(NamedTuple):
    """A fused Gemma layer (gemma.py's ``fuse``): norm scales are ``1 + weight``."""

    in_scale: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    post_scale: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def project(x: torch.Tensor, w: LayerWeights, kv: torch.Tensor, start: int, cos: torch.Tensor, sin: torch.Tensor,
            nh: int, weight_stream: bool = True) -> torch.Tensor:
    """Norm, q|k|v, rope; k and v stored at ``kv[:, :, start:start+T]`` -> rotated q [B, T, H, D]."""
    b, t, width = x.shape
    d = kv.shape[-1]
    h = F.rms_norm(x, (width,), w.in_scale, RMS_EPS)
    qkv = linear(h, w.qkv, weight_stream).view(b, t, nh + 2, d)
    # The rotated key and the value in one store, the key rotated there again rather than read
    # back from the queries' rotation (0.96x the call at 8 robots: MODEL_CARD.md).
    kv[:, :, start:start + t] = torch.stack((apply_rope(qkv[:, :, nh:nh + 1], cos, sin)[:, :, 0], qkv[:, :, nh + 1]))
    return apply_rope(qkv[:, :, :nh], cos, sin)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Multi-query attention with the query heads folded into the rows, through
    ``scaled_dot_product_attention`` (the library kernels ``expert_attention`` is measured against).

    With one K/V head, H heads over T tokens are one head over T * H rows (row
    t * H + h is token t's head h), so q [B, T, H, D] becomes [B, 1, T*H, D] with no
    transpose, K/V [B, L, D] need no copy per head, and the output reshapes straight to
    [B, T, H * D]. ``bias`` [B, 1, T*H or 1, L]: 0 where visible, -inf where hidden."""
    b, t, h, d = q.shape
    out = F.scaled_dot_product_attention(q.reshape(b, 1, t * h, d), k[:, None], v[:, None], attn_mask=bias)
    return out.view(b, t, h * d)


def finish(x: torch.Tensor, att: torch.Tensor, w: LayerWeights,
           weight_stream: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """o projection, residual, norm, gelu-gated MLP (``skinny_linear``'s matmuls: a weight stream
    at the expert's few rows on CUDA, ``F.linear`` otherwise) -> (the residual stream after the
    attention, the MLP's output): the MLP's residual add is the next layer's (see "Residuals")."""
    x = x + linear(att, w.o, weight_stream)
    h = F.rms_norm(x, (x.shape[-1],), w.post_scale, RMS_EPS)
    return x, linear(geglu(h, w.gate_up, weight_stream), w.down, weight_stream)


def prefix_layer(x: torch.Tensor, pending: torch.Tensor, w: LayerWeights, kv: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, bias: torch.Tensor, nh: int,
                 weight_stream: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """A Gemma-2B layer over the prefix ``x + pending`` [B, L, W]: K/V to ``kv[:, :, :L]``, which it
    attends -> (residual, MLP output), as ``finish``."""
    x = x + pending
    length = x.shape[1]
    q = project(x, w, kv, 0, cos, sin, nh, weight_stream)
    return finish(x, expert_attention(q, kv[0, :, :length], kv[1, :, :length], bias), w, weight_stream)


def expert_layer(x: torch.Tensor, pending: torch.Tensor, w: LayerWeights, kv: torch.Tensor, start: int,
                 cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor, nh: int,
                 weight_stream: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """A Gemma-300M layer over the suffix ``x + pending`` [B, S, W]: K/V to ``kv[:, :, start:start+S]``;
    attends all of kv -> (residual, MLP output), as ``finish``."""
    x = x + pending
    q = project(x, w, kv, start, cos, sin, nh, weight_stream)
    return finish(x, expert_attention(q, kv[0], kv[1], bias), w, weight_stream)


class VisionWeights(NamedTuple):
    """A SigLIP encoder layer with q|k|v as one matrix (model.py's ``_VisionTower.fuse``)."""

    ln1: torch.Tensor
    ln1_b: torch.Tensor
    qkv: torch.Tensor
    qkv_b: torch.Tensor
    o: torch.Tensor
    o_b: torch.Tensor
    ln2: torch.Tensor
    ln2_b: torch.Tensor
    fc1: torch.Tensor
    fc1_b: torch.Tensor
    fc2: torch.Tensor
    fc2_b: torch.Tensor


def vision_layer(x: torch.Tensor, pending: torch.Tensor, w: VisionWeights,
                 nh: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``SiglipEncoderLayer`` over ``x + pending`` [N, T, W] (N images): the same
    maths, one q|k|v matmul where it runs three -> (residual, MLP output), as ``finish``."""
    x = x + pending
    n, t, width = x.shape
    h = F.layer_norm(x, (width,), w.ln1, w.ln1_b, LAYER_NORM_EPS)
    q, k, v = F.linear(h, w.qkv, w.qkv_b).view(n, t, 3, nh, width // nh).permute(2, 0, 3, 1, 4).unbind(0)
    att = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, t, width)
    x = x + F.linear(att, w.o, w.o_b)
    h = F.layer_norm(x, (width,), w.ln2, w.ln2_b, LAYER_NORM_EPS)
    return x, F.linear(F.gelu(F.linear(h, w.fc1, w.fc1_b), approximate="tanh"), w.fc2, w.fc2_b)


# A layer function: (x, pending, *args) -> (residual, MLP output) (see "Residuals").
Layer = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def run_stack(layer: Layer, x: torch.Tensor, per_layer: list[tuple]) -> torch.Tensor:
    """``layer(x, pending, *args)`` over each layer's ``args`` in ``per_layer`` -> the residual
    stream after the last one (its MLP output added)."""
    pending = torch.zeros_like(x)
    for args in per_layer:
        x, pending = layer(x, pending, *args)
    return x + pending


class LayerFns(NamedTuple):
    prefix: Layer
    expert: Layer
    vision: Layer
    compiled: bool
    weight_stream: bool = True  # see "weight_stream" above; SigLIP's layers never stream


def _bound(fns: LayerFns, weight_stream: bool) -> LayerFns:
    """``fns`` with the Gemma layers' ``weight_stream`` fixed (the default, True, needs no binding)."""
    if weight_stream:
        return fns
    return fns._replace(prefix=functools.partial(fns.prefix, weight_stream=False),
                        expert=functools.partial(fns.expert, weight_stream=False), weight_stream=False)


def eager(weight_stream: bool = True) -> LayerFns:
    """The three layer functions as written."""
    return _bound(LayerFns(prefix_layer, expert_layer, vision_layer, False), weight_stream)


EAGER = eager()


def compiled(backend: str = "inductor", *, weight_stream: bool = True) -> LayerFns:
    """The three layer functions under ``torch.compile`` (traced on first use; see the module docstring).

    ``fullgraph=True``: a graph break would silently cost the fusion, so it fails instead and
    the runner falls back to ``EAGER``. ``backend="aot_eager"`` traces without code
    generation (the CPU tests' check that the layers trace whole). ``dynamic=None``: batch 1 compiles specialised, the
    first larger bucket compiles one graph symbolic in the batch that serves all the others."""
    opts = {"fullgraph": True, "dynamic": None, "backend": backend}
    return _bound(LayerFns(torch.compile(prefix_layer, **opts), torch.compile(expert_layer, **opts),
                           torch.compile(vision_layer, **opts), True), weight_stream)
