"""Serving: everything between a socket and the agent's store, evaluator and action queue.

wire.py (the JSON bodies of docs/http-api.md) is stdlib only, for the watchdog's proxy too;
importing this package imports nothing else.
"""
