"""What a LingBot checkpoint's load reports while it reads (the server's /healthz and
/v1/models show it, realtime/server/loading.py): the transformer's bytes, shard by shard."""

from __future__ import annotations

from pathlib import Path

from models import factory
from models.factory import BuildOptions
from models.world.lingbot.checkpoint import load_components


def test_the_transformer_is_read_shard_by_shard_then_each_component(tiny_checkpoint):
    heard: list[tuple[str, int | None, int | None]] = []
    load_components(tiny_checkpoint, progress=lambda stage, done=None, total=None: heard.append((stage, done, total)))
    shards = sorted((Path(tiny_checkpoint) / "transformer").glob("*.safetensors"))
    total = sum(p.stat().st_size for p in shards)
    sizes = [p.stat().st_size for p in shards]
    reads = [("reading checkpoint", sum(sizes[:i]), total) for i in range(len(sizes) + 1)]
    assert heard == reads + [("reading text encoder", None, None), ("reading vae", None, None)]


def test_the_factory_reports_each_stage_of_the_build(tiny_checkpoint):
    heard: list[str] = []
    options = BuildOptions(device="cpu", max_batch=1, height=16, width=16,
                           progress=lambda stage, done=None, total=None: heard.append(stage))
    factory.build(f"lingbot={tiny_checkpoint}", options, kind="world").close()
    stages = [s for i, s in enumerate(heard) if i == 0 or heard[i - 1] != s]
    assert stages == ["importing", "building", "reading checkpoint", "reading text encoder", "reading vae",
                      "building"]
