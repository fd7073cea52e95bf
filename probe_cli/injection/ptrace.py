"""ptrace through ctypes, x86-64 Linux only: seize one thread, call a function in it, restore.

``Tracee.call(addr, *args)`` runs ``addr(args...)`` on the stopped thread: the registers and the
full extended state (x87/SSE/AVX/AVX-512/AMX, ``NT_X86_XSTATE``) are saved first and restored
after, exactly. The call returns to address 0; the resulting SIGSEGV at ``rip == 0`` is our
"returned" trap, and it is never delivered. ``orig_rax = -1`` while our code runs keeps the
kernel from restarting an interrupted syscall on our registers; restoring the saved ones
(with the syscall number) lets it restart the original syscall as after any signal.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import time

PTRACE_PEEKDATA = 2
PTRACE_POKEDATA = 5
PTRACE_CONT = 7
PTRACE_GETREGS = 12
PTRACE_SETREGS = 13
PTRACE_DETACH = 17
PTRACE_GETREGSET = 0x4204
PTRACE_SETREGSET = 0x4205
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_EVENT_STOP = 128
NT_X86_XSTATE = 0x202
WALL = 0x40000000
XSTATE_MAX = 64 * 1024

_libc = ctypes.CDLL(None, use_errno=True)
_ptrace = _libc.ptrace
_ptrace.restype = ctypes.c_long
_ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]

REG_NAMES = ("r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags "
             "rsp ss fs_base gs_base ds es fs gs").split()


class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in REG_NAMES]

    def copy(self) -> Regs:
        r = Regs()
        ctypes.memmove(ctypes.byref(r), ctypes.byref(self), ctypes.sizeof(Regs))
        return r


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class PtraceError(OSError):
    pass


class TargetGone(Exception):
    pass


def _check(result: int, what: str) -> int:
    if result == -1:
        err = ctypes.get_errno()
        if err:
            raise PtraceError(err, f"{what}: {os.strerror(err)}")
    return result


def _call(request: int, tid: int, addr: int = 0, data: int = 0, what: str = "ptrace") -> int:
    ctypes.set_errno(0)
    return _check(_ptrace(request, tid, ctypes.c_void_p(addr), ctypes.c_void_p(data)), what)


class Tracee:
    """One seized thread of a process. Use as a context manager: leaving detaches."""

    def __init__(self, pid: int, tid: int) -> None:
        self.pid = pid
        self.tid = tid
        self.attached = False
        self.pending: list[int] = []

    def seize(self) -> None:
        _call(PTRACE_SEIZE, self.tid, what=f"PTRACE_SEIZE {self.tid}")
        self.attached = True

    def __enter__(self) -> Tracee:
        self.seize()
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def detach(self) -> None:
        if not self.attached:
            return
        sig = self.pending.pop(0) if self.pending else 0
        try:
            _call(PTRACE_DETACH, self.tid, 0, sig, what="PTRACE_DETACH")
        except PtraceError as e:
            if e.errno == errno.ESRCH:  # running, not stopped: stop it to detach
                try:
                    self.interrupt(1.0)
                    _call(PTRACE_DETACH, self.tid, 0, sig, what="PTRACE_DETACH")
                except (PtraceError, TargetGone, TimeoutError):
                    pass
        self.attached = False
        for extra in self.pending:  # more than one signal arrived meanwhile: send them back
            try:
                os.kill(self.pid, extra)
            except OSError:
                pass
        self.pending.clear()

    # -- stops ------------------------------------------------------------------------------
    def _wait(self, timeout: float) -> tuple[int, int]:
        """(signal, ptrace event) of the next stop."""
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.tid, WALL | os.WNOHANG)
            if pid:
                if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                    self.attached = False
                    raise TargetGone(f"thread {self.tid} exited")
                return os.WSTOPSIG(status), status >> 16
            if time.monotonic() > deadline:
                raise TimeoutError(f"thread {self.tid} did not stop within {timeout:g} s")
            time.sleep(0.0002)

    def interrupt(self, timeout: float = 2.0) -> None:
        """Stop the thread (PTRACE_INTERRUPT); signals that arrive first are kept for later."""
        _call(PTRACE_INTERRUPT, self.tid, what="PTRACE_INTERRUPT")
        while True:
            sig, event = self._wait(timeout)
            if event == PTRACE_EVENT_STOP:
                return
            # A signal-delivery stop came first: keep the signal for detach, and let the
            # thread run on to the interrupt's own stop.
            self.pending.append(sig)
            self.cont()

    def cont(self, sig: int = 0) -> None:
        _call(PTRACE_CONT, self.tid, 0, sig, what="PTRACE_CONT")

    # -- state ------------------------------------------------------------------------------
    def regs(self) -> Regs:
        r = Regs()
        _call(PTRACE_GETREGS, self.tid, 0, ctypes.addressof(r), what="PTRACE_GETREGS")
        return r

    def set_regs(self, r: Regs) -> None:
        _call(PTRACE_SETREGS, self.tid, 0, ctypes.addressof(r), what="PTRACE_SETREGS")

    def xstate(self) -> ctypes.Array[ctypes.c_char]:
        buf = ctypes.create_string_buffer(XSTATE_MAX)
        iov = IoVec(ctypes.addressof(buf), XSTATE_MAX)
        _call(PTRACE_GETREGSET, self.tid, NT_X86_XSTATE, ctypes.addressof(iov),
              what="PTRACE_GETREGSET NT_X86_XSTATE")
        out = ctypes.create_string_buffer(iov.len)
        ctypes.memmove(out, buf, iov.len)
        return out

    def set_xstate(self, buf: ctypes.Array[ctypes.c_char]) -> None:
        iov = IoVec(ctypes.addressof(buf), len(buf))
        _call(PTRACE_SETREGSET, self.tid, NT_X86_XSTATE, ctypes.addressof(iov),
              what="PTRACE_SETREGSET NT_X86_XSTATE")

    def poke(self, addr: int, data: bytes) -> None:
        """Write ``data`` at ``addr`` (page protections do not apply, as for a debugger)."""
        if len(data) % 8:
            tail_addr = addr + len(data) - len(data) % 8
            old = self.peek(tail_addr)
            keep = old[len(data) % 8:]
            data = data + keep
        for i in range(0, len(data), 8):
            word = int.from_bytes(data[i:i + 8], "little")
            _call(PTRACE_POKEDATA, self.tid, addr + i, word, what="PTRACE_POKEDATA")

    def peek(self, addr: int) -> bytes:
        ctypes.set_errno(0)
        v = _ptrace(PTRACE_PEEKDATA, self.tid, ctypes.c_void_p(addr), None)
        if v == -1 and ctypes.get_errno():
            _check(-1, "PTRACE_PEEKDATA")
        return (v & (2**64 - 1)).to_bytes(8, "little")

    # -- calls ------------------------------------------------------------------------------
    def call(self, saved: Regs, addr: int, *args: int, timeout: float = 5.0) -> int:
        """Run ``addr(*args)`` (at most 6 integer args) on the stopped thread; returns rax.

        The thread must be stopped; it is stopped again afterwards, with ``saved`` not yet
        restored (the caller restores once, after its last call).
        """
        r = saved.copy()
        sp = ((saved.rsp - 1024) & ~0xF) - 8  # past the red zone; rsp % 16 == 8 at entry
        self.poke(sp, b"\0" * 8)  # the return address: 0, a fault we catch
        r.rsp, r.rip, r.rax, r.orig_rax = sp, addr, 0, 2**64 - 1
        for name, value in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), args, strict=False):
            setattr(r, name, value & (2**64 - 1))
        self.set_regs(r)
        self.cont()
        deadline = time.monotonic() + timeout
        while True:
            sig, event = self._wait(max(0.0, deadline - time.monotonic()))
            if event == PTRACE_EVENT_STOP:
                self.cont()
                continue
            now = self.regs()
            if sig == signal.SIGSEGV and now.rip == 0:
                return int(now.rax)
            if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE):
                name = signal.Signals(sig).name
                raise PtraceError(errno.EFAULT,
                                  f"the injected call faulted ({name} at {now.rip:#x})")
            self.cont(sig)  # someone else's signal: deliver it now, our call goes on
