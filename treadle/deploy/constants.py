"""``constants.bin``: a 128-byte header, then every constant at a 64-byte boundary.

The header (little-endian) holds the magic ``TREADLEK``, the folder format (u64), the
treadle version and the model id (32 bytes of text each, NUL-padded), the payload's size
and its CRC-32 (zlib's; u64 each). The library refuses a file whose format, version or
model differs from its own, whose size differs from its model's or whose checksum is
wrong, naming the file.
"""
from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Mapping

import numpy as np

from treadle.deploy.header import FORMAT

MAGIC = b"TREADLEK"
HEADER_BYTES = 128
TEXT_BYTES = 32
ALIGN = 64  # as the executor aligns constants: vector loads never split a cache line


def pack(constants: Mapping[int, np.ndarray]) -> tuple[bytes, dict[int, int]]:
    """The payload, and each constant's offset in it, by word."""
    payload = bytearray()
    offsets = {}
    for word, array in constants.items():
        payload += bytes(-len(payload) % ALIGN)
        offsets[word] = len(payload)
        payload += np.ascontiguousarray(array).tobytes()
    return bytes(payload), offsets


def write(path: Path, payload: bytes, version: str, model_id: str) -> None:
    texts = [text.encode() for text in (version, model_id)]
    if any(len(text) >= TEXT_BYTES for text in texts):
        raise ValueError(f"version {version!r} or model id {model_id!r} is too long")
    header = (MAGIC + struct.pack("<Q", FORMAT)
              + b"".join(text.ljust(TEXT_BYTES, b"\0") for text in texts)
              + struct.pack("<QQ", len(payload), checksum(payload)))
    with open(path, "wb") as file:
        file.write(header.ljust(HEADER_BYTES, b"\0"))
        file.write(payload)


def checksum(payload: bytes) -> int:
    return zlib.crc32(payload)
