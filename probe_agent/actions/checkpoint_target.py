"""Where `probe checkpoint` may write, and what a full disk looks like.

A checkpoint must never destroy anything it was not asked to replace. The rules, checked when
the action is submitted (``POST /v1/actions``: the API is reachable without the CLI) and again
on the training thread right before the final rename:

======================================  =================================================
what is at PATH now                     what happens
======================================  =================================================
nothing                                 written
a regular file (or a link to one)       refused (409, reason ``exists``) unless overwrite;
                                        a sharded checkpoint (a directory) never replaces it
a directory                             refused for a replicated checkpoint (one file); a
                                        sharded one replaces only a directory that is itself
                                        a torch.distributed.checkpoint (has ``.metadata``),
                                        and only with overwrite
a device, FIFO, socket (or a link       always refused: ``os.rename`` over ``/dev/null`` as
to one), a dangling link                root replaces the device node with a regular file
======================================  =================================================

Without overwrite, the final step is ``os.link(tmp, PATH)``, which fails if anything appeared at
PATH meanwhile (no check-then-rename race); where hard links are not supported it falls back to
the re-check and ``os.rename``. With overwrite the re-check and ``os.replace`` leave a window
of a few microseconds in which only the job's own user (or root) could swap PATH.

Full disk: ``torch.save`` turns ENOSPC into ``RuntimeError: [enforce fail at
inline_container.cc:672] ... unexpected pos``. ``preflight`` refuses up front when ``statvfs``
shows less room than the checkpoint's size estimate; ``disk_full`` finds ENOSPC or EDQUOT behind
a failed save and says where, how much was needed and how much is free.

Stdlib only at import; the tensors are only walked through their own methods.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

from ..errors import ProbeAgentError

#: Added to the tensors' bytes in a size estimate, as measured with torch 2.13: pickled Python
#: state (an RNG file with numpy's is 14 KiB), and per tensor its zip records, 64-byte
#: alignment and pickled rebuild call (~280 bytes each over 400 small tensors).
_OVERHEAD = 16 * 1024
_PER_TENSOR = 256
_FULL = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded"}


class CheckpointError(ProbeAgentError):
    """A checkpoint refused or failed without writing anything (HTTP 400, or 409 ``exists``)."""

    status = 400


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def inspect(path: str) -> tuple[str | None, bool]:
    """What is at ``path``: (``None`` | ``"file"`` | ``"directory"`` | a device kind |
    ``"dangling symlink"``, whether ``path`` itself is a symlink)."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None, False
    if not stat.S_ISLNK(st.st_mode):
        return _kind(st.st_mode), False
    try:
        return _kind(os.stat(path).st_mode), True
    except OSError:
        return "dangling symlink", True


def is_dcp_directory(path: str) -> bool:
    """A torch.distributed.checkpoint directory: its coordinator writes ``.metadata`` last."""
    return os.path.isfile(os.path.join(path, ".metadata"))


def require_absolute(path: str) -> None:
    """The API resolves nothing against the training job's working directory (the operator
    does not know it); the CLI sends the path it resolved against its own."""
    if not os.path.isabs(path):
        raise CheckpointError(
            f"checkpoint path {path!r} is relative: give an absolute path (the probe CLI "
            "resolves a relative one against its own working directory)"
        )


def check_destination(path: str, *, overwrite: bool, layout: str | None) -> None:
    """Raise CheckpointError unless writing ``path`` is allowed (see the module table).

    Args:
        layout: ``"file"`` (torch.save), ``"directory"`` (sharded) or None when not known yet
            (at submit time: the rules that hold for both are checked; the rest on the
            training thread).
    """
    kind, link = inspect(path)
    if kind is None:
        return
    what = f"a symlink to a {kind}" if link and kind != "dangling symlink" else f"a {kind}"
    if kind not in ("file", "directory"):
        raise CheckpointError(
            f"{path} is {what}: a checkpoint is written only as a regular file or a new "
            "directory; give another path"
        )
    if kind == "directory":
        if layout == "file":
            raise CheckpointError(f"{path} is {what}: give a file path for this checkpoint "
                                  "(a replicated model is saved as one file)")
        if link or not is_dcp_directory(path):
            raise CheckpointError(
                f"{path} is {what} and not a torch.distributed.checkpoint: give a path that "
                "does not exist yet (a sharded checkpoint creates its directory)"
            )
    elif layout == "directory":
        raise CheckpointError(f"{path} is {what}: a sharded checkpoint is a directory and "
                              "never replaces a file; give a new path")
    if not overwrite:
        err = CheckpointError(
            f"{path} exists ({what}): pass --overwrite (API: \"overwrite\": true) to replace "
            "it, or give a new path", reason="exists")
        err.status = 409
        raise err


