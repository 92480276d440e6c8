"""The umt5-xxl text encoder from Wan's names (``action_head.text_encoder.*``) into
``transformers.UMT5EncoderModel``.

Wan's T5 encoder and UMT5's are the same network (per-layer relative position buckets,
gated-GELU feed-forward with the tanh GELU, RMS layer norms, unscaled attention); only
the names differ::

    token_embedding.weight                 shared.weight
    blocks.N.norm1.weight                  encoder.block.N.layer.0.layer_norm.weight
    blocks.N.attn.{q,k,v,o}.weight         encoder.block.N.layer.0.SelfAttention.{q,k,v,o}.weight
    blocks.N.pos_embedding.embedding.weight  encoder.block.N.layer.0.SelfAttention.relative_attention_bias.weight
    blocks.N.norm2.weight                  encoder.block.N.layer.1.layer_norm.weight
    blocks.N.ffn.gate.0.weight             encoder.block.N.layer.1.DenseReluDense.wi_0.weight   (GELU side)
    blocks.N.ffn.fc1.weight                encoder.block.N.layer.1.DenseReluDense.wi_1.weight
    blocks.N.ffn.fc2.weight                encoder.block.N.layer.1.DenseReluDense.wo.weight
    norm.weight                            encoder.final_layer_norm.weight

The sizes come from the tensors' shapes (umt5-xxl: vocabulary 256384, width 4096, 24
layers, 64 heads of 64, feed-forward 10240, 32 buckets); the bucket distance (128) is
umt5's. Prompts are cleaned as upstream's tokenizer wrapper does (HTML entities
unescaped twice, whitespace collapsed; upstream also runs ``ftfy.fix_text``, which only
changes mis-decoded text and is not a dependency here), padded to 512 tokens, and the
states past a prompt's end zeroed, as upstream's ``encode_prompt`` does.
"""

from __future__ import annotations

import html
import re

import torch

_BLOCK = {
    "norm1.weight": "layer.0.layer_norm.weight",
    "attn.q.weight": "layer.0.SelfAttention.q.weight",
    "attn.k.weight": "layer.0.SelfAttention.k.weight",
    "attn.v.weight": "layer.0.SelfAttention.v.weight",
    "attn.o.weight": "layer.0.SelfAttention.o.weight",
    "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
    "norm2.weight": "layer.1.layer_norm.weight",
    "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
    "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",
    "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
}
_TOP = {"token_embedding.weight": "shared.weight", "norm.weight": "encoder.final_layer_norm.weight"}
_BLOCK_NAME = re.compile(r"blocks\.(\d+)\.(.+)")
MAX_DISTANCE = 128

# The CFG negative branch's prompt (upstream dreamzero_cotrain.py: Wan's default, in English).
NEGATIVE_PROMPT = (
    "Vibrant colors, overexposed, static, blurry details, text, subtitles, style, artwork, painting, "
    "image, still, grayscale, dull, worst quality, low quality, JPEG artifacts, ugly, mutilated, extra "
    "fingers, bad hands, bad face, deformed, disfigured, mutated limbs, fused fingers, stagnant image, "
    "cluttered background, three legs, many people in the background, walking backwards.")


def clean_prompt(text: str) -> str:
    """Upstream's ``whitespace_clean(basic_clean(text))`` without ``ftfy``."""
    return re.sub(r"\s+", " ", html.unescape(html.unescape(text)).strip()).strip()


def hf_name(name: str) -> str | None:
    """The UMT5 name of a Wan T5 name, or None for a name Wan's encoder does not have."""
    if name in _TOP:
        return _TOP[name]
    m = _BLOCK_NAME.fullmatch(name)
    if m and m.group(2) in _BLOCK:
        return f"encoder.block.{m.group(1)}.{_BLOCK[m.group(2)]}"
    return None


