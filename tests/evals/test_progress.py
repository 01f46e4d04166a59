"""The progress bar: silent off a terminal, one line per item when forced, a redrawn bar on a terminal."""

from __future__ import annotations

import io

from evals import ProgressBar, format_duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_silent_when_not_a_terminal():
    stream = io.StringIO()
    with ProgressBar(3, stream=stream) as bar:
        bar.update("ok")
    assert not bar.enabled and stream.getvalue() == ""


def test_forced_prints_one_line_per_item_with_eta():
    stream, clock = io.StringIO(), FakeClock()
    bar = ProgressBar(4, label="builtin", stream=stream, force=True, clock=clock)
    clock.now += 10
    bar.update("llama.rms_norm correct 2.1x")
    clock.now += 10
    bar.update("llama.silu  failed:\ncompile error")
    bar.close()
    lines = stream.getvalue().splitlines()
    assert lines == [
        "builtin 1/4 elapsed 10.0s eta 30.0s | llama.rms_norm correct 2.1x",
        "builtin 2/4 elapsed 20.0s eta 20.0s | llama.silu failed: compile error",
    ]


def test_terminal_redraws_one_line():
    stream, clock = Terminal(), FakeClock()
    with ProgressBar(2, stream=stream, clock=clock, width=200) as bar:
        assert bar.eta_s is None
        bar.update("a")
        bar.update("b")
    text = stream.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n")
    assert "[##########..........] 1/2" in text and "[####################] 2/2" in text


def test_format_duration():
    assert format_duration(4.24) == "4.2s"
    assert format_duration(75.2) == "1m15s"
    assert format_duration(3725) == "1h02m05s"
    assert format_duration(float("nan")) == "?"