def check_args(args: dict[str, Any], rank: int, world_size: int) -> None:
    """The submit-time check of a ``checkpoint`` action (``POST /v1/actions``), on every rank:
    ``PATH`` in whichever layout the step boundary will choose, and this rank's RNG file."""
    path, overwrite = str(args["path"]), bool(args.get("overwrite"))
    require_absolute(path)
    check_destination(path, overwrite=overwrite, layout=None)
    if world_size > 1:
        check_destination(f"{path}.rng.rank{rank}", overwrite=overwrite, layout="file")


def commit_file(tmp: str, path: str, *, overwrite: bool) -> None:
    """Move the finished ``tmp`` to ``path``, re-checking ``path`` first (module docstring)."""
    check_destination(path, overwrite=overwrite, layout="file")
    if overwrite:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)  # atomic: EEXIST if anything appeared at path since the check
    except FileExistsError:
        check_destination(path, overwrite=False, layout="file")  # says what appeared
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK,
                           errno.EXDEV, errno.EACCES):
            raise
        os.rename(tmp, path)  # a filesystem without hard links (vfat, some FUSE)
        return
    os.unlink(tmp)


def commit_directory(tmp: str, path: str, *, overwrite: bool, tag: str) -> None:
    """Move a finished sharded checkpoint directory to ``path`` (rank 0 only)."""
    import shutil

    check_destination(path, overwrite=overwrite, layout="directory")
    if inspect(path)[0] is None:
        os.rename(tmp, path)  # a non-directory that appeared meanwhile: ENOTDIR, not replaced
        return
    old = f"{path}.old-{tag}"
    os.rename(path, old)  # an old checkpoint (checked: .metadata, not a link), set aside
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def estimate_bytes(obj: Any) -> int:
    """Bytes ``torch.save(obj)`` will write, about: every distinct storage once, plus overhead."""
    seen: set[tuple[int, int]] = set()
    total, stack = _OVERHEAD, [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif hasattr(o, "untyped_storage"):
            try:
                s = o.untyped_storage()
                key = (s.data_ptr(), s.nbytes())
            except Exception:  # meta, sparse or a tensor subclass: its own bytes only
                key = (id(o), int(o.numel() * o.element_size()))
            if key not in seen:
                seen.add(key)
                total += key[1] + _PER_TENSOR
    return total


def free_bytes(directory: str) -> int | None:
    """Bytes this process can still write under ``directory`` (root may use reserved blocks)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return blocks * st.f_frsize


def human(n: int | None) -> str:
    if n is None:
        return "unknown"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


def preflight(directory: str, needed: int) -> None:
    """Refuse before writing a byte when the filesystem has less room than the estimate."""
    free = free_bytes(directory)
    if free is not None and free < needed:
        raise CheckpointError(
            f"disk full: {directory} has {human(free)} free and the checkpoint needs about "
            f"{human(needed)}; nothing was written; free space there or give a path on another "
            "filesystem"
        )


def disk_full(e: BaseException, directory: str, needed: int | None,
              seen: OSError | None = None) -> CheckpointError | None:
    """The one-line error for a save that failed for lack of room, else None.

    Args:
        seen: an OSError the file object saw itself (torch.save swallows it into its own
            RuntimeError; the exception chain usually, but not always, still holds it).
    """
    cause: BaseException | None = seen
    chain: BaseException | None = e
    while cause is None and chain is not None:
        if isinstance(chain, OSError) and chain.errno in _FULL:
            cause = chain
        chain = chain.__cause__ or chain.__context__
    code = getattr(cause, "errno", None)
    if code not in _FULL:
        text = str(e)
        code = next((c for c in _FULL if os.strerror(c) in text), None)
        if code is None:
            return None
    need = f"about {human(needed)}" if needed is not None else "more than that"
    return CheckpointError(
        f"{_FULL[code]} ({os.strerror(code)}) at {directory}: the checkpoint needs {need} and "
        f"{human(free_bytes(directory))} is free; the temporary file was removed and nothing "
        "was written; free space there or give a path on another filesystem"
    )
