"""`probe inject PID`: start a probe agent inside a running Python process.

Runs on the operator's side and never imports probe_agent: the agent is started *inside the
target* by a bootstrap file the target executes.

Routes, by the target's Python version:

- 3.14+: ``sys.remote_exec(pid, bootstrap.py)`` (PEP 768), run by the target's own interpreter.
- 3.11–3.13: a ptrace injector (``ptrace.py``, ctypes only: no compiler, no gdb). Measured on
  these AMX CPUs, gdb damages its target and hypno/pyinjector corrupt vector registers; an
  injector that saves and restores the whole extended state (``PTRACE_GETREGSET`` /
  ``SETREGSET`` with ``NT_X86_XSTATE``) was clean over 120 injections. So this one does that.

What the hijacked thread does (``injector.py``), and why it is safe:

1. It is stopped with ``PTRACE_SEIZE`` + ``PTRACE_INTERRUPT`` (one thread; the others keep
   running) at a moment where it holds no allocator or loader lock: blocked in a waiting
   syscall (futex, poll, epoll, nanosleep, ...) or running outside libc and ld.so.
2. It calls libc ``mmap`` for one page, into which we write a 40-byte thread routine and its
   arguments, then ``PyThread_start_new_thread(routine, args)``. Both return at once.
3. Its registers and full xstate are restored, and it resumes where it was (an interrupted
   syscall restarts as after any signal).

The new native thread does ``PyGILState_Ensure(); PyRun_SimpleString(boot);
PyGILState_Release()``. The hijacked thread never touches the GIL, so the two failure modes
measured for in-thread bootstraps cannot happen: ``Py_AddPendingCall`` never running while the
main thread is blocked in a collective, and ``PyGILState_Ensure`` deadlocking when the hijacked
thread was itself waiting for the GIL. If the GIL stays held (a long C call), the new thread
just waits; the CLI times out cleanly, and the bootstrap, past its deadline, does nothing when
it finally runs.
"""
