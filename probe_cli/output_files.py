"""Files the CLI writes (``-o``): never through a planted symlink, never over a file by surprise.

An operator often writes into a shared directory (/tmp, a team scratch dir), where another user
can plant ``flame.svg -> /home/op/.bashrc`` first. So every output is written to a fresh name
in the same directory, opened with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (nothing there may be
followed or reused), and put in place at the end:

- without ``--overwrite``: ``link()`` to the final name, which fails if anything has that name
  (a file, or a symlink, dangling or not), so the check cannot be raced;
- with ``--overwrite``: ``rename()``, which replaces the name itself, a symlink included,
  never the file a symlink points to.

A failed write leaves no partial file behind. ``refuse_existing`` says the same before a long
command (a 30 s flame, a profile window) starts, so that its work is not thrown away at the end.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from .errors import EXIT_USAGE, ProbeCLIError

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class OutputExistsError(ProbeCLIError):
    exit_code = EXIT_USAGE
    help_text = "pass --overwrite to replace it, or choose another -o"


def refuse_existing(path: str, overwrite: bool) -> None:
    """Raise ``OutputExistsError`` when ``path`` exists (a symlink counts) and may not be
    replaced."""
    if not overwrite and os.path.lexists(path):
        kind = "a symlink" if os.path.islink(path) else "a file"
        raise OutputExistsError(f"{path} exists ({kind}); not writing over it")


def _temp_fd(path: str) -> tuple[int, str]:
    folder = os.path.dirname(os.path.abspath(path))
    while True:
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, _FLAGS, 0o666), tmp
        except FileExistsError:
            continue


def publish(tmp: str, path: str, overwrite: bool) -> None:
    """Put the finished ``tmp`` at ``path`` (module docstring); ``tmp`` is gone afterwards."""
    try:
        if overwrite:
            os.replace(tmp, path)
            return
        try:
            os.link(tmp, path, follow_symlinks=False)
        except FileExistsError:
            raise OutputExistsError(f"{path} exists; not writing over it") from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            # No hard links here (some network and FUSE filesystems): check, then rename.
            refuse_existing(path, overwrite)
            os.rename(tmp, path)
            return
        os.unlink(tmp)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def output_file(path: str, mode: str = "w", *, overwrite: bool = False,
                encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """Open a fresh file to write ``path``'s content into; it becomes ``path`` when the block
    ends without an error (module docstring). ``mode``: ``"w"`` or ``"wb"``."""
    refuse_existing(path, overwrite)
    try:
        fd, tmp = _temp_fd(path)
    except OSError as e:
        raise ProbeCLIError(f"cannot write {path}: {e.strerror or e}") from e
    try:
        with open(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    try:
        publish(tmp, path, overwrite)
    except OSError as e:
        raise ProbeCLIError(f"cannot write {path}: {e.strerror or e}") from e


def private_dir(near: str) -> str:
    """A fresh 0700 directory beside ``near``, for a command's scratch files (made with
    mkdtemp: nobody can have planted it, or anything in it)."""
    folder = os.path.dirname(os.path.abspath(near))
    return tempfile.mkdtemp(prefix=f".{os.path.basename(near)}.", dir=folder)
