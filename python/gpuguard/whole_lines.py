"""Output that many ranks share (one stdout under torchrun, srun, mpirun): each line reaches it in one write.

``print(text)`` makes two writes (the text, then the newline) when the stream is unbuffered (``python -u``,
``PYTHONUNBUFFERED=1``, what launchers and notebooks often set), so two ranks printing at once can glue their
lines together (``{...}{...}`` and then two newlines), which breaks every line-by-line reader of
``gpuguard check --json``. Here a line, newline included, goes to the file descriptor in one ``write``, which a
pipe keeps whole up to PIPE_BUF (4 KiB on Linux) and a file opened for appending keeps whole too.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, TextIO


def write_line(text: str, stream: Optional[TextIO] = None) -> None:
    """Writes ``text`` and a newline to ``stream`` (sys.stdout when None) in one write to its file descriptor,
    after what the stream holds already. A stream without one (pytest's capture, StringIO) gets one
    ``write`` call instead."""
    stream = sys.stdout if stream is None else stream
    if stream is None:  # pythonw, or the stream closed: nowhere to write, as print() does
        return
    line = text if text.endswith("\n") else text + "\n"
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        stream.write(line)
        stream.flush()
        return
    stream.flush()  # what was printed before goes first
    data = line.encode(getattr(stream, "encoding", None) or "utf-8", errors="backslashreplace")
    while data:  # a pipe may take a long line in parts; a short one (< PIPE_BUF) goes in one piece
        written = os.write(fd, data)
        data = data[written:]
