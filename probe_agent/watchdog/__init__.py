"""The watchdog: a small companion process that answers for its rank when the rank cannot.

Why a process: an in-process server needs the GIL to answer, so a C call that holds the GIL
(a long kernel launch, a wedged collective inside C++, a hung ``read``) silences it, backtrace
included. The watchdog is a separate interpreter that never needs the rank's GIL.

The model::

    client ──TCP/unix──▶ watchdog (owns the public sockets) ──unix, deadline──▶ agent (uvicorn)
                              │                                  <run_dir>/<pid>.agent
                              ├─ py-spy dump --json  (ptrace)            ▲ heartbeat file
                              └─ faulthandler dump   (signal + file)     │ <pid>.beat

- The agent binds the public TCP port and ``<pid>.sock`` in the caller's thread (so a taken port
  fails ``start()`` at once), then hands the listening fds to the watchdog (``pass_fds``) and
  serves only its private socket ``<pid>.agent``. It keeps its copies unused: if the watchdog
  dies, the agent starts a new one on them (``serving/watchdog_restarts.py``), and
  serves them itself only after the watchdog has died MAX_RESTARTS times within a few minutes.
- The watchdog is a lean asyncio reverse proxy (stdlib only; started with ``python -I -S``).
  Every request is forwarded with a deadline. A backtrace the agent does not answer within
  PROBE_BACKTRACE_DEADLINE_MS (or at once when the agent's heartbeat is already stale) is read
  from outside (``reader.py``) and says so: ``source: "out-of-process"``, ``route``, ``reason``,
  ``gil_holder``. Other routes get a 504 that says the rank's Python is not answering;
  ``/v1/ranks`` gets the agent's last answer instead, after the same deadline.
- The agent writes a heartbeat (monotonic time and current step) into ``<pid>.beat`` every
  250 ms from a daemon thread: it is how the watchdog tells "slow" from "GIL held", and where it
  reads the last step of a rank that died.
- When the rank exits, the watchdog keeps serving for PROBE_WATCHDOG_GRACE_S with the exit
  status, the last backtrace and the last step (``rank.py``), then exits.

Modules of the watchdog process: ``main.py`` (process entry), ``proxy.py`` (HTTP: when to
wait for the agent and when to stop), ``standin.py`` (what is answered in the agent's place),
``upstream.py`` (the agent's private socket), ``httpwire.py`` (HTTP/1.1 framing), ``reader.py``
(py-spy, faulthandler and /proc stacks), ``rank.py`` (liveness, exit status, forensics),
``beat.py`` (the heartbeat both sides share). The run-dir files, the routes and the bodies are
probe_protocol's. Nothing here runs inside the rank: its side (spawning, the heartbeat, the
restarting of a dead watchdog) is ``serving/watchdog_link.py`` and
``serving/watchdog_restarts.py``, and the faulthandler dumps and the exit record it leaves are
``serving/watchdog_forensics.py``'s. Everything here is stdlib-only and imports from
probe_agent only ``access`` (the access rule both sides apply), ``redact`` and
``collectors.stacks``.
"""
