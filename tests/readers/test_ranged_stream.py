"""The resumable ranged stream's rules, through a transport that serves planted bytes and fails
where a test tells it to (no network)."""

from __future__ import annotations

import pytest

from shardfeed.readers.storage import ranged_stream
from shardfeed.readers.errors import DataSourceError
from shardfeed.readers.storage.ranged_stream import BodyCutShort, ResumableRangeStream

DATA = bytes(range(256)) * 40  # 10,240 planted bytes


class _Transport(ResumableRangeStream):
    """Serves ``DATA[start:end]``; ``cuts`` lists the file offsets at which an answer stops early
    (each once), ``resets`` how many reads in a row raise ConnectionResetError."""

    def __init__(self, start=0, end=None, *, retries=2, cuts=(), resets=0, ignore_range=False):
        self.url = "test://file"
        self.cuts, self.resets, self.ignore_range = list(cuts), resets, ignore_range
        self.opened: list[int] = []
        self._init_stream(end, retries)
        self._open(start)

    def _open(self, start):
        self.opened.append(start)
        self.offset = 0 if self.ignore_range else start
        self._expect_end = len(DATA) if self.end is None else self.end
        self._resp = self
        self._answer = "open"

    @staticmethod
    def _read_answer(answer, want, arg):
        return answer._serve(want)

    def _serve(self, want):
        if self.resets:
            self.resets -= 1
            raise ConnectionResetError("reset by the test")
        stop = self._expect_end if want is None else min(self.offset + want, self._expect_end)
        for cut in self.cuts:
            if self.offset <= cut < stop:
                self.cuts.remove(cut)
                self._answer = "cut"
                return DATA[self.offset:cut]
        if self._answer == "cut":
            return b""
        return DATA[self.offset:stop]

    def _read_error(self, attempts, exc):
        return DataSourceError(f"{self.url}: failed after {attempts} attempts ({type(exc).__name__})")

    def _drop(self):
        self._resp = None


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch):
    waits = []
    monkeypatch.setattr(ranged_stream.time, "sleep", waits.append)
    return waits


def _read_all(stream, n=1000):
    out = b""
    while chunk := stream.read(n):
        out += chunk
    return out


def test_a_cut_body_resumes_at_the_failed_byte_with_no_byte_lost_or_repeated(_no_wait):
    s = _Transport(100, 5000, cuts=[1234, 4000])
    assert _read_all(s) == DATA[100:5000]
    assert s.opened == [100, 1234, 4000]
    assert _no_wait == [0.2, 0.2]  # each cut is a first retry of its read


def test_retries_are_bounded_and_back_off_doubles(_no_wait):
    s = _Transport(0, retries=2, resets=3)
    with pytest.raises(DataSourceError, match=r"test://file: failed after 3 attempts \(ConnectionResetError\)"):
        s.read(10)
    assert _no_wait == [0.2, 0.4]
    assert s.opened == [0, 0, 0]


def test_a_server_ignoring_the_range_is_skipped_to_the_resume_point():
    s = _Transport(0, 3000, cuts=[700], ignore_range=True)
    assert _read_all(s, 500) == DATA[:3000]
    assert s.opened == [0, 700]


def test_a_closed_stream_fails_at_once_and_an_aborted_one_never_reopens(_no_wait):
    s = _Transport(0)

    def closed_under_the_read(want):  # another thread closes the stream; the read then fails
        s.close()
        raise ConnectionResetError("closed")

    s._serve = closed_under_the_read
    with pytest.raises(DataSourceError, match="stream closed while reading at byte 0"):
        s.read(10)
    assert _no_wait == []
    s = _Transport(0, resets=1)
    s._closed = False
    s._aborted = True  # aborted while the read waits to retry
    s.resets = 1
    with pytest.raises(DataSourceError, match="stream aborted while reading at byte 0"):
        s.read(10)
    assert s.opened == [0]


def test_more_bytes_than_announced_are_refused():
    s = _Transport(0, 100)
    s._serve = lambda want: DATA[:want + 5]  # the answer overruns its announced end
    with pytest.raises(DataSourceError, match="sent more than the 100 bytes it announced at byte 0"):
        s.read(-1)


def test_a_cut_short_body_is_a_connection_error():
    assert issubclass(BodyCutShort, ConnectionError)
