"""A `.bz2` file read as a binary stream, decompressed ahead of the reader by a background thread.

libbz2 releases the GIL, so decompression overlaps with whatever consumes the stream (the XML parsing of a
Wikipedia dump, which is about as slow). The thread is stopped before any `os.fork` of this process and started
again after it (hooks registered when this module is imported), so that the processes a build forks inherit no
thread holding a lock.
"""

from __future__ import annotations

import bz2
import io
import os
import threading
import weakref
from collections import deque


def open_bz2(path: str | os.PathLike) -> io.BufferedReader:
    """Opens a `.bz2` file (one or several concatenated streams, like `bz2.open`) for reading, decompressed by a
    background thread."""
    return io.BufferedReader(ThreadedBZ2Reader(os.fspath(path)), buffer_size=1 << 16)


class ThreadedBZ2Reader(io.RawIOBase):
    """A `.bz2` file (one or several concatenated streams, like `bz2.open`) decompressed by a background thread
    a block at a time; at most `max_blocks` decompressed blocks wait in memory.

    The thread never runs across a fork of this process: it stops after its current block before `os.fork` and
    starts again when the stream is read next, so that a forked child inherits no thread holding a lock. So a
    reader can be opened early (decompressing while the process does something else) and the process can still
    fork its workers. Blocks are small (`max_output` bytes: a millisecond's work), so stopping waits little.
    """

    def __init__(self, path: str, block_size: int = 1 << 14, max_output: int = 1 << 17, max_blocks: int = 256):
        super().__init__()
        self._file = open(path, "rb")
        self._block_size, self._max_output, self._max_blocks = block_size, max_output, max_blocks
        self._decompressor = bz2.BZ2Decompressor()
        self._compressed = b""  # read from the file, not given to the decompressor yet
        self._in_stream = False  # some bytes of the current stream given to the decompressor
        self._streams = 0  # streams ended
        self._blocks: deque = deque()  # decompressed blocks; then None (the end) or the error
        self._changed = threading.Condition()
        self._halting = self._ended = self._fork_pending = self._forked = False
        self._thread: threading.Thread | None = None
        self._pending = memoryview(b"")
        self._done = False
        _DECOMPRESSING.add(self)
        self._run()

    def _run(self) -> None:
        """Starts the thread, unless it runs, has decompressed the whole file or a fork is under way."""
        with self._changed:
            if self._thread is None and not (self._ended or self._fork_pending or self._forked or self.closed):
                self._halting = False
                self._thread = threading.Thread(target=self._decompress, name="edmem-bz2-decompress", daemon=True)
                self._thread.start()

    def _halt(self, for_fork: bool = False) -> None:
        """Stops the thread after the block it is decompressing, and waits for it."""
        with self._changed:
            self._halting = True
            self._fork_pending |= for_fork
            thread = self._thread
            self._changed.notify_all()
        if thread is not None:
            thread.join()
            with self._changed:
                if self._thread is thread:
                    self._thread = None

    def _decompress(self) -> None:
        try:
            while True:
                with self._changed:
                    while len(self._blocks) >= self._max_blocks and not self._halting:
                        self._changed.wait()
                    if self._halting:
                        return
                block = self._next_block()
                with self._changed:
                    self._blocks.append(block)
                    self._ended = block is None
                    self._changed.notify_all()
                if block is None:
                    return
        except BaseException as err:  # handed to the reading thread
            with self._changed:
                self._blocks.append(err)
                self._ended = True
                self._changed.notify_all()

    def _next_block(self) -> bytes | None:
        """The next decompressed bytes (at most `max_output`); None at the end of the file."""
        while True:
            if self._decompressor.eof:  # another stream may follow (concatenated streams, as bz2.open reads them)
                self._compressed = self._decompressor.unused_data
                self._decompressor = bz2.BZ2Decompressor()
                self._in_stream = False
                self._streams += 1
            data = b""
            if self._decompressor.needs_input:
                if not self._compressed:
                    self._compressed = self._file.read(self._block_size)
                    if not self._compressed:
                        if self._in_stream:
                            raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                        return None
                data, self._compressed = self._compressed, b""
            fresh = not self._in_stream and self._streams > 0
            self._in_stream = True
            try:
                out = self._decompressor.decompress(data, self._max_output)
            except OSError:
                if fresh:  # trailing bytes after the last stream are ignored, as bz2.open does
                    return None
                raise
            if out:
                return out

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            if self._done:
                return 0
            with self._changed:
                while not self._blocks:
                    if self._forked:
                        raise RuntimeError("a dump being read cannot be read on in a forked child process")
                    self._run()  # stopped for a fork
                    self._changed.wait()
                item = self._blocks.popleft()
                self._changed.notify_all()
            if item is None:
                self._done = True
                return 0
            if isinstance(item, BaseException):
                self._done = True
                raise item
            self._pending = memoryview(item)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def close(self) -> None:
        if not self.closed:
            _DECOMPRESSING.discard(self)
            self._halt()
            self._file.close()
        super().close()


# The open readers: their threads stop before a fork of this process and start again after it.
_DECOMPRESSING: weakref.WeakSet[ThreadedBZ2Reader] = weakref.WeakSet()


def _halt_before_fork() -> None:
    for reader in list(_DECOMPRESSING):
        reader._halt(for_fork=True)


def _forked_parent() -> None:
    """A reader waiting for a block (in another thread) starts the thread again; the others do when read next."""
    for reader in list(_DECOMPRESSING):
        with reader._changed:
            reader._fork_pending = False
            reader._changed.notify_all()


def _forked_child() -> None:
    for reader in list(_DECOMPRESSING):
        reader._forked = True
    _DECOMPRESSING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_halt_before_fork, after_in_parent=_forked_parent, after_in_child=_forked_child)
