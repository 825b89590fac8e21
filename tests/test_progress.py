"""What an ingest prints while it runs when stderr is not a terminal: nothing, or when asked a periodic log line."""

import io

from simdb.progress import Progress


def test_log_lines_report_rate_share_and_eta(monkeypatch):
    clock = iter([100.0, 105.0, 110.0, 111.0])
    monkeypatch.setattr("simdb.progress.time.monotonic", lambda: next(clock))
    out = io.StringIO()
    progress = Progress("ingest 2024-05", total_bytes=4_000_000, interval=10, stream=out, log_lines=True)
    progress.add_bytes(1_000_000)
    progress.add_documents(500)     # t=105: too soon for a line
    progress.add_documents(500)     # t=110: a line
    progress.add_bytes(1_000_000)
    progress.add_documents(1000)    # t=111: too soon again
    assert out.getvalue() == ("ingest 2024-05: 1,000 documents, 100 docs/s, 0.1 MB/s, 25% of the input, "
                              "ETA 0:00:30\n")
    progress.close()


def test_nothing_is_printed_off_a_terminal_unless_asked():
    out = io.StringIO()
    progress = Progress("ingest", total_bytes=10, interval=0, stream=out)
    progress.add_bytes(5)
    progress.add_documents(5)
    progress.close()
    assert out.getvalue() == ""
