"""Tokens per optimizer step from the root model's integer input, on both hot paths: keyword
``input_ids`` (the HF convention) reaches the tracer, a no_grad validation pass inside a step
adds no tokens, and root calls before the first optimizer step (numbered by the fallback count)
leave nothing in the steps that follow. probe_agent.log(tokens=N) overrides."""

from __future__ import annotations

import pytest

from tests.support import wait_until

torch = pytest.importorskip("torch")


class TokenLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.out = torch.nn.Linear(16, 50)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(input_ids))


def test_tokens_count_training_micro_batches_only(make_agent):
    # GIVEN an agent tracing every step
    agent = make_agent(trace="on")
    assert agent.stepclock.poll()
    model = TokenLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # AND a validation pass before training: 20 root calls, past the fallback's 16
    with torch.no_grad():
        for _ in range(20):
            model(input_ids=torch.randint(0, 50, (3, 7)))
    # WHEN each step runs 2 micro-batches of [4, 8] by keyword and a no_grad validation call
    for step in range(6):
        for _ in range(2):
            model(input_ids=torch.randint(0, 50, (4, 8))).logsumexp(-1).mean().backward()
        with torch.no_grad():
            model(input_ids=torch.randint(0, 50, (5, 9)))
        opt.step()
        opt.zero_grad()
        if step == 5:
            import probe_agent

            probe_agent.log(tokens=1000)
    # (the last step's row is held a second for a log(samples=/tokens=) that follows it)
    wait_until(lambda: agent.store.query("SELECT count(*) FROM python.steps").rows[0][0] == 6,
               10, "the sixth step's row")
    rows = agent.store.query("SELECT step, tokens, micro_batches, context_len, tokens_source "
                             "FROM python.steps ORDER BY step").rows
    # THEN every step counts the two training micro-batches' B x T, nothing else (step 1's
    # calls were numbered by the fallback count: unknown rather than wrong)
    assert rows[0][1] is None, rows
    assert [r[1] for r in rows[1:5]] == [64] * 4, rows
    assert all(r[2] == 2 and r[3] == 8 and r[4] == "inputs" for r in rows[1:5]), rows
    # AND a logged count overrides
    assert rows[5][1] == 1000 and rows[5][4] == "logged", rows
