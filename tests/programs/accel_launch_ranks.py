"""What each rank started by ``accelerate launch`` sees of its agent (issue 17).

``accelerate launch --multi_gpu`` runs torch.distributed.run inside its own process, which
starts the ranks. Every rank builds an ``Accelerator`` (which calls init_process_group), waits
for the others, and writes ``rank{N}.json`` into ``--ready-dir``: its pid, its parent's, its
agent's rank / world size / URL, and the pids that have an agent socket in the run dir.
"""

from __future__ import annotations

import argparse
import json
import os

from accelerate import Accelerator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--run-dir", required=True)
    args = p.parse_args()
    acc = Accelerator(cpu=True)
    from probe_agent.process import current

    agent = current()
    acc.wait_for_everyone()  # every rank's agent is up: the run dir lists them all
    sockets = sorted(int(n[:-5]) for n in os.listdir(args.run_dir) if n.endswith(".sock"))
    info = {"rank": acc.process_index, "pid": os.getpid(), "parent_pid": os.getppid(),
            "agent": None if agent is None else {"rank": agent.rank, "url": agent.url,
                                                 "world_size": agent.identity.world_size},
            "agent_pids": sockets}
    path = os.path.join(args.ready_dir, f"rank{acc.process_index}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(path + ".tmp", path)
    acc.wait_for_everyone()  # nobody exits (and removes its socket) before all have looked


if __name__ == "__main__":
    main()
