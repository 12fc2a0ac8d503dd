"""Types of gpuguard._scan (csrc/python/scan_module.cc): explain's C++ log reader, without torch."""

from typing import Sequence, Union

MIN_KEYWORD_BYTES: int

class Scanner:
    """Splits a byte stream into lines (cut at max_line_bytes) and hands out the lines holding a keyword, the
    line after each and the up to context_lines lines before each (cut at context_line_bytes), once each."""

    def __init__(self, keywords: Sequence[bytes], max_line_bytes: int = 16384, context_lines: int = 64,
                 context_line_bytes: int = 1024) -> None: ...
    def feed(self, data: Union[bytes, bytearray, memoryview]) -> list[tuple[int, bool, bytes, int]]: ...
    def finish(self) -> list[tuple[int, bool, bytes, int]]: ...
    @property
    def lines(self) -> int: ...
    @property
    def hits(self) -> int: ...
