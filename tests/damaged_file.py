"""A file damaged in place one way at a time (a byte flipped, or its end cut off), checked, then put back:
one file changed and restored keeps thousands of damaged loads fast."""

from __future__ import annotations

import os
from pathlib import Path

from zip_layout import zip_headers


class DamagedFile:
    """``path`` holds ``raw`` between damages; :meth:`check` loads the damaged file and counts the outcome in
    ``refused`` or ``loaded``."""

    def __init__(self, path: Path, raw: bytes) -> None:
        self.path, self.raw = path, raw
        self.refused = self.loaded = 0

    def flipped(self, at: int, mask: int, what: str) -> None:
        """Check the file with byte ``at`` XOR ``mask``."""
        with self.path.open("r+b") as f:
            f.seek(at)
            f.write(bytes([self.raw[at] ^ mask]))
        self.check(f"{what} (byte {at} ^ {mask:#04x})")
        with self.path.open("r+b") as f:
            f.seek(at)
            f.write(self.raw[at: at + 1])

    def truncated(self, length: int) -> None:
        """Check the file's first ``length`` bytes."""
        os.truncate(self.path, length)
        self.check(f"truncated to {length} of {len(self.raw)} bytes")
        with self.path.open("r+b") as f:
            f.seek(length)
            f.write(self.raw[length:])

    def truncated_at_many_lengths(self) -> None:
        """Check every length that cuts the zip's central directory or end record, and every 7th before them."""
        directory = min(start for kind, start, _ in zip_headers(self.raw) if kind == "central")
        for length in [*range(0, directory, 7), *range(directory, len(self.raw))]:
            self.truncated(length)

    def check(self, what: str) -> None:
        """Load the damaged file; ``what`` names the damage in a failure."""
        raise NotImplementedError