def wan_name(hf: str) -> str:
    """The inverse of ``hf_name`` (the tiny checkpoint writes Wan names)."""
    for wan, h in _TOP.items():
        if h == hf:
            return wan
    m = re.fullmatch(r"encoder\.block\.(\d+)\.(.+)", hf)
    for wan, h in _BLOCK.items():
        if m and m.group(2) == h:
            return f"blocks.{m.group(1)}.{wan}"
    raise KeyError(hf)


def expected_names(found: set[str]) -> set[str]:
    """Every Wan name an encoder with as many layers as ``found`` names must have."""
    layers = {int(m.group(1)) for n in found if (m := _BLOCK_NAME.fullmatch(n))}
    return set(_TOP) | {f"blocks.{i}.{b}" for i in range(max(layers, default=-1) + 1) for b in _BLOCK}


def config_from_shapes(weights: dict[str, torch.Tensor]):
    """The ``UMT5Config`` the tensors describe."""
    from transformers import UMT5Config

    vocab, d_model = weights["token_embedding.weight"].shape
    layers = len({int(m.group(1)) for n in weights if (m := _BLOCK_NAME.fullmatch(n))})
    buckets, heads = weights["blocks.0.pos_embedding.embedding.weight"].shape
    d_kv = weights["blocks.0.attn.q.weight"].shape[0] // heads
    d_ff = weights["blocks.0.ffn.fc1.weight"].shape[0]
    return UMT5Config(vocab_size=vocab, d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=layers,
                      num_heads=heads, relative_attention_num_buckets=buckets,
                      relative_attention_max_distance=MAX_DISTANCE, feed_forward_proj="gated-gelu",
                      layer_norm_epsilon=1e-6, is_encoder_decoder=False)


def build_text_encoder(weights: dict[str, torch.Tensor], device: torch.device | str = "cpu",
                       dtype: torch.dtype = torch.float32):
    """A ``UMT5EncoderModel`` holding exactly ``weights`` (Wan names). An unknown or missing
    name, or a tensor of another shape, fails naming it."""
    from transformers import UMT5EncoderModel

    from models.policy.dreamzero.checkpoint import CheckpointError

    unknown = sorted(n for n in weights if hf_name(n) is None)
    if unknown:
        raise CheckpointError(f"text encoder: unknown {len(unknown)} key(s), first {unknown[:5]}")
    try:
        config = config_from_shapes(weights)
    except KeyError as e:   # a tensor the sizes are read from
        raise CheckpointError(f"text encoder: missing 1 key(s), first [{e.args[0]!r}]") from None
    with torch.device("meta"):       # no random init of 5.7B parameters to overwrite
        model = UMT5EncoderModel(config)
    model = model.to_empty(device=device).to(dtype)
    model.tie_weights()               # to_empty gives encoder.embed_tokens a tensor of its own
    params = dict(model.named_parameters())      # shared once
    mapped = {hf_name(n): n for n in weights}
    missing = sorted(wan_name(h) for h in set(params) - set(mapped))
    if missing:
        raise CheckpointError(f"text encoder: missing {len(missing)} key(s), first {missing[:5]}")
    with torch.no_grad():
        for h, n in mapped.items():
            if params[h].shape != weights[n].shape:
                raise CheckpointError(f"text encoder: {n} has shape {tuple(weights[n].shape)}, "
                                      f"expected {tuple(params[h].shape)}")
            params[h].copy_(weights[n])
    return model.eval()


@torch.no_grad()
def encode_prompts(encoder, tokenizer, prompts: list[str], length: int = 512) -> torch.Tensor:
    """``[len(prompts), length, d_model]`` states, zero past each prompt's last token."""
    batch = tokenizer([clean_prompt(p) for p in prompts], padding="max_length", truncation=True, max_length=length,
                      add_special_tokens=True, return_tensors="pt")
    device = next(encoder.parameters()).device
    ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
    states = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    return states * mask[..., None].to(states.dtype)
