"""One resumable stream of a byte range, whatever the transport (HTTP, an object store).

:class:`ResumableRangeStream` owns the rules every remote read follows:

* ``offset`` is the file offset of the next byte :meth:`~ResumableRangeStream.read` returns.
* A read that fails with a transient error (a connection reset, a stalled socket, a body cut
  short) is retried at most ``retries`` times. Before retry ``k`` (1, 2, ...) it waits
  :func:`backoff_s` of ``k`` seconds. The retry reopens the range at the byte where the read
  failed, so no byte is lost or repeated.
* A body that ends before the end its answer announced is a cut, retried the same way. A body that
  sends more than it announced is refused at once.
* :meth:`~ResumableRangeStream.close` makes a read failing because of it fail at once, without
  retrying. :meth:`~ResumableRangeStream.abort` also makes a read waiting to retry fail, and no
  later read reopens the stream.

A transport supplies how to open an answer for ``[start, end)`` (:meth:`_open`), how to read
from it (:meth:`_read_answer`), and how its errors map to the messages (:meth:`_read_error`).
"""

from __future__ import annotations

import logging
import time

from ..errors import DataSourceError

__all__ = ["ResumableRangeStream", "BodyCutShort", "BACKOFF_S", "backoff_s"]

#: First back-off between attempts, seconds (doubles each time).
BACKOFF_S = 0.2
#: Bytes read at a time while skipping to the resume point of an answer that starts before it.
_SKIP_BYTES = 1 << 20


