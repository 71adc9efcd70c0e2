"""User text is printed as written: rich markup (``[red]``, ``[/]``, ``[nan]``) and emoji
codes (``:smile:``) in keys, values, names and paths neither crash the CLI (a
``MarkupError`` traceback) nor vanish from its messages."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fedshift.cli import app
from fedshift.results.store import RunStore

runner = CliRunner()

FRAGMENTS = ["[/red]", "[bold]", "[nan]", "[/]", "[red]x[/red]", "[[", "]", "[#f00]", ":smile:"]
TEXT = (
    st.lists(st.sampled_from([*FRAGMENTS, "a", "b1", "-"]), min_size=1, max_size=4)
    .map("".join)
    # a leading "-" would make it an option to click, not text of ours
    .filter(lambda t: ("[" in t or ":" in t) and not t.startswith("-"))
)

# command lines that must refuse the text T (never valid there) and show it intact
TEMPLATES = [
    ["run", "--set", "{T}=1"],
    ["run", "--set", "lr={T}"],
    ["run", "--set", "algorithm.server_lr={T}"],
    ["run", "--set", "algorithm={T}"],
    ["run", "--set", "scenario={T}"],
    ["run", "{T}.toml"],
    ["run", "--seeds", "{T}"],
    ["run", "--resume", "{T}", "--db", "{DB}"],
    ["sweep", "--grid", "{T}"],
    ["describe", "scenario", "{T}"],
    ["list", "{T}"],
    ["report", "{T}", "--db", "{DB}"],
    ["compare", "{T}", "{T}", "--db", "{DB}"],
    ["runs", "--db", "{DIR}/{T}.db"],
    ["reproduce", "{T}"],
]


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    folder = tmp_path_factory.mktemp("markup")
    RunStore(folder / "r.db")
    return {"DB": str(folder / "r.db"), "DIR": str(folder)}


def check(args: list[str], text: str) -> None:
    res = runner.invoke(app, args)
    shown = res.output
    assert res.exit_code not in (0, None), (args, shown)
    assert "Traceback" not in shown and "MarkupError" not in shown, (args, shown)
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), (
        args,
        res.exception,
    )
    assert text in shown, (args, shown)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=st.sampled_from(TEMPLATES), text=TEXT)
def test_markup_in_user_text_is_shown_intact(places, template, text):
    args = [a.replace("{T}", text).format(**places) for a in template]
    check(args, text)


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: " ".join(t[:2]))
def test_each_command_with_the_worst_case(places, template):
    """Every template once with a closing tag, an unknown style and an emoji code."""
    text = "x[/red][nan]:smile:[/]"
    check([a.replace("{T}", text).format(**places) for a in template], text)


def test_the_reported_cases():
    res = runner.invoke(app, ["run", "--set", "x[/red]=1"])
    assert res.exit_code == 2 and "'x[/red]'" in res.output, res.output
    res = runner.invoke(app, ["run", "--set", "algorithm.server_lr=[nan]"])
    assert res.exit_code == 2 and "algorithm.server_lr='[nan]'" in res.output, res.output
