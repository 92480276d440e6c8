"""DreamZero-DROID (``GEAR-Dreams/DreamZero-DROID``): a world-action model served as a policy.

    config.py           DreamZeroConfig: config.json's action_head_cfg (defaults = the 14B DROID model)
    mask.py             the block-causal mask of a training sequence, drawn and tested
    model.py            DreamZeroDiT: the Wan2.1-I2V DiT with 24 action + 1 state tokens a chunk
    scheduler.py        16-step UniPC (flow shift 5) as upstream builds it; the 8-step DiT cache
    window.py           which frames a call writes and denoises; the window restart every 4 calls
    denoise.py          write_frames (t = 0 K/V pass) and denoise_chunk (CFG on video only)
    text_encoder.py     umt5-xxl from Wan's names into transformers' UMT5EncoderModel
    image_encoder.py    Wan's CLIP ViT-H/14 vision tower (penultimate block, 257 tokens)
    vae.py              the Wan2.1 VAE from its original names into diffusers' AutoencoderKLWan
    checkpoint.py       the folder: shards + index, every tensor consumed, metadata.json exposed
    observation.py      DROID cameras stitched, state/action normalisation, the prompt template
    tiny_checkpoint.py  a tiny random checkpoint in the exact layout (tests)
"""
