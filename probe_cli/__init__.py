"""probe's command-line client: reaches every rank's agent over HTTP and merges the answers.

It shares no code with ``probe_agent``; docs/http-api.md is the contract. It never imports
torch, duckdb or fastapi (duckdb and pyarrow only lazily, for ``query --gather`` and
``--format arrow|parquet``).
"""
