"""Everything a user can set, ask or type is documented, in the manner of datasette's
tests/test_docs.py: every PROBE_* setting in docs/settings.md's table, every route in
docs/http-api.md, every command in README's command table; and nothing is documented that does
not exist. Each list comes from the one table the code itself uses: ``settings.SETTINGS``,
``probe_protocol.routes.ROUTES``, the click group's commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from probe_agent.settings import COMBINED, ELSEWHERE, SETTINGS
from probe_cli.main import cli
from probe_protocol import routes

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SETTINGS_PAGE = (ROOT / "docs" / "settings.md").read_text()
HTTP_API = (ROOT / "docs" / "http-api.md").read_text()
#: Set by an agent for its own children, never by a user: which process and rank already run an
#: agent (so a DataLoader worker or a launcher's child does not start a second one).
INTERNAL = {"PROBE_AGENT_PID", "PROBE_AGENT_RANK"}


def _first_cells(table: str) -> list[str]:
    """The first column of a markdown table's rows (``\\|`` inside a cell is not a border)."""
    return [re.split(r"(?<!\\)\|", line)[1] for line in table.splitlines()
            if line.startswith("| `")]


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return text[start:end if end >= 0 else None]


def documented_settings(text: str = SETTINGS_PAGE) -> set[str]:
    """The variables in the first column of docs/settings.md's settings table."""
    table = _section(text, "## Settings (environment)")
    return {v for cell in _first_cells(table) for v in re.findall(r"`(PROBE[A-Z_]*)`", cell)}


def read_in_code() -> set[str]:
    """PROBE_* variables the agent and the protocol package read directly from an environment
    (besides the settings table, which from_env walks)."""
    pattern = re.compile(r"""(?:environ(?:\.get)?\(?\[?|getenv\()\s*["'](PROBE[A-Z_]*)["']"""
                         r"""|["'](PROBE[A-Z_]*)["']\s+(?:not\s+)?in\s+(?:os\.)?environ""")
    found = set()
    for pkg in ("probe_agent", "probe_protocol"):
        for path in (ROOT / pkg).rglob("*.py"):
            for m in pattern.finditer(path.read_text()):
                found.add(m.group(1) or m.group(2))
    return found


def test_every_setting_is_in_the_settings_table_and_nothing_else_is():
    settings = {s.var for s in SETTINGS} | set(COMBINED) | set(ELSEWHERE)
    documented = documented_settings()
    assert settings - documented == set(), "settings missing from docs/settings.md's table"
    assert documented - settings == set(), "docs/settings.md documents settings nothing reads"


def test_every_variable_the_agent_reads_is_a_setting():
    """A PROBE_* read somewhere without a row in the settings tables is a setting nobody sees."""
    known = ({s.var for s in SETTINGS} | set(COMBINED) | set(ELSEWHERE)
             | INTERNAL)
    read = read_in_code()
    assert {"PROBE_PYSPY", "PROBE_NATIVE_DIR", "PROBE_AGENT_PID"} <= read  # the scan sees reads
    assert read - known == set()


def test_the_settings_check_sees_a_missing_row():
    table = _section(SETTINGS_PAGE, "## Settings (environment)")
    without = SETTINGS_PAGE.replace(next(line for line in table.splitlines()
                                         if line.startswith("| `PROBE_TCP`")), "")
    assert "PROBE_TCP" in documented_settings() and "PROBE_TCP" not in documented_settings(without)


def test_every_setting_of_the_cli_is_documented():
    """The group's options that have their own variable (``envvar=``) are named on the settings
    page, under the CLI's own settings."""
    envvars = {p.envvar for p in cli.params if isinstance(p.envvar, str)}
    assert {"PROBE_TARGET", "PROBE_TOKEN"} <= envvars
    section = _section(SETTINGS_PAGE, "## The CLI's settings")
    missing = {v for v in envvars if f"`{v}`" not in section}
    assert missing == set()


def _shape(key: str) -> str:
    """``GET /v1/actions/{id}?wait=S`` -> ``GET /v1/actions/{}``: parameter names and query
    strings are the page's own words."""
    return re.sub(r"\{[^}]*\}", "{}", key.split("?", 1)[0])


def documented_routes(text: str = HTTP_API) -> set[str]:
    """``METHOD /v1/...`` of every row of the page's route tables."""
    rows = re.findall(r"^\| `((?:GET|POST|PUT|PATCH|DELETE) /v1/[^`]*)`", text, re.M)
    return {_shape(r) for r in rows}


def test_every_route_is_documented_and_every_documented_route_exists():
    # the agent's routes and the watchdog's own (the node route)
    table = {_shape(r.key) for r in routes.ROUTES + routes.WATCHDOG_ROUTES}
    assert table - documented_routes() == set(), "routes missing from docs/http-api.md"
    assert documented_routes() - table == set(), "documented routes nobody serves"


def test_the_route_check_sees_a_missing_route():
    without = "\n".join(line for line in HTTP_API.splitlines()
                        if not line.startswith("| `GET /v1/metrics`"))
    metrics = _shape(routes.METRICS.key)
    assert metrics in documented_routes() and metrics not in documented_routes(without)


def documented_commands(text: str = README) -> set[str]:
    """The first word of each code span in the first column of README's command table."""
    table = _section(text, "## Commands")
    return {span.split()[0] for cell in _first_cells(table)
            for span in re.findall(r"`([^`]+)`", cell)}


@pytest.mark.parametrize("name", sorted(n for n, c in cli.commands.items() if not c.hidden))
def test_every_command_is_in_readmes_command_table(name):
    assert name in documented_commands()


def test_every_documented_command_exists():
    assert documented_commands() - set(cli.commands) == set()
