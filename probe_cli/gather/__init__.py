"""What each rank is asked for a verdict: the per-rank calls (``fanout.Call``) of `probe hang`,
`probe doctor` and `probe straggler`, shared with `probe ui`. The only network side of
diagnosis: diagnose/ computes verdicts from these answers and makes no call itself.

- ``evidence``: the calls, and the canned queries doctor's second round runs
"""
