"""Talking to the agents. Nothing here renders or decides; commands/ do, through diagnose/ and
render/.

- ``wire``: the agent's bodies as types (``from_wire``); stdlib only
- ``client``: ``ProbeClient``, one agent, one method per route of docs/http-api.md
- ``failures``: why a request failed, as the ``RankError`` that says what to do
- ``fanout``: targets -> ranks (``/v1/ranks``) -> one concurrent call per rank -> RankResults
- ``session``: the invocation's options and its cached clients
- ``targets``: what -t, a PID, --hostfile and --rank mean; where local agents' sockets are
- ``trust``: whether an address is the job's agent before a token or code goes to it
- ``step_actions``: the step-boundary action protocol (pick the step, queue, wait, cancel)
"""
