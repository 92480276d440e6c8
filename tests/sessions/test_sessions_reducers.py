import pytest

from sessions import (
    ErrorCode,
    KeysReducer,
    Prepared,
    SessionError,
    deep_freeze,
    default_reducers,
)


def state(*held):
    return deep_freeze({"mode": "state", "held": list(held)})


def script(*frames):
    return deep_freeze({"mode": "script", "frames": [list(f) for f in frames]})


def fs(*keys):
    return frozenset(keys)


def tick(reducer, *updates):
    """prepare + commit, as the session does for a successful tick."""
    prepared = reducer.prepare(list(updates))
    reducer.commit(prepared)
    return prepared.value


def test_held_keys_fill_every_frame_and_persist():
    r = KeysReducer(3)
    assert tick(r) == (fs(), fs(), fs())
    assert tick(r, state("W", "d")) == (fs("w", "d"),) * 3
    assert tick(r) == (fs("w", "d"),) * 3
    assert tick(r, state()) == (fs(),) * 3


def test_script_frames_come_first_and_carry_across_chunk_boundaries():
    r = KeysReducer(4)
    value = tick(r, state("w"), script(["a"], ["s"], [], ["d", "i"], ["j"], ["k"]))
    assert value == (fs("a"), fs("s"), fs(), fs("d", "i"))
    assert r.script == (fs("j"), fs("k"))
    assert r.held == fs("w")
    assert tick(r) == (fs("j"), fs("k"), fs("w"), fs("w"))
    assert r.script == ()
    assert tick(r) == (fs("w"),) * 4


def test_updates_apply_in_order_within_a_tick():
    r = KeysReducer(2)
    # Two scripts append in order; the later state replaces the earlier one.
    value = tick(r, script(["a"]), state("w"), script(["s"]), state("l"))
    assert value == (fs("a"), fs("s"))
    assert r.held == fs("l")
    assert tick(r, script(["i"])) == (fs("i"), fs("l"))


def test_a_key_pressed_and_released_within_a_tick_acts_for_one_frame():
    # Issue 12, defect 2: the pulse was lost (the final held set is empty).
    r = KeysReducer(3)
    pulse = tick(r, state("j"), state())
    assert pulse == tick(KeysReducer(3), script(["j"], [], [])) == (fs("j"), fs(), fs())
    assert r.held == fs()
    assert tick(r) == (fs(),) * 3
    # With other keys held, the pulse joins them in the first held frame only.
    r = KeysReducer(3)
    tick(r, state("w"))
    assert tick(r, state("w", "j"), state("w")) == (fs("w", "j"), fs("w"), fs("w"))
    # A key held before the tick is no pulse when released, nor one re-pressed and kept.
    assert tick(r, state(), state("w")) == (fs("w"),) * 3
    assert tick(r, state()) == (fs(),) * 3


def test_a_pulse_follows_the_script_frames_of_its_tick():
    r = KeysReducer(3)
    assert tick(r, script(["a"]), state("l"), state()) == (fs("a"), fs("l"), fs())
    # Script frames fill the whole chunk: like the held set, the pulse is overridden.
    assert tick(r, script(["a"], ["s"], ["d"]), state("l"), state()) == (fs("a"), fs("s"), fs("d"))
    assert tick(r) == (fs(),) * 3


def test_prepare_is_pure_and_speculative():
    r = KeysReducer(2)
    tick(r, state("w"), script(["a"], ["s"], ["d"]))
    before = (r.held, r.script)
    first = r.prepare([state("k"), script(["j"])])
    second = r.prepare([state("k"), script(["j"])])
    assert first == second == Prepared(
        value=(fs("d"), fs("j")), next_state=(fs("k"), ())
    )
    assert (r.held, r.script) == before == (fs("w"), (fs("d"),))
    # Without the speculative updates the committed state is untouched.
    assert r.prepare([]).value == (fs("d"), fs("w"))


def test_reset_clears_held_and_script():
    r = KeysReducer(2)
    tick(r, state("w"), script(["a"], ["a"], ["a"]))
    r.reset()
    assert (r.held, r.script) == (fs(), ())
    assert r.prepare([]).value == (fs(), fs())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"mode": "hold"}, "keys.v1: mode must be 'state' or 'script', got 'hold'"),
        ({"held": ["w"]}, "keys.v1: mode must be 'state' or 'script', got None"),
        ({"mode": "state"}, "keys.v1: mode 'state' needs 'held'"),
        ({"mode": "state", "held": ["w"], "x": 1}, "keys.v1: unknown fields for mode 'state': x"),
        ({"mode": "state", "held": "wd"}, "keys.v1: held must be a list of key names"),
        (
            {"mode": "state", "held": ["w", "a", "q"]},
            "keys.v1: unknown key 'q' at held[2]; keys are w, a, s, d, i, j, k, l",
        ),
        (
            {"mode": "state", "held": [1]},
            "keys.v1: unknown key 1 at held[0]; keys are w, a, s, d, i, j, k, l",
        ),
        ({"mode": "script", "frames": "w"}, "keys.v1: frames must be a list of key lists"),
        (
            {"mode": "script", "frames": [["w"], ["up"]]},
            "keys.v1: unknown key 'up' at frames[1][0]; keys are w, a, s, d, i, j, k, l",
        ),
        ({"mode": "script", "frames": [[]] * 257}, "keys.v1: frames: 257 frames, at most 256"),
    ],
)
def test_validate_rejects(data, message):
    with pytest.raises(SessionError) as info:
        KeysReducer(4).validate(deep_freeze(data))
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert info.value.message == message


def test_validate_accepts_upper_case_and_256_frames():
    r = KeysReducer(4)
    r.validate(state("W", "A", "S", "D", "I", "J", "K", "L"))
    r.validate(deep_freeze({"mode": "script", "frames": [["w"]] * 256}))


def test_admit_bounds_the_script_backlog():
    r = KeysReducer(4, max_script_frames=300)
    tick(r, script(*[["w"]] * 104))  # 100 frames left in the committed script
    r.admit([script(*[["a"]] * 200)])
    with pytest.raises(SessionError) as info:
        r.admit([script(*[["a"]] * 150), state("w"), script(*[["a"]] * 51)])
    assert info.value.code is ErrorCode.QUEUE_FULL
    assert info.value.message == "keys: script backlog would be 301 frames, at most 300"


def test_constructor_checks():
    with pytest.raises(ValueError):
        KeysReducer(0)
    with pytest.raises(ValueError):
        KeysReducer(4, max_script_frames=255)


def test_default_reducers_are_fresh_per_call():
    a, b = default_reducers(4), default_reducers(4)
    assert list(a) == ["keys"]
    assert isinstance(a["keys"], KeysReducer)
    assert a["keys"].frames_per_chunk == 4
    assert a["keys"] is not b["keys"]
