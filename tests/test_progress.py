import io

from tfrecord_builder.progress import Progress


def test_bar_rate_and_eta_on_a_terminal():
    stream = io.StringIO()
    p = Progress(1000, "build", stream=stream, tty=True)
    p.start -= 10.0  # ten seconds have passed
    p._last = -1e9
    p.update(250, tokens=5_000_000)
    shown = stream.getvalue()
    assert shown.startswith("\r[#######.......................]")
    assert " 25.0%" in shown and "0.50M tokens/s" in shown
    assert "ETA 0:00:30" in shown  # 10 s for 25% -> 30 s left
    p.close()
    assert stream.getvalue().endswith("\n") and "100.0%" in stream.getvalue()


def test_log_lines_when_not_a_terminal(caplog):
    stream = io.StringIO()
    p = Progress(100, "build", stream=stream, tty=False, log_every_s=0.0)
    p.update(50, tokens=10)
    assert stream.getvalue() == ""  # no carriage-return bar in logs
    assert "50.0%" in p.line()
    p.update(40)  # progress never goes backwards
    assert p.done == 50


def test_abandon_ends_the_bar_line_without_reaching_100():
    """A build that stops (an error, Ctrl-C) ends the bar's line so the error stands on
    its own line, and the bar does not claim 100%."""
    stream = io.StringIO()
    p = Progress(1000, "build", stream=stream, tty=True)
    p._last = -1e9
    p.update(250)
    p.abandon()
    assert stream.getvalue().endswith("\n") and "100.0%" not in stream.getvalue()
    p.abandon()  # once only
    assert stream.getvalue().count("\n") == 1
    quiet = io.StringIO()
    Progress(1000, "build", stream=quiet, tty=True).abandon()  # nothing shown yet
    assert quiet.getvalue() == ""
