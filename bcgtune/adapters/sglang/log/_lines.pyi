# Types of the compiled line scanner (_lines.c).

class LineTable:
    """Ids of the texts of prefill layouts and rare lines, kept across scan() calls; level:
    the widest pass to use where the processor has it (2: AVX2, 1: SSE2, 0: line by line)."""

    def __init__(self, level: int = 2) -> None: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def nkeys(self) -> int: ...
    def scan(
        self,
        data: bytes,
        start: int,
        stop: int,
        rare_needles: tuple[bytes, ...],
        new_seq: bytes,
        max_key: int,
        max_rare: int,
        layout_rare: int = 0,
        /,
    ) -> tuple[bytes, bytes, bytes, bytes]: ...
    def clear(self) -> None: ...

def read_fields(
    data: bytes, offset: int, starts: object, plans: object, offsets: object, lengths: object, width: int, /
) -> bytes: ...
