"""A tiny random LingBot-World v2 checkpoint in the exact diffusers layout (for tests).

Every component is real and tiny: the transformer at a 2-layer config (saved
sharded with its index json, as the 14B checkpoint is), a 1-layer UMT5 encoder, a
T5 tokenizer over a 30-piece Unigram vocabulary (letters and the word marker), a
Wan VAE at base width 8, and the checkpoint's own scheduler config. Loading it
goes through exactly the code that loads the real one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from models.world.lingbot.checkpoint import COMPONENTS, PIPELINE_CLASS
from models.world.lingbot.config import LingBotTransformerConfig
from models.world.lingbot.transformer import CausalLingBotWorldTransformer3DModel
from models.world.lingbot.weights import save_transformer

TINY_TRANSFORMER = LingBotTransformerConfig(num_attention_heads=2, attention_head_dim=12, text_dim=16,
                                            freq_dim=8, ffn_dim=32, num_layers=2, sink_size=3,
                                            sliding_window_num_frames=12)

# The public checkpoint's scheduler/scheduler_config.json (shared fixtures).
SCHEDULER_CONFIG = {
    "_class_name": "UniPCMultistepScheduler", "_diffusers_version": "0.35.0.dev0",
    "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001, "disable_corrector": [],
    "dynamic_thresholding_ratio": 0.995, "final_sigmas_type": "zero", "flow_shift": 5.0,
    "lower_order_final": True, "num_train_timesteps": 1000, "predict_x0": True,
    "prediction_type": "flow_prediction", "rescale_betas_zero_snr": False, "sample_max_value": 1.0,
    "solver_order": 2, "solver_p": None, "solver_type": "bh2", "steps_offset": 0,
    "thresholding": False, "time_shift_type": "exponential", "timestep_spacing": "linspace",
    "trained_betas": None, "use_beta_sigmas": False, "use_dynamic_shifting": False,
    "use_exponential_sigmas": False, "use_flow_sigmas": True, "use_karras_sigmas": False,
}


def tiny_tokenizer():
    """The tiny checkpoint's T5 tokenizer: a 30-piece Unigram vocabulary (letters and the word marker)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers.processors import TemplateProcessing
    from transformers import T5TokenizerFast

    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -1.0)]
    vocab += [(c, -2.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return T5TokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                           extra_ids=0)


def write_tiny_checkpoint(root: str | Path, seed: int = 0, *, shard_bytes: int = 40_000) -> Path:
    """Write the tiny checkpoint under ``root`` and return it."""
    from diffusers import AutoencoderKLWan
    from transformers import UMT5Config, UMT5EncoderModel

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    index = {"_class_name": PIPELINE_CLASS, "_diffusers_version": "0.35.0.dev0", "boundary_ratio": 0.9,
             "image_encoder": [None, None], "image_processor": [None, None], "transformer_2": [None, None],
             **{name: list(v) for name, v in COMPONENTS.items()}}
    (root / "model_index.json").write_text(json.dumps(index, indent=2))

    model = CausalLingBotWorldTransformer3DModel(TINY_TRANSFORMER)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    save_transformer(model, root / "transformer", max_shard_bytes=shard_bytes)

    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(root / "tokenizer")
    te = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), d_model=TINY_TRANSFORMER.text_dim,
                                     d_kv=4, d_ff=32, num_layers=1, num_heads=2,
                                     relative_attention_num_buckets=8))
    te.save_pretrained(root / "text_encoder")

    vae = AutoencoderKLWan(base_dim=8, z_dim=TINY_TRANSFORMER.out_channels, dim_mult=[1, 2, 4, 4],
                           num_res_blocks=1, attn_scales=[], temperal_downsample=[False, True, True])
    vae.save_pretrained(root / "vae")

    (root / "scheduler").mkdir(exist_ok=True)
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER_CONFIG, indent=2))
    return root
