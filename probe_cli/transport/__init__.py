"""Talking to the agents: the wire types (wire.py), one client per agent with a method per
route (client.py), rank discovery and concurrent fan-out (fanout.py), the invocation's
Session, target parsing and the trust check, and the step-boundary action protocol
(step_actions.py). Nothing here renders or decides; commands/ do, through diagnose/ and render/.
"""
