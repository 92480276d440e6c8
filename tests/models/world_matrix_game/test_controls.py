"""keys.v1 and mouse.v1 as each variant's keyboard and mouse vectors, and the mouse reducer."""

from __future__ import annotations

import math

import pytest
import torch

from models.world.matrix_game.controls import (MouseReducer, VariantKeysReducer, keyboard_vectors,
                                               mouse_vectors, variant_keys)
from protocols.mouse_v1 import MAX_DELTA, MouseError, mouse_control, parse_deltas
from sessions.errors import ErrorCode, SessionError
from sessions.frozen import deep_freeze


def fs(*keys: str) -> frozenset[str]:
    return frozenset(keys)


def test_keyboard_vectors_follow_upstreams_interactive_keys():
    base = keyboard_vectors("universal", [fs("w"), fs("s", "d"), fs(), fs("j")], 4)
    assert base.tolist() == [[1, 0, 0, 0], [0, 1, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]]
    gta = keyboard_vectors("gta_drive", [fs("w"), fs("s", "a")], 2)
    assert gta.tolist() == [[1, 0], [0, 1]]
    temple = keyboard_vectors("templerun", [fs(), fs("w"), fs("s"), fs("j"), fs("l"), fs("a"), fs("d")], 7)
    assert temple.tolist() == torch.eye(7).tolist()                 # none held: entry 0, no move


def test_mouse_vectors_are_pitch_then_yaw_look_keys_plus_deltas_clamped():
    m = mouse_vectors("universal", [fs("i"), fs("l"), fs("j", "k"), fs()], [(0, 0), (0.05, 0), (0, 0), (2.0, -3.0)])
    assert torch.allclose(m, torch.tensor([[0.1, 0.0], [0.0, 0.15], [-0.1, -0.1], [-1.0, 1.0]]))
    gta = mouse_vectors("gta_drive", [fs("a"), fs("d", "w")], None)
    assert torch.allclose(gta, torch.tensor([[0.0, -0.1], [0.0, 0.1]]))


def test_variant_keys_refuse_keys_the_variant_does_not_read():
    assert variant_keys("templerun") == ("w", "a", "s", "d", "j", "l")
    assert variant_keys("gta_drive") == ("w", "a", "s", "d", "i", "j", "k", "l")
    r = VariantKeysReducer(12, "templerun")
    r.validate(deep_freeze({"mode": "state", "held": ["W", "j"]}))
    for data in ({"mode": "state", "held": ["i"]}, {"mode": "script", "frames": [["w"], ["k"]]}):
        with pytest.raises(SessionError) as info:
            r.validate(deep_freeze(data))
        assert info.value.code == ErrorCode.BAD_REQUEST and "does nothing in matrix-game templerun" in str(info.value)
    with pytest.raises(SessionError, match="unknown key 'q'"):
        r.validate(deep_freeze({"mode": "state", "held": ["q"]}))


@pytest.mark.parametrize("data, text", [
    ({"deltas": [[math.nan, 0.0]]}, "yaw must be a finite number"),
    ({"deltas": [[0.0, math.inf]]}, "pitch must be a finite number"),
    ({"deltas": [[0.0, MAX_DELTA + 0.01]]}, "outside"),
    ({"deltas": [[True, 0.0]]}, "finite number"),
    ({"deltas": [[0.1]]}, "[yaw, pitch] pair"),
    ({"deltas": [[0.0, 0.0]] * 257}, "1..256"),
    ({"deltas": [[0.0, 0.0]], "mode": "x"}, "exactly 'deltas'"),
    ([1, 2], "exactly 'deltas'"),
])
def test_bad_mouse_data_is_refused_naming_the_rule(data, text):
    with pytest.raises(MouseError, match=text.replace("[", r"\[").replace("]", r"\]")):
        parse_deltas(data)
    with pytest.raises(SessionError) as info:
        MouseReducer(12).validate(data)   # NaN and inf never get frozen: plain data here
    assert info.value.code == ErrorCode.BAD_REQUEST and str(info.value).count("mouse.v1") == 1


def test_mouse_reducer_queues_per_frame_and_consumes_only_on_commit():
    r = MouseReducer(4)
    updates = [deep_freeze(mouse_control([[0.1, 0.0]] * 3).data), deep_freeze({"deltas": [[0.0, -0.2]] * 3})]
    p = r.prepare(updates)
    assert p.value == ((0.1, 0.0), (0.1, 0.0), (0.1, 0.0), (0.0, -0.2))
    assert r.prepare([]).value == ((0.0, 0.0),) * 4          # nothing committed yet
    r.commit(p)
    assert r.prepare([]).value == ((0.0, -0.2), (0.0, -0.2), (0.0, 0.0), (0.0, 0.0))
    r.reset()
    assert r.prepare([]).value == ((0.0, 0.0),) * 4
    small = MouseReducer(4, max_script_frames=5)
    with pytest.raises(SessionError) as info:
        small.admit([deep_freeze({"deltas": [[0.0, 0.0]] * 6})])
    assert info.value.code == ErrorCode.QUEUE_FULL
