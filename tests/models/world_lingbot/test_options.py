"""The lingbot entry's shortcuts: ``name=path?key=value&...`` parsed by the factory, checked by the model."""

from __future__ import annotations

import pytest

from models import factory
from models.factory import BuildOptions, FactoryError, ModelEntry
from models.world.lingbot.options import LingBotOptions, OptionError, parse_options
from models.world.lingbot.pipeline import denoising_timesteps


def test_an_entry_carries_its_options_in_order_and_prints_back():
    entry = factory.parse_entry("lingbot=/ckpt/x?steps=2&fp8=ffn+attn&decoder=taehv:/w/t.pth")
    assert entry == ModelEntry("lingbot", "/ckpt/x", (("steps", "2"), ("fp8", "ffn+attn"),
                                                      ("decoder", "taehv:/w/t.pth")))
    assert str(entry) == "lingbot=/ckpt/x?steps=2&fp8=ffn+attn&decoder=taehv:/w/t.pth"
    assert factory.parse_entry(str(entry)) == entry
    assert factory.parse_entries("maze,lingbot=/c?steps=1,tiny") == (
        ModelEntry("maze"), ModelEntry("lingbot", "/c", (("steps", "1"),)), ModelEntry("tiny"))
    assert factory.parse_entry("lingbot=/c").options == ()


@pytest.mark.parametrize("text, match", [
    ("lingbot=/c?", "option '' is not key=value"),
    ("lingbot=/c?steps", "option 'steps' is not key=value"),
    ("lingbot=/c?steps=2&", "option '' is not key=value"),
    ("lingbot=/c?=2", "option '=2' is not key=value"),
    ("lingbot=/c?steps=2&steps=3", "option 'steps' given twice"),
    ("lingbot=?steps=2", "expected 'name' or 'name=path'"),
])
def test_malformed_options_are_factory_errors_naming_them(text, match):
    with pytest.raises(FactoryError, match=match):
        factory.parse_entry(text)


def test_a_model_that_takes_no_options_refuses_them():
    with pytest.raises(FactoryError, match=r"^tiny=x\?steps=2: model 'tiny' takes no options$"):
        factory.build("tiny=x?steps=2", BuildOptions())
    assert "lingbot" in factory.TAKES_OPTIONS and "tiny" not in factory.TAKES_OPTIONS


def test_options_parse_to_the_shortcuts_and_back():
    assert parse_options([]) == LingBotOptions() and LingBotOptions().exact
    assert LingBotOptions().query() == "" and LingBotOptions().passes_per_block == 5
    o = parse_options([("steps", "2"), ("reuse_kv", "1"), ("fp8", "attn+ffn"), ("decoder", "taehv:/w/t.pth")])
    assert o == LingBotOptions(steps=2, reuse_kv=True, fp8=("ffn", "attn"), taehv="/w/t.pth")
    assert not o.exact and o.passes_per_block == 2
    assert o.query() == "steps=2&reuse_kv=1&fp8=ffn+attn&decoder=taehv:/w/t.pth"
    assert parse_options(factory.parse_entry("lingbot=/c?" + o.query()).options) == o
    sized = parse_options([("size", "32x48")])
    assert sized == LingBotOptions(size=(32, 48)) and sized.exact and sized.query() == "size=32x48"


@pytest.mark.parametrize("value", ["32", "32x40", "0x16", "16x1936", "ax16"])
def test_a_size_is_two_multiples_of_16(value):
    with pytest.raises(OptionError, match=f"option size={value}: must be HEIGHTxWIDTH, each a multiple of 16"):
        parse_options([("size", value)])
    assert parse_options([("fp8", "all")]).fp8 == ("ffn", "attn", "cross")
    assert parse_options([("fp8", "none"), ("decoder", "wan"), ("reuse_kv", "0"), ("steps", "4")]).exact
    assert [parse_options([("steps", str(n))]).passes_per_block for n in (1, 2, 3, 4)] == [2, 3, 4, 5]


@pytest.mark.parametrize("pairs, match", [
    ([("step", "2")], "unknown option 'step' \\(lingbot takes steps, reuse_kv, fp8, decoder, size\\)"),
    ([("steps", "0")], "option steps=0: must be an integer in 1..4"),
    ([("steps", "5")], "option steps=5: must be an integer in 1..4"),
    ([("steps", "two")], "option steps=two: must be an integer in 1..4"),
    ([("steps", "-1")], "option steps=-1"),
    ([("reuse_kv", "yes")], "option reuse_kv=yes: must be 0 or 1"),
    ([("fp8", "mlp")], "option fp8=mlp: must be 'all', 'none' or groups of ffn, attn, cross"),
    ([("fp8", "ffn+ffn")], "option fp8=ffn\\+ffn"),
    ([("fp8", "all+ffn")], "option fp8=all\\+ffn"),
    ([("decoder", "taehv")], "option decoder=taehv: must be 'wan' or 'taehv:PATH'"),
    ([("decoder", "wan:/x")], "option decoder=wan:/x"),
    ([("decoder", "vae")], "option decoder=vae"),
])
def test_bad_options_are_refused_naming_the_option(pairs, match):
    with pytest.raises(OptionError, match=match):
        parse_options(pairs)


def test_fewer_steps_are_a_prefix_of_the_distilled_schedule():
    assert [denoising_timesteps(n) for n in (1, 2, 3, 4)] == [
        (1000.0,), (1000.0, 750.0), (1000.0, 750.0, 500.0), (1000.0, 750.0, 500.0, 250.0)]
    for bad in (0, 5, -1, True, 2.0):
        with pytest.raises(ValueError, match="steps must be an integer in 1..4"):
            denoising_timesteps(bad)
