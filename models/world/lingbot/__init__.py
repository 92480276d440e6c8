"""LingBot-World v2 (``robbyant/lingbot-world-v2-14b-causal-fast-diffusers``), served from a
local checkpoint in the diffusers layout.

    config.py        LingBotTransformerConfig: the checkpoint's transformer config (defaults = 14B)
    transformer.py   CausalLingBotWorldTransformer3DModel: checkpoint names, fused self-attn q/k/v
    attention.py     BlockKV: one block's self-attention over kv/ pages, text K/V in cross slots
    weights.py       shard-by-shard loading (strict names and shapes), the diffusers-layout writer
    MODEL_CARD.md    what the model is, licences
"""
