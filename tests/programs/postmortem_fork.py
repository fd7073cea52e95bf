"""An agent's process forks a worker (as a DataLoader does) and ends it with SIGTERM: the
worker's signal must not be taken for the rank's own."""

from __future__ import annotations

import os
import signal
import sys
import time

import probe_agent

probe_agent.start()
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
time.sleep(0.5)
os.kill(child, signal.SIGTERM)
_, status = os.waitpid(child, 0)
time.sleep(2.0)  # past the helper's 0.5 s: a misrouted SIGTERM would have killed us by now
print("alive", os.WIFSIGNALED(status) and os.WTERMSIG(status), flush=True)
sys.exit(0)
