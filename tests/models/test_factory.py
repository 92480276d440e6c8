"""models/factory.py: the table, entry parsing, kinds, errors, and that every world builds."""

from __future__ import annotations

import pytest

from models import factory
from models.factory import BuildOptions, FactoryError, ModelEntry, ModelUnavailable
from realtime.server.cli import config_from_args, parse_args
from realtime.server.config import ServerConfig, TTSConfig, WorldConfig
from realtime.server.inventory import build_inventory


def test_entries_parse_names_and_paths():
    assert factory.parse_entries("maze, tiny,,lingbot=/ckpt/x") == (
        ModelEntry("maze"), ModelEntry("tiny"), ModelEntry("lingbot", "/ckpt/x"))
    for bad in ("=x", "maze=", " = "):
        with pytest.raises(FactoryError, match="expected 'name' or 'name=path'"):
            factory.parse_entry(bad)


def test_every_entry_names_a_kind_and_a_function():
    for name, (kind, target) in factory.FACTORIES.items():
        assert kind in factory.KINDS, name
        module, sep, fn = target.partition(":")
        assert sep and module.startswith("models.") and fn, name
    assert factory.kind_of(factory.FALLBACK_WORLD) == "world"
    assert {factory.kind_of(n) for n in factory.DEFAULTS.values()} == {"policy", "tts"}


def test_unknown_names_and_wrong_kinds_are_factory_errors():
    with pytest.raises(FactoryError, match="unknown model 'nope'; known: "):
        factory.build("nope")
    with pytest.raises(FactoryError, match="'dummy' is a policy model, not a world model"):
        factory.build("dummy", kind="world")
    with pytest.raises(FactoryError, match="tiny has random weights and takes no path"):
        factory.build("tiny=/x")


def test_maze_sim_renders_at_the_size_its_entry_asks_for():
    entry = factory.parse_entry("maze-sim?size=480x832")
    assert entry == ModelEntry("maze-sim", None, (("size", "480x832"),)) and str(entry) == "maze-sim?size=480x832"
    world = factory.build(entry, BuildOptions(max_batch=2))
    assert (world.geometry.height, world.geometry.width) == (480, 832)
    assert (factory.build("maze-sim").geometry.height, factory.build("maze-sim").geometry.width) == (64, 64)
    for bad, says in (("size=480", "expected HEIGHTxWIDTH"), ("size=481x832", "each side even"),
                      ("size=4000x832", "each side even"), ("scale=2", "unknown maze-sim option 'scale'")):
        with pytest.raises(FactoryError, match=says):
            factory.validate(f"maze-sim?{bad}")
    with pytest.raises(FactoryError, match="maze-sim is the simulator and takes no path"):
        factory.build("maze-sim=/x?size=64x64")


def test_tiny_goes_through_the_table():
    adapter = factory.build("tiny", BuildOptions(max_batch=4, frames_per_chunk=2))
    assert (adapter.kind, adapter.name, adapter.max_batch, adapter.geometry.frames_per_chunk) == ("world", "tiny", 4, 2)


def test_missing_weights_make_a_model_unavailable(tmp_path):
    with pytest.raises(ModelUnavailable, match="FileNotFoundError"):
        factory.build(f"maze={tmp_path / 'missing.safetensors'}")
    inv = build_inventory(ServerConfig(world=WorldConfig(models=(f"maze={tmp_path / 'nope'}",)),
                                       tts=TTSConfig(enabled=False), policy=ServerConfig().policy.__class__(policy="")))
    assert inv.names("world") == [factory.FALLBACK_WORLD]
    assert "FileNotFoundError" in inv.unavailable["maze"]["reason"]


def test_policy_specs():
    assert factory.build_policy("dummy:50").infer_ms == 50.0
    assert factory.build_policy("dummy=20", BuildOptions(max_batch=3)).max_batch == 3
    assert factory.build_policy("models.policy.example:make_policy").kind == "policy"
    with pytest.raises(FactoryError, match="cannot load policy 'no_such_module:f'"):
        factory.build_policy("no_such_module:f")
    with pytest.raises(FactoryError, match="dummy takes milliseconds"):
        factory.build_policy("dummy=fast")


def test_cli_sorts_models_by_kind():
    config = config_from_args(parse_args(["serve", "--device", "cpu", "--models", "tiny,dummy=5"]))
    assert (config.world.models, config.policy.policy, config.tts.voice) == (("tiny",), "dummy=5", "")
    config = config_from_args(parse_args(["serve", "--device", "cpu", "--policy", "dummy"]))
    assert (config.world.models, config.policy.policy) == (("maze", "maze-sim", "tiny"), "dummy")
    with pytest.raises(FactoryError, match="drop --policy"):
        config_from_args(parse_args(["serve", "--device", "cpu", "--models", "tiny,dummy", "--policy", "flow"]))
    with pytest.raises(FactoryError, match="unknown model 'lingbott'"):
        config_from_args(parse_args(["serve", "--device", "cpu", "--models", "lingbott=/x"]))


def test_cli_prints_one_line_for_a_bad_entry(capsys):
    from realtime.server.cli import main

    assert main(["serve", "--device", "cpu", "--models", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("realtime serve: unknown model 'nope'; known: ")
