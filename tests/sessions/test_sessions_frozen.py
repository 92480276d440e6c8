import math

import pytest

from sessions import ErrorCode, FrozenDict, SessionError, deep_freeze, thaw


def test_freezes_nested_json_into_tuples_and_frozendicts():
    value = {"a": [1, 2.5, {"b": None, "c": True}], "d": "x", "e": ()}
    frozen = deep_freeze(value)
    assert type(frozen) is FrozenDict
    assert type(frozen["a"]) is tuple
    assert type(frozen["a"][2]) is FrozenDict
    assert frozen == {"a": (1, 2.5, {"b": None, "c": True}), "d": "x", "e": ()}
    assert thaw(frozen) == {"a": [1, 2.5, {"b": None, "c": True}], "d": "x", "e": []}
    assert type(thaw(frozen)["a"]) is list


def test_frozen_copy_is_isolated_from_the_source():
    held = ["w"]
    value = {"held": held}
    frozen = deep_freeze(value)
    held.append("a")
    value["extra"] = 1
    assert frozen == {"held": ("w",)}


def test_frozendict_is_immutable_and_hashable():
    frozen = deep_freeze({"x": [1, {"y": 2}]})
    with pytest.raises(TypeError):
        frozen["x"] = 2  # type: ignore[index]
    with pytest.raises(AttributeError):
        frozen._items = {}  # type: ignore[misc]
    assert hash(frozen) == hash(deep_freeze({"x": [1, {"y": 2}]}))
    assert {frozen: 1}[deep_freeze({"x": (1, {"y": 2})})] == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"held": ["w", b"a"]}, "controls[0].data.held[1]: a bytes is not a plain JSON value"),
        ({"held": {"w"}}, "controls[0].data.held: a set is not a plain JSON value"),
        ({"x": math.nan}, "controls[0].data.x: nan is not a finite number"),
        ({"x": [math.inf]}, "controls[0].data.x[0]: inf is not a finite number"),
        ({"x": object}, "controls[0].data.x: a type is not a plain JSON value"),
        ({1: "x"}, "controls[0].data: object key 1 is a int, not a string"),
    ],
)
def test_rejects_non_json_naming_the_path(value, message):
    with pytest.raises(SessionError) as info:
        deep_freeze(value, "controls[0].data")
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert info.value.message == message


def test_rejects_arbitrary_objects_and_subclasses():
    class Point:
        pass

    class Text(str):
        pass

    with pytest.raises(SessionError, match=r"^bad_request: value\.p: a Point is not"):
        deep_freeze({"p": Point()})
    with pytest.raises(SessionError, match=r"value\[0\]: a Text is not"):
        deep_freeze([Text("w")])


def test_rejects_cycles_and_excessive_depth():
    loop: list = []
    loop.append(loop)
    with pytest.raises(SessionError, match="nested deeper than 32 levels"):
        deep_freeze(loop)
    ok: list = []
    for _ in range(31):
        ok = [ok]
    assert thaw(deep_freeze(ok)) == ok
