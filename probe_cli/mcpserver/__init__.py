"""`probe mcp`: the CLI's commands as Model Context Protocol tools for coding agents (stdio)."""
