"""A LingBot-World checkpoint folder with random weights, for ``realtime serve --models lingbot=DIR``.

    python -m bench.parallel.random_lingbot /tmp/lingbot-random-14b            # full size, on cuda:0
    python -m bench.parallel.random_lingbot /tmp/lingbot-tiny --tiny           # tiny, 4 heads (CPU rehearsal)

A served process loads its model from a folder (every rank of ``--sequence-parallel N`` reads
the same one), so the benchmark's random model has to be on disk. At full size the folder is
what bench/world/lingbot_random.py builds in memory: the 14B transformer (40 layers, 40 heads
x 128) initialised on the GPU and written in bf16 shards of ``--shard-gib`` (about 28 GiB in
all), a 1-layer UMT5 text encoder at the transformer's ``text_dim`` with the tiny tokenizer, the
Wan VAE at its default config, and the public scheduler config. The folder passes
``validate_checkpoint`` and loads through the code that loads the real one. A folder already
holding a complete checkpoint of the same kind (its ``random.json``) is kept as it is; a
non-empty folder without that file (a real checkpoint, say) is never written to.

``--tiny`` is the tests' tiny checkpoint (models/world/lingbot/tiny_checkpoint.py) with its
transformer at 4 heads instead of 2, so that a CPU rehearsal can split it over 4 ranks too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

GIB = 1 << 30
MARK = "random.json"
# The tiny transformer's heads: sequence parallel needs them to divide by the ranks (1, 2, 4).
TINY_HEADS = 4


def is_written(root: Path, tiny: bool) -> bool:
    """Whether ``root`` already holds a complete random checkpoint of this kind."""
    from models.world.lingbot.checkpoint import validate_checkpoint

    mark = root / MARK
    if not mark.is_file():
        return False
    written = json.loads(mark.read_text())
    if (written.get("tiny"), written.get("complete")) != (tiny, True):
        return False
    try:
        validate_checkpoint(root)
    except ValueError:
        return False
    return True


def write_full(root: Path, device: str, shard_bytes: int, seed: int = 0, cfg: Any = None) -> None:
    """The full-size checkpoint (``cfg``: another transformer config, for a check at small size)."""
    import torch
    from diffusers import AutoencoderKLWan
    from transformers import UMT5Config, UMT5EncoderModel

    from bench.world.lingbot_random import random_transformer
    from models.world.lingbot.checkpoint import COMPONENTS, PIPELINE_CLASS
    from models.world.lingbot.config import LingBotTransformerConfig
    from models.world.lingbot.tiny_checkpoint import SCHEDULER_CONFIG, tiny_tokenizer
    from models.world.lingbot.weights import save_transformer

    root.mkdir(parents=True, exist_ok=True)
    index = {"_class_name": PIPELINE_CLASS, "_diffusers_version": "0.35.0.dev0",
             **{name: list(v) for name, v in COMPONENTS.items()}}
    (root / "model_index.json").write_text(json.dumps(index, indent=2))
    cfg = cfg or LingBotTransformerConfig()
    transformer = random_transformer(cfg, device, torch.bfloat16, seed)
    save_transformer(transformer, root / "transformer", max_shard_bytes=shard_bytes)
    del transformer
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(root / "tokenizer")
    torch.manual_seed(seed)
    text_encoder = UMT5EncoderModel(UMT5Config(
        vocab_size=len(tokenizer), d_model=cfg.text_dim, d_kv=max(4, cfg.text_dim // 64), d_ff=4 * 64,
        num_layers=1, num_heads=2, relative_attention_num_buckets=8))
    text_encoder.save_pretrained(root / "text_encoder")
    AutoencoderKLWan(z_dim=cfg.out_channels).save_pretrained(root / "vae")
    (root / "scheduler").mkdir(exist_ok=True)
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER_CONFIG, indent=2))


def write_tiny(root: Path, seed: int = 0) -> None:
    import dataclasses
    import shutil

    import torch

    from models.world.lingbot.tiny_checkpoint import TINY_TRANSFORMER, write_tiny_checkpoint
    from models.world.lingbot.transformer import CausalLingBotWorldTransformer3DModel
    from models.world.lingbot.weights import save_transformer

    write_tiny_checkpoint(root, seed)
    shutil.rmtree(root / "transformer")
    torch.manual_seed(seed)
    model = CausalLingBotWorldTransformer3DModel(dataclasses.replace(TINY_TRANSFORMER, num_attention_heads=TINY_HEADS))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    save_transformer(model, root / "transformer", max_shard_bytes=40_000)


def write(root: str | Path, *, tiny: bool, device: str = "cuda", shard_gib: float = 5.0) -> Path:
    """The checkpoint at ``root`` (written unless already there); returns ``root``."""
    root = Path(root)
    if is_written(root, tiny):
        return root
    if root.is_dir() and any(root.iterdir()) and not (root / MARK).is_file():
        raise FileExistsError(f"{root}: a folder this module did not write (no {MARK}); not overwriting it")
    started = time.perf_counter()
    # The mark goes first, so that a write cut short leaves a folder this module may write again.
    root.mkdir(parents=True, exist_ok=True)
    (root / MARK).write_text(json.dumps({"tiny": tiny, "complete": False}))
    if tiny:
        write_tiny(root)
    else:
        write_full(root, device, int(shard_gib * GIB))
    from models.world.lingbot.checkpoint import validate_checkpoint

    validate_checkpoint(root)
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    (root / MARK).write_text(json.dumps({"tiny": tiny, "complete": True, "bytes": size,
                                         "write_s": round(time.perf_counter() - started, 1)}))
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root")
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny checkpoint (2 layers, 2 heads)")
    parser.add_argument("--device", default="cuda", help="where the full-size transformer is initialised")
    parser.add_argument("--shard-gib", type=float, default=5.0)
    args = parser.parse_args()
    root = write(args.root, tiny=args.tiny, device=args.device, shard_gib=args.shard_gib)
    print(f"{root}: {(root / MARK).read_text()}", file=sys.stderr)


if __name__ == "__main__":
    main()
