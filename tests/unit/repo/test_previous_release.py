"""deploy/previous-release names a release this tree descends from, at an older version:
the rolling update test (tests/deploy/test_rolling_update.py) rolls from it and back."""

from __future__ import annotations

import subprocess

from ebpflb import __version__
from tests import REPO


def git(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True, text=True)


def release() -> dict[str, str]:
    lines = (REPO / "deploy" / "previous-release").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_the_previous_release_is_an_older_version_this_tree_descends_from() -> None:
    fields = release()
    assert set(fields) == {"COMMIT", "VERSION", "IMAGE"}
    commit = fields["COMMIT"]
    assert len(commit) == 40, "the full commit hash: a short one can become ambiguous"
    assert git("merge-base", "--is-ancestor", commit, "HEAD").returncode == 0, commit
    pyproject = git("show", f"{commit}:pyproject.toml").stdout
    assert f'\nversion = "{fields["VERSION"]}"\n' in pyproject
    assert version(fields["VERSION"]) < version(__version__), "bump __version__ on release"
    assert fields["IMAGE"].endswith(f":{fields['VERSION']}")
    # Its image is built by its own scripts (scripts/build-previous-image.sh).
    assert git("cat-file", "-e", f"{commit}:scripts/build-image.sh").returncode == 0
