import pytest

from sessions import AppliedIds


def test_consecutive_ids_share_one_interval():
    ids = AppliedIds()
    for i in range(1000):
        ids.add(i)
    assert ids.intervals == ((0, 999),)
    assert ids.last == 999
    assert 0 in ids and 999 in ids and 1000 not in ids and -1 not in ids


def test_gaps_open_intervals_and_lookup_is_exact():
    ids = AppliedIds()
    for i in (0, 1, 2, 3, 6, 7, 9, 10, 12):
        ids.add(i)
    assert ids.intervals == ((0, 3), (6, 7), (9, 10), (12, 12))
    assert [i for i in range(14) if i in ids] == [0, 1, 2, 3, 6, 7, 9, 10, 12]
    assert True not in ids and "1" not in ids


def test_oldest_intervals_are_forgotten_past_the_bound():
    ids = AppliedIds(max_intervals=2)
    for i in (1, 3, 4, 6):
        ids.add(i)
    assert ids.intervals == ((3, 4), (6, 6))
    assert 1 not in ids and 3 in ids and ids.last == 6


def test_ids_must_increase():
    ids = AppliedIds()
    assert ids.last == -1
    ids.add(5)
    with pytest.raises(ValueError, match="event id 5 is not above the last applied id 5"):
        ids.add(5)
