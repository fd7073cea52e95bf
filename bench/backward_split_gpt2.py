"""Where `probe slow` puts the attention core's backward on a transformers GPT-2 (CPU).

GPT-2's ``attn`` runs its core (matmuls, softmax, dropout) between its children ``c_attn`` and
``c_proj``; that core's backward belongs to ``attn``'s self time, not to ``c_proj`` (whose
backward ran just before it). Builds the model from a config (nothing downloaded), traces every
step with the agent in this process, prints slow_modules' rows for one block's attention:

    PYTHONPATH=$PWD python bench/backward_split_gpt2.py [--steps 12] [--layer 1]
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--layer", type=int, default=1)
    ap.add_argument("--native", choices=("auto", "off"), default="off",
                    help="the tracer's hot path: auto = C++ once built, off = Python")
    a = ap.parse_args()
    import torch
    import transformers

    import probe_agent
    from probe_agent.config import AgentConfig
    from probe_agent.store.catalog import load_queries

    torch.set_num_threads(1)
    torch.manual_seed(0)
    # run_clm's model in scripts3's runs (--config_overrides n_layer=4,n_head=4,n_embd=128,...)
    cfg = transformers.GPT2Config(n_layer=4, n_head=4, n_embd=128, n_positions=128,
                                  vocab_size=512, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run_dir = tempfile.mkdtemp(prefix="probe-b-", dir="/tmp")
    agent = probe_agent.start(AgentConfig(port=0, run_dir=os.path.join(run_dir, "run"),
                                          watchdog=False, trace="on", trace_native=a.native))
    try:
        if a.native == "auto":  # wait for the C++ path (built once per machine and torch)
            from probe_agent.collectors.tracer.trace_native import BUILD_TIMEOUT_S, LOADER
            LOADER.request(torch, "auto")
            LOADER.ready.wait(BUILD_TIMEOUT_S)
        for _ in range(a.steps):
            x = torch.randint(0, 512, (8, 128))
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad()
        agent.collectors.tracer.flush()
        agent.store.flush()
        res = agent.store.query(load_queries()["slow_modules"].sql,
                                params={"last": a.steps - 2, "limit": 500})
        hot = agent.collectors.tracer.state()["hot_path"]
        pre = f"transformer.h.{a.layer}.attn"
        print(f"hot path: {hot}; ms per step, median over the last {a.steps - 2} steps")
        cols = ("module", "fwd_ms", "bwd_ms", "fwd_self_ms", "bwd_self_ms")
        print("  ".join(f"{c:>28}" if i == 0 else f"{c:>11}" for i, c in enumerate(cols)))
        for r in res.rows:
            d = dict(zip(res.columns, r))
            if d["module"].startswith(pre):
                print("  ".join(f"{d[c]:>28}" if i == 0 else f"{d[c]:>11.3f}"
                                for i, c in enumerate(cols)))
    finally:
        probe_agent.stop()


if __name__ == "__main__":
    main()
