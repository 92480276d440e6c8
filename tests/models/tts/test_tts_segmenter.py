"""Sentence segmentation of a text stream: exact pieces for exact inputs."""

import time

import pytest

from models.tts.segmenter import SentenceSegmenter


def test_a_sentence_is_handed_out_once_the_next_character_shows_it_ended():
    s = SentenceSegmenter()
    assert s.push("Hello wor") == []
    assert s.push("ld.") == []  # "." at the end of the buffer: maybe "world.com"
    assert s.push(" How are") == ["Hello world."]
    assert s.push(" you?\n") == ["How are you?"]
    assert s.buffered == "\n"
    assert s.flush() == []


def test_flush_hands_out_the_rest():
    s = SentenceSegmenter()
    assert s.push("No final stop") == []
    assert s.flush() == ["No final stop"]
    assert s.flush() == []


def test_decimals_abbreviations_quotes_and_line_breaks():
    s = SentenceSegmenter()
    text = 'Mr. Smith paid 3.14 dollars, e.g. a bargain. She said "wow!" Then:\nItem one\nItem two'
    assert s.push(text) == [
        "Mr. Smith paid 3.14 dollars, e.g. a bargain.",
        'She said "wow!"',
        "Then:",
        "Item one",
    ]
    assert s.flush() == ["Item two"]


def test_runs_of_terminators_and_bare_punctuation():
    s = SentenceSegmenter()
    assert s.push("... Wait. Really?! Yes\u2026  no") == ["... Wait.", "Really?!", "Yes\u2026"]
    assert s.flush() == ["no"]


def test_whitespace_is_collapsed():
    s = SentenceSegmenter()
    assert s.push("  Two\t\tspaces   here.  Next") == ["Two spaces here."]
    assert s.flush() == ["Next"]


def test_a_long_clause_is_cut_at_the_last_comma_within_budget():
    s = SentenceSegmenter(max_chars=40)
    assert s.push("This is a very long clause, which goes on and on without any end") == [
        "This is a very long clause,",
    ]
    assert s.buffered == " which goes on and on without any end"
    assert s.push(" in sight and more") == ["which goes on and on without any end in"]
    assert s.flush() == ["sight and more"]


def test_a_long_sentence_with_a_late_end_is_cut_by_budget_first():
    s = SentenceSegmenter(max_chars=30, min_chars=5)
    assert s.push("one two three four five six seven eight nine. Ten") == [
        "one two three four five six",
        "seven eight nine.",
    ]
    assert s.flush() == ["Ten"]


def test_no_space_means_a_hard_cut_at_the_budget():
    s = SentenceSegmenter(max_chars=20)
    assert s.push("abcdefghijklmnopqrstuvwxyz" * 2) == ["abcdefghijklmnopqrst", "uvwxyzabcdefghijklmn"]
    assert s.flush() == ["opqrstuvwxyz"]


def test_clause_marks_before_min_chars_are_not_used():
    s = SentenceSegmenter(max_chars=40, min_chars=10)
    assert s.push("Yes, this clause runs long without a comma until here, and on") == [
        "Yes, this clause runs long without a",
    ]


def test_streaming_token_by_token_gives_the_same_pieces_as_one_push():
    text = "First one. Second, longer sentence here! Third? Fourth"
    whole = SentenceSegmenter(max_chars=25)
    expected = whole.push(text) + whole.flush()
    tokens = SentenceSegmenter(max_chars=25)
    got = []
    for ch in text:
        got += tokens.push(ch)
    got += tokens.flush()
    assert got == expected == ["First one.", "Second,", "longer sentence here!", "Third?", "Fourth"]


def test_clear_drops_buffered_text():
    s = SentenceSegmenter()
    s.push("Half a sent")
    s.clear()
    assert s.flush() == []


def test_budget_must_be_sane():
    with pytest.raises(ValueError):
        SentenceSegmenter(max_chars=1)


