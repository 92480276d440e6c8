import json

import pytest

from sessions import ChunkMetadata, FrozenDict, SessionError, TickRequest, deep_freeze

W, A, NONE = frozenset({"w"}), frozenset({"a", "w"}), frozenset()


def request():
    return TickRequest(
        session_id="s1",
        request_id="s1:4",
        chunk_index=2,
        applied_event_ids=(3, 5),
        prompt="harbour",
        controls=FrozenDict(
            {"keys": (W, A, NONE), "camera": deep_freeze({"yaw": [0.5, -1.0]})}
        ),
    )


def test_to_dict_is_plain_json_with_sorted_key_lists():
    d = request().to_dict()
    assert d == {
        "session_id": "s1",
        "request_id": "s1:4",
        "chunk_index": 2,
        "applied_event_ids": [3, 5],
        "prompt": "harbour",
        "controls": {"keys": [["w"], ["a", "w"], []], "camera": {"yaw": [0.5, -1.0]}},
    }
    assert json.loads(json.dumps(d)) == d


def test_dict_round_trip_is_exact():
    req = request()
    back = TickRequest.from_dict(json.loads(json.dumps(req.to_dict())))
    assert back == req
    assert back.controls["keys"] == (W, A, NONE)
    assert type(back.controls["keys"][1]) is frozenset
    assert type(back.controls["camera"]) is FrozenDict
    assert hash(back) == hash(req)


def test_from_dict_rejects_missing_fields_and_bad_types():
    d = request().to_dict()
    del d["prompt"]
    with pytest.raises(SessionError, match="tick request: fields must be"):
        TickRequest.from_dict(d)
    d = request().to_dict()
    d["chunk_index"] = "2"
    with pytest.raises(SessionError, match="chunk_index must be a non-negative int"):
        TickRequest.from_dict(d)
    d = request().to_dict()
    d["controls"]["keys"] = [["w", "q"]]
    with pytest.raises(SessionError, match=r"unknown key 'q' at \[0\]\[1\]"):
        TickRequest.from_dict(d)


def test_metadata_for_request_matches():
    req = request()
    meta = ChunkMetadata.for_request(req)
    assert meta == ChunkMetadata("s1", "s1:4", 2, (3, 5))
    assert meta.matches(req)
    assert meta.mismatch(req) == []
    assert meta.to_dict() == {
        "session_id": "s1",
        "request_id": "s1:4",
        "chunk_index": 2,
        "applied_event_ids": [3, 5],
    }
    assert ChunkMetadata.from_dict(meta.to_dict()) == meta


def test_metadata_list_ids_are_coerced_to_a_tuple():
    meta = ChunkMetadata("s1", "s1:4", 2, [3, 5])  # type: ignore[arg-type]
    assert meta.applied_event_ids == (3, 5)
    assert meta.matches(request())


@pytest.mark.parametrize(
    ("meta", "diff"),
    [
        (ChunkMetadata("s2", "s1:4", 2, (3, 5)), ["session_id 's2' != 's1'"]),
        (ChunkMetadata("s1", "s1:3", 2, (3, 5)), ["request_id 's1:3' != 's1:4'"]),
        (ChunkMetadata("s1", "s1:4", 3, (3, 5)), ["chunk_index 3 != 2"]),
        (ChunkMetadata("s1", "s1:4", 2, (5, 3)), ["applied_event_ids (5, 3) != (3, 5)"]),
        (
            ChunkMetadata("s1", "s1:4", 1, (3,)),
            ["chunk_index 1 != 2", "applied_event_ids (3,) != (3, 5)"],
        ),
    ],
)
def test_metadata_mismatch_on_any_field(meta, diff):
    assert not meta.matches(request())
    assert meta.mismatch(request()) == diff
