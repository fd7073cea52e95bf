"""Post-mortem directories probe can prove are its own, and removing them without following a link.

(``open_root`` also guards the native build's directory: collectors/tracer/native_build.py.)

The agent sweeps old copies, and removes a rank's copy after a clean exit. A root the owner
chose carelessly (``PROBE_POSTMORTEM_DIR=$HOME/runs``) or one another uid planted (a symlink to
the owner's home in a shared directory) must cost the owner nothing. So:

- **The root is reached without trusting anyone else** (``open_root``): component by
  component from ``/``, each opened with ``O_NOFOLLOW`` relative to the one before. Every
  directory and symlink on the way must belong to root or to us, and no directory on the way
  may be writable by others unless it is sticky (then nobody else can rename what is in it). A
  symlink that passes is followed (``/home -> /data/home`` is common); any other is refused with
  one line. The copy is then neither written nor swept there: a root another uid controls would
  also let that uid read the owner's traces.
- **A job directory is ours only with proof** (``prove_job``): a directory of our uid (lstat:
  not a link), holding our marker file (``MARKER``: a regular file of ours, naming that job),
  ``rank-<N>/`` directories of ours and nothing else, each holding only the files the copy
  writes (``postmortem.is_layout_file``). Anything else in it, and it is not touched at all.
- **Removal never follows a name**: every directory is opened with ``O_NOFOLLOW`` relative to
  its parent's descriptor, and checked to be the one proven; only layout names are unlinked, and
  directories are removed with ``rmdir`` (never recursively), so a file that appeared since is
  left, with its directory.

Size is what the files take on disk (``st_blocks``), not their apparent size: one sparse file
must not look like 4 GiB. Stdlib only: the agent, its watchdog and the tests use it.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field

from . import postmortem as layout

#: At most this many names are read from one directory (a root holding a huge unrelated tree
#: must not stall the agent's start).
MAX_NAMES = 10000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40


class UntrustedPathError(PermissionError):
    """A path whose directories someone else could change; ``str`` is one line."""


def _trusted_owner(st: os.stat_result) -> bool:
    return st.st_uid in (0, os.getuid())


def _others_can_rename_in(st: os.stat_result) -> bool:
    return bool(st.st_mode & 0o022) and not st.st_mode & stat.S_ISVTX


def open_root(path: str, *, create: bool = False, setting: str = layout.DIR_VAR,
              doing: str = "writing or sweeping post-mortem copies",
              private: bool = False) -> int:
    """A descriptor of directory ``path`` (made 0700 where missing when ``create``), reached
    as the module docstring says, else ``UntrustedPathError`` naming ``setting`` and what is
    not being done there (``doing``). ``private``: ``path`` itself must also be ours and
    writable by nobody else (the native build's directory)."""
    todo = [c for c in os.path.abspath(path).split("/") if c]
    where, fd, links = "/", os.open("/", _DIR_FLAGS), 0

    def refuse(why: str) -> UntrustedPathError:
        return UntrustedPathError(f"{setting}={path}: {why}; not {doing} there (choose a "
                                  "directory of your own)")
    try:
        while todo:
            comp = todo.pop(0)
            if comp == ".":
                continue
            here = os.path.join(where, comp)
            parent = os.fstat(fd)
            if _others_can_rename_in(parent):
                raise refuse(f"{where} is writable by others and not sticky")
            try:
                st = os.stat(comp, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create or comp == "..":
                    raise
                try:
                    os.mkdir(comp, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
                st = os.stat(comp, dir_fd=fd, follow_symlinks=False)
            if not _trusted_owner(st):
                kind = "a symlink owned" if stat.S_ISLNK(st.st_mode) else "owned"
                raise refuse(f"{here} is {kind} by uid {st.st_uid}")
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > _MAX_LINKS:
                    raise refuse("too many symlinks")
                target = os.readlink(comp, dir_fd=fd)
                rest = os.path.normpath(os.path.join(where, target, *todo))
                todo = [c for c in rest.split("/") if c]
                os.close(fd)
                where, fd = "/", os.open("/", _DIR_FLAGS)
                continue
            if comp == "..":
                raise refuse("'..' after a symlink")
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(f"{setting}={path}: {here} is not a directory")
            nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
            if (os.fstat(nfd).st_ino, os.fstat(nfd).st_dev) != (st.st_ino, st.st_dev):
                os.close(nfd)
                raise refuse(f"{here} changed while it was opened")
            os.close(fd)
            fd, where = nfd, here
        last = os.fstat(fd)
        if _others_can_rename_in(last):
            raise refuse(f"{where} is writable by others and not sticky")
        if private and (last.st_uid != os.getuid() or last.st_mode & 0o022):
            raise refuse(f"{where} is not yours alone (owner uid {last.st_uid}, mode "
                         f"{stat.S_IMODE(last.st_mode):o})")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _names(fd: int) -> list[str]:
    names = os.listdir(fd)
    return sorted(names[:MAX_NAMES])


def _own_dir(name: str, parent_fd: int) -> tuple[int, os.stat_result] | None:
    """``name`` under ``parent_fd`` opened, if it is a real directory of our uid."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return None
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return None
    if (os.fstat(fd).st_ino, os.fstat(fd).st_dev) != (st.st_ino, st.st_dev):
        os.close(fd)
        return None
    return fd, st


def _own_file(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() else None


def write_marker(job_fd: int, job: str) -> None:
    """The proof that the job directory is a copy this uid's agent made (``MARKER``)."""
    tmp = f".{layout.MARKER}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=job_fd)
    with open(fd, "w") as f:
        json.dump({"probe": layout.MARKER_KIND, "job": job, "uid": os.getuid()}, f)
    os.replace(tmp, layout.MARKER, src_dir_fd=job_fd, dst_dir_fd=job_fd)


def _marked(job_fd: int, job: str) -> bool:
    st = _own_file(layout.MARKER, job_fd)
    if st is None or st.st_size > 4096:
        return False
    try:
        fd = os.open(layout.MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=job_fd)
        with open(fd, "rb") as f:
            rec = json.loads(f.read(4096))
    except (OSError, ValueError):
        return False
    return (isinstance(rec, dict) and rec.get("probe") == layout.MARKER_KIND
            and rec.get("job") == job and rec.get("uid") == os.getuid())


def _make_job(job_path: str) -> tuple[int, int]:
    """(root fd, job fd) of ``<root>/<job>``, made 0700 and marked where missing, the root
    reached and checked as ``open_root`` does."""
    job = os.path.basename(job_path)
    root_fd = open_root(os.path.dirname(job_path), create=True)
    try:
        job_fd = _make_own_dir(root_fd, job, job_path)
        try:
            if not _marked(job_fd, job):
                write_marker(job_fd, job)
        except BaseException:
            os.close(job_fd)
            raise
    except BaseException:
        os.close(root_fd)
        raise
    return root_fd, job_fd


def make_copy_dir(rank_path: str) -> None:
    """Make ``<root>/<job>/rank-<r>`` (0700, ours; the job directory with its marker).
    Raises OSError (UntrustedPathError for a root someone else could change)."""
    root_fd, job_fd = _make_job(os.path.dirname(rank_path))
    try:
        os.close(_make_own_dir(job_fd, os.path.basename(rank_path), rank_path))
    finally:
        os.close(job_fd)
        os.close(root_fd)


def move_rank_copy(old: str, new: str) -> None:
    """Move a proven rank copy ``old`` to ``new`` (another job directory under the same root:
    the job's agreed name), removing ``old``'s job directory once no rank is left in it."""
    fds = open_rank_copy(old)
    if fds is None:
        raise PermissionError(f"{old} is not a post-mortem copy of ours")
    root_fd, job_fd = fds
    try:
        new_root, new_job = _make_job(os.path.dirname(new))
        try:
            os.rename(os.path.basename(old), os.path.basename(new), src_dir_fd=job_fd,
                      dst_dir_fd=new_job)
        finally:
            os.close(new_job)
            os.close(new_root)
        if os.listdir(job_fd) == [layout.MARKER]:
            try:
                _unmark_and_remove(root_fd, job_fd, os.path.basename(os.path.dirname(old)))
            except OSError:
                pass  # another rank arrived in it meanwhile: it stays, marked
    finally:
        os.close(job_fd)
        os.close(root_fd)


def _make_own_dir(parent_fd: int, name: str, path: str) -> int:
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        pass
    got = _own_dir(name, parent_fd)
    if got is None:
        raise PermissionError(f"{path} is not a directory of uid {os.getuid()}")
    fd, st = got
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(fd, 0o700)
    return fd


@dataclass
class JobProof:
    """A job directory shown to be a copy of ours: what it holds, when it last changed, and
    what it takes on disk."""

    name: str
    ino: int
    dev: int
    newest: float = 0.0
    allocated: int = 0
    ranks: dict[str, list[str]] = field(default_factory=dict)


def prove_job(root_fd: int, name: str) -> JobProof | None:
    """``name`` under the root as a JobProof, or None when anything in it is not the copy's."""
    got = _own_dir(name, root_fd)
    if got is None:
        return None
    job_fd, st = got
    try:
        if not _marked(job_fd, name):
            return None
        proof = JobProof(name, st.st_ino, st.st_dev, st.st_mtime, st.st_blocks * 512)
        for entry in _names(job_fd):
            if entry == layout.MARKER:
                continue
            if layout.rank_of(entry) is None:
                return None
            files = _prove_rank(job_fd, entry, proof)
            if files is None:
                return None
            proof.ranks[entry] = files
        return proof
    except OSError:
        return None
    finally:
        os.close(job_fd)


def _prove_rank(job_fd: int, name: str, proof: JobProof) -> list[str] | None:
    got = _own_dir(name, job_fd)
    if got is None:
        return None
    rank_fd, st = got
    try:
        proof.allocated += st.st_blocks * 512
        names = os.listdir(rank_fd)
        if len(names) > MAX_NAMES:
            return None
        for entry in names:
            fst = _own_file(entry, rank_fd)
            if fst is None or not layout.is_layout_file(entry):
                return None
            proof.newest = max(proof.newest, fst.st_mtime)
            proof.allocated += fst.st_blocks * 512
        return names
    finally:
        os.close(rank_fd)


def _empty_rank(job_fd: int, name: str) -> None:
    """Unlink the layout files of rank directory ``name``, then ``rmdir`` it (OSError when
    something else is in it)."""
    got = _own_dir(name, job_fd)
    if got is None:
        raise PermissionError(f"{name} is not a directory of ours")
    rank_fd = got[0]
    try:
        for entry in os.listdir(rank_fd):
            if layout.is_layout_file(entry) and _own_file(entry, rank_fd) is not None:
                os.unlink(entry, dir_fd=rank_fd)
    finally:
        os.close(rank_fd)
    os.rmdir(name, dir_fd=job_fd)


def remove_job(root_fd: int, proof: JobProof) -> bool:
    """Remove the job directory ``proof`` describes, as the module docstring says. False when
    it changed or held something else (what is left stays)."""
    got = _own_dir(proof.name, root_fd)
    if got is None:
        return False
    job_fd, st = got
    try:
        if (st.st_ino, st.st_dev) != (proof.ino, proof.dev) or not _marked(job_fd, proof.name):
            return False
        for rank in proof.ranks:
            _empty_rank(job_fd, rank)
        _unmark_and_remove(root_fd, job_fd, proof.name)
        return True
    except OSError:
        return False
    finally:
        os.close(job_fd)


def _unmark_and_remove(root_fd: int, job_fd: int, job: str) -> None:
    """The marker goes, then the directory; if something arrived meanwhile (another rank of
    the job made its directory), the marker is written back and the job stays."""
    os.unlink(layout.MARKER, dir_fd=job_fd)
    try:
        os.rmdir(job, dir_fd=root_fd)
    except OSError:
        write_marker(job_fd, job)
        raise


def open_rank_copy(rank_path: str) -> tuple[int, int] | None:
    """(root fd, job fd) when ``rank_path`` is ``<root>/<job>/rank-<r>`` of a proven job
    (root trusted, job ours and marked, the rank directory ours); else None."""
    job_path = os.path.dirname(rank_path)
    job = os.path.basename(job_path)
    if layout.rank_of(os.path.basename(rank_path)) is None:
        return None
    try:
        root_fd = open_root(os.path.dirname(job_path))
    except OSError:
        return None
    got = _own_dir(job, root_fd)
    if got is None or not _marked(got[0], job):
        if got is not None:
            os.close(got[0])
        os.close(root_fd)
        return None
    rank = _own_dir(os.path.basename(rank_path), got[0])
    if rank is None:
        os.close(got[0])
        os.close(root_fd)
        return None
    os.close(rank[0])
    return root_fd, got[0]


def is_rank_copy(rank_path: str) -> bool:
    fds = open_rank_copy(rank_path)
    if fds is None:
        return False
    for fd in fds:
        os.close(fd)
    return True


def remove_rank_copy(rank_path: str) -> bool:
    """A rank's copy after a clean exit: its layout files and directory, then the job's
    directory once no rank is left in it. Only a proven copy (``open_rank_copy``)."""
    fds = open_rank_copy(rank_path)
    if fds is None:
        return False
    root_fd, job_fd = fds
    job = os.path.basename(os.path.dirname(rank_path))
    try:
        _empty_rank(job_fd, os.path.basename(rank_path))
        if os.listdir(job_fd) == [layout.MARKER]:
            _unmark_and_remove(root_fd, job_fd, job)
        return True
    except OSError:
        return False
    finally:
        os.close(job_fd)
        os.close(root_fd)