@pytest.mark.parametrize("text", [
    "a" * 4000 + " Mr." * 24,   # a long word, then abbreviations: took 23 s
    "Mr. " * 1024,              # abbreviations only: 0.6 s
    "." * 4000 + "a",           # a run of stops with no space after it: 2.3 s
    "... " * 1000,              # punctuation alone, which joins the next sentence
    "e.g." * 1000,
])
def test_hostile_text_is_segmented_in_linear_time(text):
    """Each of these took from 0.6 to 23 s in one push before the search was bounded by the
    budget and abbreviations were read backwards from their dot (the tts endpoint segments
    on the event loop). Now a few milliseconds; the bound leaves a slow machine room."""
    s = SentenceSegmenter()
    started = time.perf_counter()
    pieces = s.push(text) + s.flush()
    assert time.perf_counter() - started < 0.5
    assert all(len(p) <= s.max_chars for p in pieces)
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")


def test_abbreviations_are_read_from_the_letters_before_their_dot():
    s = SentenceSegmenter()
    assert s.push("Ask Prof. Plum. Or Dr. Who. xMr. Ends here. ") == ["Ask Prof. Plum.", "Or Dr. Who.", "xMr.",
                                                                     "Ends here."]


def test_restore_undoes_a_refused_push():
    s = SentenceSegmenter()
    s.push("One. Two")
    before = s.buffered
    assert s.push(" three. Four") == ["Two three."]
    s.restore(before)
    assert s.buffered == before and s.flush() == ["Two"]


def test_a_push_after_a_long_run_of_line_breaks_costs_no_scan_of_them():
    """Line breaks before any word stay buffered (they may precede a sentence); each later
    push once looped in Python over every one of them (31 ms a push at 64 K of them)."""
    s = SentenceSegmenter()
    s.push("\n" * 64_000)
    started = time.perf_counter()
    for _ in range(200):
        assert s.push("y") == []
    assert time.perf_counter() - started < 1.0  # 200 pushes: ~0.1 s here, was ~6 s
    assert s.flush() == ["y" * 200]


@pytest.mark.parametrize("brk", ["\n", "\r", "\r\n", "\u2028", "\u2029", "\x85", "\x0c"])
def test_every_line_break_ends_a_sentence(brk):
    seg = SentenceSegmenter()
    assert seg.push(f"Line one{brk}Line two{brk}") == ["Line one", "Line two"]
    assert seg.flush() == []


@pytest.mark.parametrize("unit", [
    "\U0001F1FA\U0001F1F8",                                       # a flag: two regional indicators
    "a\u0300",                                                     # a letter and its combining mark
    "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466",  # a ZWJ family
    "\U0001F44D\U0001F3FD",                                        # an emoji and its skin tone
    "\u2764\ufe0f",                                                # a heart and its variation selector
])
@pytest.mark.parametrize("lead", ["", "x"])
def test_a_hard_cut_never_splits_a_grapheme(unit, lead):
    text = lead + unit * (400 // len(unit))
    seg = SentenceSegmenter(max_chars=200)
    pieces = seg.push(text) + seg.flush()
    assert len(pieces) >= 2 and "".join(pieces) == text
    for piece in pieces:
        body = piece[len(lead):] if piece.startswith(lead) and lead else piece
        assert len(body) % len(unit) == 0 and body == unit * (len(body) // len(unit)), (unit, len(piece))
        assert len(piece) <= 200


def test_a_run_of_marks_longer_than_the_budget_is_still_cut():
    seg = SentenceSegmenter(max_chars=200)
    pieces = seg.push("a" + "\u0300" * 300) + seg.flush()
    assert [len(p) for p in pieces] == [200, 101]


def test_symbols_and_digits_weigh_more_against_the_budget():
    # 200 emoji made one sentence of ~5,600 phoneme ids (its first audio took 7 s, the
    # engine held meanwhile); each now counts as 8 characters, a digit as 4.
    seg = SentenceSegmenter(max_chars=200)
    pieces = seg.push("\U0001F600" * 200) + seg.flush()
    assert [len(p) for p in pieces] == [25] * 8
    seg = SentenceSegmenter(max_chars=200)
    assert [len(p) for p in seg.push("7" * 120) + seg.flush()] == [50, 50, 20]
    assert SentenceSegmenter(max_chars=200).push("a" * 300) == ["a" * 200]  # letters count 1


def test_a_character_heavier_than_the_whole_budget_goes_alone():
    seg = SentenceSegmenter(max_chars=4, min_chars=0)
    assert seg.push("\U0001F600\U0001F601x") + seg.flush() == ["\U0001F600", "\U0001F601", "x"]
