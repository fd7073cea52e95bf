"""probe's protocol: what the agent, its watchdog and the CLI must agree on, in one place.

The only code the CLI and the agent share (docs/decisions/protocol.md). Each module owns one
cross-process format, its writer and its reader together, the way prometheus client_python's
``mmap_dict.py`` owns its file format:

- ``routes``: every HTTP route (method, path, what it is for). The agent's routers, the
  watchdog's proxy and the CLI's client name routes from this table, never by a string.
- ``envelope``: what every body carries (``ok``, ``rank``; an error's ``status`` and ``error``),
  and the tolerant reading rules every ``from_wire`` follows.
- ``query``, ``bodies``, ``actions``: each HTTP body as a frozen dataclass; the agent builds it
  and calls ``to_wire()``, the CLI reads the same class with ``from_wire()``.
- ``runfiles``: the run-dir layout (``RunFiles``), the default run dir and the rule that says
  when a process's files are dead.
- ``peers``: who is on the other end of a connection, by the kernel's word (SO_PEERCRED,
  sock_diag): the agent and watchdog ask it about clients, the CLI and its dashboard about the
  agent they connected to and the browser that connected to them.
- ``tokens``: what the job's token signs: the health proof (which names the address reached)
  and each rank's entry in the c10d store.

Stdlib only, and nothing here imports probe_agent or probe_cli: the watchdog runs it under
``python -I -S``, the CLI on a laptop without torch (tests/unit/test_cli_imports.py).
"""