def backoff_s(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt`` (1 for the first retry): :data:`BACKOFF_S`
    doubled for each retry before it."""
    return BACKOFF_S * 2 ** (attempt - 1)


class BodyCutShort(ConnectionError):
    """A body ended ``missing`` bytes before the end its answer announced (retried like a
    connection error)."""

    def __init__(self, missing: int):
        super().__init__(f"the body ended {missing:,} bytes early")
        self.missing = missing


class ResumableRangeStream:
    """A read-only stream of bytes ``[start, end)`` of one remote file, resuming after failures.

    Subclasses set ``self._resp`` (the open answer, or None when nothing is left to read),
    ``self.offset`` and ``self._expect_end`` in :meth:`_open`, and give :meth:`_read_answer`,
    :meth:`_read_error` and :attr:`_transient`.

    Attributes:
        offset: file offset of the next byte :meth:`read` returns.
        end: the end of the range asked for (exclusive; None: the end of the file).
        retries: retries of a failed read after its first attempt.
        total_bytes: the file's size as the server reports it (None if it does not say).
        ranged: whether the answer holds only the range asked for.
    """

    #: exception classes a read retries (the subclass's transport errors)
    _transient: tuple = (OSError,)
    #: exception classes among them a read never retries
    _fatal: tuple = (DataSourceError,)
    #: the last argument of :meth:`_read_answer` (a transport's read setting, e.g. a deadline)
    _read_arg = None
    #: the logger of the transport's module
    _log = logging.getLogger(__name__)

    def _init_stream(self, end: int | None, retries: int) -> None:
        """Set the bookkeeping every stream starts with (before its first :meth:`_open`)."""
        self.end = end
        self.retries = retries
        self.offset = 0
        self.ranged = False
        self.total_bytes: int | None = None
        self._resp = None
        self._expect_end: int | None = None  # the last byte of the answer + 1 (None: not announced)
        self._closed = False
        self._aborted = False  # set by abort(): never reopened, whatever a read in flight does
        self._reopen = False  # the last read returned the bytes before a cut: the next one reopens

    # ---- what a transport supplies
    def _open(self, start: int) -> None:
        """Open an answer for bytes ``[start, end)``: set ``_resp``, ``offset`` (``start``, or
        less when the server sends from an earlier byte) and ``_expect_end``."""
        raise NotImplementedError

    @staticmethod
    def _read_answer(answer, want: int | None, arg) -> bytes:
        """Up to ``want`` bytes (None: to the end) of ``answer`` (``_resp``); raises a transient
        error on a failure. ``arg`` is the stream's ``_read_arg``. A plain function, not a method:
        the read of every chunk calls it without one more frame."""
        raise NotImplementedError

    def _read_error(self, attempts: int, exc: BaseException) -> DataSourceError:
        """The error raised when the read at ``offset`` still fails after ``attempts`` attempts."""
        raise NotImplementedError

    def _skip_some(self, n: int) -> bytes:
        """Up to ``n`` bytes of ``_resp`` read to be dropped (skipping to a resume point)."""
        return self._read_answer(self._resp, n, self._read_arg)

    def _partial(self, exc: BaseException) -> bytes:
        """The bytes that arrived before the cut ``exc`` (none unless the transport keeps them)."""
        return b""

    def _drop(self) -> None:
        """Let go of ``_resp`` (its connection) after a cut; ``_resp`` becomes None."""
        raise NotImplementedError

    def _cut_now(self) -> None:
        """Make a read blocked in another thread return now (shut its socket); called by :meth:`abort`."""

    @property
    def _where(self) -> str:
        """The file for messages."""
        return str(getattr(self, "url", "the stream"))

    # ---- the rules
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (fewer only at the end); failures are retried from the same byte.

        Raises:
            DataSourceError: the read still fails after the retries (names the file).
        """
        if n == 0:  # an empty read is no sign of a cut body
            return b""
        attempts = 0
        if self._reopen:
            self._reopen = False
            if self._expect_end is not None and self.offset >= self._expect_end:
                return b""
            self._resume(self.offset)
        while True:
            try:
                if self._resp is None:
                    return b""
                want = n if n is not None and n >= 0 else None
                if self._expect_end is not None:
                    due = self._expect_end - self.offset
                    if due <= 0:  # the span is complete: what follows (a chunked body's end) is not needed
                        return b""
                    want = due if want is None else min(want, due)
                data = self._read_answer(self._resp, want, self._read_arg)
                if not data and self._expect_end is not None and self.offset < self._expect_end:
                    raise self._cut(self._expect_end - self.offset)
                if self._expect_end is not None and self.offset + len(data) > self._expect_end:
                    due = self._expect_end - self.offset
                    raise DataSourceError(f"{self._where}: the server sent more than the {due} bytes it announced "
                                          f"at byte {self.offset}; its answer cannot be trusted")
                self.offset += len(data)
                return data
            except self._transient as exc:
                if isinstance(exc, self._fatal):
                    raise
                partial = self._partial(exc)
                if partial and not self._closed and (self._expect_end is None
                                                     or self.offset + len(partial) <= self._expect_end):
                    self.offset += len(partial)  # the bytes that came before the cut (a chunked body)
                    self._drop()
                    self._reopen = True  # the next read resumes at the byte after them
                    return bytes(partial)
                if self._closed:
                    raise DataSourceError(f"{self._where}: stream closed while reading at byte {self.offset}") from None
                attempts += 1
                if attempts > self.retries:
                    raise self._read_error(attempts, exc) from None
                self._log.debug("read of %s at byte %d failed (%s); retrying", self.url, self.offset,
                                self._log_reason(exc))
                time.sleep(backoff_s(attempts))
                self._resume(self.offset)

    def _cut(self, missing: int) -> BaseException:
        """The error of a body that ended ``missing`` bytes before the end its answer announced
        (one of :attr:`_transient`)."""
        return BodyCutShort(missing)

    def _log_reason(self, exc: BaseException) -> str:
        return repr(exc)

    def _resume(self, resume_at: int) -> None:
        """Reopen at byte ``resume_at``, skipping up to it when the answer starts before it (a
        server that ignores ``Range``).

        Raises:
            DataSourceError: the stream was aborted, or the answer ends before ``resume_at``.
        """
        if self._aborted:  # a read that was waiting to retry when the stream was aborted
            self.close()
            raise DataSourceError(f"{self._where}: stream aborted while reading at byte {self.offset}")
        self._open(resume_at)
        left = resume_at - self.offset
        while left > 0:
            chunk = self._skip_some(min(left, _SKIP_BYTES))
            if not chunk:
                raise DataSourceError(f"{self._where}: body ended at byte {self.offset} while "
                                      f"resuming at {resume_at}") from None
            left -= len(chunk)
            self.offset += len(chunk)

    def abort(self) -> None:
        """Make a read of this stream blocked in another thread return now, with a
        :class:`DataSourceError` (no retry, and no later read reopens it); at exit."""
        self._closed = True
        self._aborted = True
        self._cut_now()

    def close(self) -> None:
        """Let go of the answer; a read failing because of this close is not retried."""
        self._closed = True
        if self._resp is not None:
            self._drop()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
