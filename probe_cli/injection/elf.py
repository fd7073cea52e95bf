"""Dynamic symbols of an ELF file, and a process's loaded objects (stdlib only).

Enough of ELF64 to find ``mmap`` in libc and the ``Py*`` functions in libpython (or in a
python executable that exports them), and to read a constant such as ``Py_Version`` from the
file, without ptrace.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

SHT_DYNSYM = 11
PT_LOAD = 1


class ElfError(Exception):
    pass


@dataclass(slots=True)
class ElfSymbols:
    path: str
    symbols: dict[str, tuple[int, int]]  # name -> (st_value, st_size), defined symbols only
    loads: list[tuple[int, int, int]]  # PT_LOAD (p_offset, p_vaddr, p_filesz)
    first_vaddr: int

    def read_const(self, name: str, size: int) -> bytes | None:
        """The initial bytes of a data symbol, read from the file."""
        sym = self.symbols.get(name)
        if sym is None:
            return None
        for off, vaddr, filesz in self.loads:
            if vaddr <= sym[0] < vaddr + filesz:
                with open(self.path, "rb") as f:
                    f.seek(off + sym[0] - vaddr)
                    return f.read(size)
        return None


def read_symbols(path: str) -> ElfSymbols:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ElfError(f"cannot read {path}: {e.strerror}") from None
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ElfError(f"{path} is not a little-endian ELF64 file")
    (e_phoff, e_shoff) = struct.unpack_from("<QQ", data, 0x20)
    e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", data, 0x36)
    loads = []
    for i in range(e_phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, e_phoff + i * e_phentsize)
        if p_type == PT_LOAD:
            loads.append((p_offset, p_vaddr, p_filesz))
    if not loads:
        raise ElfError(f"{path} has no loadable segment")
    symbols: dict[str, tuple[int, int]] = {}
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize)
                for i in range(e_shnum)]
    for sh in sections:
        if sh[1] != SHT_DYNSYM:
            continue
        strtab = sections[sh[6]]
        str_off = strtab[4]
        off, size, entsize = sh[4], sh[5], sh[9] or 24
        for j in range(size // entsize):
            st_name, st_info, _other, st_shndx, st_value, st_size = struct.unpack_from(
                "<IBBHQQ", data, off + j * entsize)
            if st_shndx == 0 or st_value == 0:
                continue
            end = data.index(b"\0", str_off + st_name)
            name = data[str_off + st_name:end].decode(errors="replace")
            symbols.setdefault(name, (st_value, st_size))
    first = min(v - o for o, v, _ in loads if o == 0) if any(o == 0 for o, _, _ in loads) \
        else loads[0][1] - loads[0][0]
    return ElfSymbols(path, symbols, loads, first)


@dataclass(slots=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    path: str


def read_maps(pid: int) -> list[Mapping]:
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 5:
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5].strip() if len(parts) > 5 else ""
            out.append(Mapping(lo, hi, parts[1], int(parts[2], 16), path))
    return out


@dataclass(slots=True)
class LoadedObject:
    path: str
    base: int  # what to add to a symbol's st_value
    elf: ElfSymbols

    def address(self, name: str) -> int | None:
        sym = self.elf.symbols.get(name)
        return None if sym is None else self.base + sym[0]


def loaded_object(pid: int, maps: list[Mapping], match: str) -> LoadedObject | None:
    """The first mapped file whose basename starts with ``match`` (``libc.so``, ``libpython``)
    or equals the executable when ``match`` is ``""`` is not used."""
    for m in maps:
        if m.offset == 0 and m.path.startswith("/") and os.path.basename(m.path).startswith(match):
            return _loaded(pid, m)
    return None


def executable(pid: int, maps: list[Mapping]) -> LoadedObject | None:
    exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    for m in maps:
        if m.offset == 0 and m.path == exe:
            return _loaded(pid, m)
    return None


def _loaded(pid: int, m: Mapping) -> LoadedObject:
    # Through /proc/<pid>/root: the file as the target sees it, even inside a container.
    root_path = f"/proc/{pid}/root{m.path}"
    path = root_path if os.path.exists(root_path) else m.path
    elf = read_symbols(path)
    return LoadedObject(m.path, m.start - elf.first_vaddr, elf)
