"""Serving: everything between a socket and the agent's store, evaluator and action queue.

- server.py: ``AgentServer``, the sockets we bind ourselves and uvicorn in a daemon thread;
- app.py: ``create_app``, the FastAPI app, its ``AdmissionMiddleware`` (access rule, serving
  budget) and the error handlers; routes/: one router per feature (the paths and the bodies
  they send are probe_protocol's, shared with the watchdog and the CLI);
- budget.py: what serving may cost the training job (PROBE_SERVE_CPU);
- watchdog_link.py, watchdog_restarts.py, watchdog_forensics.py: the rank's side of the
  watchdog (spawning it, the heartbeat, restarting it; the faulthandler dumps and the exit
  record it reads); the watchdog process itself is watchdog/.

Importing this package imports nothing else.
"""
