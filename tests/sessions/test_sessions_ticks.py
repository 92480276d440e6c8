import dataclasses

import pytest

from sessions import FrozenDict, TickRequest, deep_freeze

W, A, NONE = frozenset({"w"}), frozenset({"a", "w"}), frozenset()


def request(**kw):
    fields = dict(
        session_id="s1",
        request_id="s1:4",
        chunk_index=2,
        applied_event_ids=(3, 5),
        prompt="harbour",
        controls=FrozenDict({"keys": (W, A, NONE), "camera": deep_freeze({"yaw": [0.5, -1.0]})}),
    )
    return TickRequest(**{**fields, **kw})


def test_list_ids_and_a_plain_dict_are_frozen_on_the_way_in():
    req = request(applied_event_ids=[3, 5], controls={"keys": (W,)})
    assert req.applied_event_ids == (3, 5)
    assert isinstance(req.controls, FrozenDict) and req.controls == {"keys": (W,)}
    assert req == request(controls=FrozenDict({"keys": (W,)}))


def test_a_snapshot_cannot_change():
    with pytest.raises(dataclasses.FrozenInstanceError):
        request().request_id = "s1:5"  # type: ignore[misc]
