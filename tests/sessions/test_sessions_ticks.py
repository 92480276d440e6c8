import pytest

from sessions import ChunkMetadata, FrozenDict, TickRequest, deep_freeze

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


def test_metadata_for_request_matches():
    req = request()
    meta = ChunkMetadata.for_request(req)
    assert meta == ChunkMetadata("s1", "s1:4", 2, (3, 5))
    assert meta.matches(req)
    assert meta.mismatch(req) == []


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
