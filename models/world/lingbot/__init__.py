"""LingBot-World v2 (``robbyant/lingbot-world-v2-14b-causal-fast-diffusers``), served from a
local checkpoint in the diffusers layout.

    config.py            LingBotTransformerConfig: the checkpoint's transformer config (defaults = 14B)
    transformer.py       CausalLingBotWorldTransformer3DModel: checkpoint names, fused self-attn q/k/v
    attention.py         BlockKV: one block's self-attention over kv/ pages, text K/V in cross slots
    cache.py             the kv/ geometry (sink 9 + 6 rolling + block 3) and a pool for it
    weights.py           shard-by-shard strict loading, the diffusers-layout transformer writer
    checkpoint.py        the checkpoint folder: validated at start, components loaded
    camera.py            key steps, intrinsics, frame-wise relative poses, Plücker rays
    controls.py          lingbot.camera_actions.v1 / lingbot.camera_trajectory.v1 reducers
    trajectory_files.py  named trajectories below a trusted root, loaded as untrusted input
    image.py             the first image: bytes -> uint8 frame (size and bomb guards)
    vae_io.py            Wan VAE: first-image condition, decode_block (swappable)
    pipeline.py          LingBotPipeline: sessions, one block per call (4 DMD steps)
    tiny_checkpoint.py   a tiny random checkpoint in the exact layout (tests)
    MODEL_CARD.md        what the model is, deviations, licences (weights: CC BY-NC-SA 4.0)
"""
