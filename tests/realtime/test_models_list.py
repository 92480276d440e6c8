"""``GET /v1/models`` on a real server: ids, states and what each world model reads (while models
load: tests/e2e/test_loading.py)."""

from __future__ import annotations

import httpx

from models.world.tiny import TinyWorld
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve


def test_every_entry_has_an_id_and_world_models_say_whether_they_use_prompts():
    inventory = Inventory()
    world = TinyWorld()
    inventory.adapters[world.name] = world
    inventory.skip("piper-joe-medium", "tts", "TTS unavailable: missing onnx")
    app = build_app(ServerConfig(world=WorldConfig(models=("tiny",))), inventory)
    with serve(app) as addr:
        body = httpx.get(f"http://{addr}/v1/models").json()
    assert body["object"] == "list"
    assert [(m["id"], m["name"], m["kind"], m["state"], m["available"]) for m in body["data"]] == [
        ("tiny", "tiny", "world", "ready", True), ("piper-joe-medium", "piper-joe-medium", "tts", "unavailable", False)]
    assert body["data"][0]["uses_prompts"] is False
    assert body["data"][1]["reason"] == "TTS unavailable: missing onnx"
