"""The dreamzero entry's options: checked before anything loads, one line naming the bad one, and
the entry built through the factory table and the CLI."""

from __future__ import annotations

from dataclasses import replace

import pytest

from models import factory
from models.factory import FactoryError
from models.policy.dreamzero.adapter import DreamZeroPolicy
from models.policy.dreamzero.config import TINY_DROID
from models.policy.dreamzero.options import DreamZeroOptions, OptionError, parse_options
from models.policy.dreamzero.tiny_checkpoint import TINY_VOCAB, write_tiny_checkpoint, write_tiny_tokenizer
from realtime.server.cli import config_from_args, main, parse_args
from realtime.server.config import TTSConfig
from realtime.server.inventory import build_inventory


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("dreamzero_options")
    return str(write_tiny_checkpoint(root / "ckpt", cfg=TINY_DROID)), str(write_tiny_tokenizer(root / "tok"))


def test_options_parse_with_their_defaults(tmp_path):
    tok = str(tmp_path)
    assert parse_options([("tokenizer", tok)]) == DreamZeroOptions(tok, step_cache=False, sessions=2)
    assert parse_options([("tokenizer", tok), ("step_cache", "1"), ("sessions", "5")]) == DreamZeroOptions(tok, True, 5)
    assert parse_options([("tokenizer", tok)]).host_budget_bytes == 64 << 30
    opts = parse_options([("tokenizer", tok), ("kv_gib", "1.5"), ("host_gib", "0")])
    assert (opts.kv_budget_bytes, opts.host_budget_bytes) == (3 << 29, 0)


@pytest.mark.parametrize("query, says", [
    ("sessions=2", "option tokenizer=PATH is required"),
    ("tokenizer=TOK&sessions=0", "option sessions=0: must be an integer in 1..64"),
    ("tokenizer=TOK&sessions=two", "option sessions=two: must be an integer in 1..64"),
    ("tokenizer=TOK&step_cache=yes", "option step_cache=yes: must be 0 or 1"),
    ("tokenizer=TOK&steps=8", "unknown option 'steps' (dreamzero takes tokenizer, step_cache, sessions, kv_gib, "
                              "host_gib, cfg_parallel)"),
    ("tokenizer=TOK&cfg_parallel=2", "option cfg_parallel=2: must be 0 or 1"),
    ("tokenizer=TOK&kv_gib=0", "option kv_gib=0: must be a number of GiB > 0"),
    ("tokenizer=TOK&host_gib=-1", "option host_gib=-1: must be a number of GiB >= 0"),
    ("tokenizer=TOK&host_gib=lots", "option host_gib=lots: must be a number of GiB >= 0"),
    ("tokenizer=/no/such/folder", "option tokenizer=/no/such/folder: not a folder"),
])
def test_a_bad_option_stops_the_entry_before_loading(tmp_path, query, says):
    entry = f"dreamzero={tmp_path / 'never-read'}?{query.replace('TOK', str(tmp_path))}"
    with pytest.raises(FactoryError) as info:
        factory.validate(entry, kind="policy")
    assert says in str(info.value) and str(info.value).startswith(f"{entry}: ")
    with pytest.raises(OptionError):
        parse_options(factory.parse_entry(entry).options)


def test_the_cli_prints_one_line_for_a_bad_option(tmp_path, capsys):
    entry = f"dreamzero={tmp_path}?tokenizer={tmp_path}&sessions=0"
    assert main(["serve", "--device", "cpu", "--models", f"tiny,{entry}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("option sessions=0: must be an integer in 1..64")


def test_the_entry_builds_the_policy_through_the_table(folders):
    ckpt, tok = folders
    entry = f"dreamzero={ckpt}?tokenizer={tok}&sessions=3&step_cache=1"
    config = config_from_args(parse_args(["serve", "--device", "cpu", "--models", f"tiny,{entry}"]))
    assert config.policy.policy == entry
    inventory = build_inventory(replace(config, tts=TTSConfig(enabled=False)))
    assert inventory.names("policy") == ["dreamzero"] and inventory.unavailable == {}
    policy = inventory.adapters["dreamzero"]
    assert isinstance(policy, DreamZeroPolicy) and policy.kind == "policy"
    assert (policy.capacity, policy.max_batch, policy.dit_steps is not None) == (3, 3, True)
    assert policy.metadata.needs_session_id and policy.metadata.action_shape == (24, 8)
    assert len(policy.tokenizer) == TINY_VOCAB
    with pytest.raises(FactoryError, match="dreamzero needs its checkpoint folder"):
        factory.build(f"dreamzero?tokenizer={tok}")


def test_a_checkpoint_without_droids_action_register_is_refused(tmp_path, folders):
    small = write_tiny_checkpoint(tmp_path / "small")       # TINY: 3 actions of 5
    with pytest.raises(FactoryError, match="DROID serving needs action_horizon 24"):
        factory.build(f"dreamzero={small}?tokenizer={folders[1]}")
