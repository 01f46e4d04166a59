"""The one text-clipping helper (`forge.text.clip`)."""

from forge.text import clip


def test_clip_keeps_short_text_and_cuts_long_text_to_the_limit():
    assert clip("  a\n  b  ", 10) == "a b"
    assert clip("x" * 20, 10) == "xxxxxxx..." and len(clip("x" * 20, 10)) == 10
    assert clip("line one\nline two", 100, collapse=False) == "line one\nline two"
    assert clip("y" * 5, 4, ellipsis="…") == "yyy…"
    assert clip(12345, 3) == "..."
