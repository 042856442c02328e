"""Checking a shared object before the dynamic loader opens it.

``dlopen`` maps a library's segments as its headers describe them; where the file is
shorter than that (a truncated copy), touching the missing pages kills the process with
SIGBUS, which no Python code can catch. So every shared object treadle opens is first
read here: its ELF headers must describe only bytes the file holds, and its dynamic symbol
table must define every symbol the caller will look up (a missing one would otherwise
surface as an AttributeError from ctypes, or be found in another library already loaded).
Generated code is 64-bit little-endian ELF (x86-64, AArch64).
"""
from __future__ import annotations

import ctypes
import struct
from pathlib import Path
from typing import Iterable

HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr
PROGRAM_HEADER = struct.Struct("<IIQQQQQQ")   # Elf64_Phdr
SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
SYMBOL = struct.Struct("<IBBHQQ")              # Elf64_Sym
IDENT = b"\x7fELF\x02\x01"  # magic, 64-bit, little-endian
ET_DYN, SHT_DYNSYM, SHT_NOBITS, SHN_UNDEF = 3, 11, 8, 0


def open_library(path: Path | str, symbols: Iterable[str] = ()) -> ctypes.CDLL:
    """``ctypes.CDLL(path)`` once ``check_shared_object`` has passed."""
    check_shared_object(path, symbols)
    return ctypes.CDLL(str(path))


def check_shared_object(path: Path | str, symbols: Iterable[str] = ()) -> None:
    """Raises OSError naming ``path`` unless it is a complete ELF shared object that
    defines every one of ``symbols``."""
    data = Path(path).read_bytes()
    try:
        missing = set(symbols) - _defined_symbols(data)
    except (ValueError, struct.error) as err:
        raise OSError(f"{path}: not a complete shared object ({err})") from None
    if missing:
        raise OSError(f"{path}: lacks the symbols {', '.join(sorted(missing))}")


def _defined_symbols(data: bytes) -> set[str]:
    """The names the dynamic symbol table defines; ValueError where a header points past
    the end of ``data``."""
    if not data.startswith(IDENT):
        raise ValueError("no 64-bit little-endian ELF header")
    (_, kind, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
     _) = HEADER.unpack_from(data)
    if kind != ET_DYN:
        raise ValueError(f"ELF type {kind}, not a shared object")
    _within(data, phoff, phnum * phentsize, "program headers")
    for k in range(phnum):
        fields = PROGRAM_HEADER.unpack_from(data, phoff + k * phentsize)
        _within(data, fields[2], fields[5], f"segment {k}")
    _within(data, shoff, shnum * shentsize, "section headers")
    sections = [SECTION_HEADER.unpack_from(data, shoff + k * shentsize) for k in range(shnum)]
    for k, section in enumerate(sections):
        if section[1] != SHT_NOBITS:
            _within(data, section[4], section[5], f"section {k}")
    names = set()
    for section in sections:
        if section[1] != SHT_DYNSYM or section[6] >= len(sections):
            continue
        strings = sections[section[6]]
        table = data[strings[4]:strings[4] + strings[5]]
        for offset in range(section[4], section[4] + section[5] - SYMBOL.size + 1, SYMBOL.size):
            name, _, _, index, _, _ = SYMBOL.unpack_from(data, offset)
            if index != SHN_UNDEF:
                names.add(table[name:table.index(b"\0", name)].decode("utf-8", "replace"))
    return names


def _within(data: bytes, offset: int, size: int, what: str) -> None:
    if offset + size > len(data):
        raise ValueError(f"{what} end at byte {offset + size}, the file has {len(data)}")
