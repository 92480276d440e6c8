"""Client values in error texts (protocols/echo.py): quoted as repr does, and short."""

from protocols.echo import MAX_SHOWN_CHARS, MAX_SHOWN_ITEMS, shown, shown_all


def test_a_short_value_is_its_repr():
    assert shown("reset") == "'reset'"
    assert shown(5) == "5"
    assert shown(b"ab") == "b'ab'"


def test_a_long_string_is_cut_before_repr_and_says_how_long_it_was():
    assert shown("x" * 1000) == "'" + "x" * MAX_SHOWN_CHARS + "'... (1000 characters)"
    assert shown(b"\x00" * 70) == repr(b"\x00" * MAX_SHOWN_CHARS) + "... (70 bytes)"


def test_any_other_long_value_is_cut_after_repr():
    text = shown(list(range(1000)))
    assert text.startswith("[0, 1, 2") and text.endswith("...") and len(text) == MAX_SHOWN_CHARS + 3


def test_a_list_shows_its_first_items_and_counts_the_rest():
    assert shown_all(["a", "b"]) == "['a', 'b']"
    many = shown_all(str(i) for i in range(100))
    assert many.endswith(f", and {100 - MAX_SHOWN_ITEMS} more]") and many.count("'") == 2 * MAX_SHOWN_ITEMS
    assert len(shown_all(["y" * 10_000] * 50)) < (MAX_SHOWN_CHARS + 30) * (MAX_SHOWN_ITEMS + 1)
