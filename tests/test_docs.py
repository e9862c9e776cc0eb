"""The docs a newcomer reads stay carryable and whole: the README is a map of at most 3,500 words
whose quick start is two commands (the second the one CI runs), with the fast test loop beside
them; every reference page under docs/ is reachable from it and in the site's navigation; the
site builds with warnings as errors; and "Where things live" lists the package's rooms in the
order a request meets them."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_WORDS = 3500
# The rooms, in the order a request meets them (load time last: it runs before and beside).
ROOMS = ["ray/", "process/", "edges/", "jobs/", "control.py", "core/", "runtime/", "loading/"]
SHARED = {"settings", "metrics", "tracing", "logs", "errors", "about"}


def quick_start() -> list[str]:
    """The command lines of the quick start's first code block."""
    section = README.read_text().split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_quick_start_is_two_commands_with_the_fast_loop_beside_them() -> None:
    serve, test = quick_start()
    assert serve == "pip install -e . && bucketserve serve"
    assert "pytest" in test
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert 'python -m pytest -m "not slow"' in section


def test_ci_runs_the_readme_test_command() -> None:
    _, test = quick_start()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci


def test_the_readme_is_a_map_of_a_few_thousand_words() -> None:
    words = len(README.read_text().split())
    assert words <= MAX_README_WORDS, f"README.md has {words} words"


def test_every_page_is_reachable_from_the_readme_and_in_the_site() -> None:
    readme = README.read_text()
    linked = set(re.findall(r"\]\((docs/[\w./-]+?\.md)(?:#[\w-]+)?\)", readme))
    pages = {f"docs/{p.name}" for p in DOCS.glob("*.md")}
    assert pages <= linked, f"not linked from the README: {sorted(pages - linked)}"
    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = {f"docs/{next(iter(entry.values()))}" for entry in site["nav"]}
    assert nav == pages


def test_the_docs_index_links_every_page_in_the_sites_order() -> None:
    """The site's home page lists its pages as the navigation does (it listed 13 of 23)."""
    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = [next(iter(entry.values())) for entry in site["nav"]][1:]  # (but the home page)
    linked = list(dict.fromkeys(re.findall(r"\]\(([\w-]+\.md)\)", (DOCS / "index.md").read_text())))
    assert linked == nav


def test_the_settings_page_has_every_setting() -> None:
    """Each setting's flag and variable on docs/settings.md (`--grpc-port` was missing)."""
    from bucketserve.settings import DEPRECATED, Settings, env_name

    page = (DOCS / "settings.md").read_text()
    missing = [
        f.name
        for f in dataclasses.fields(Settings)
        if f.name not in DEPRECATED  # (an old spelling: said beside the setting it became)
        and (f"`--{f.name.replace('_', '-')}" not in page or f"`{env_name(f.name)}`" not in page)
    ]
    assert missing == []


def test_every_local_link_of_the_readme_leads_somewhere() -> None:
    targets = re.findall(r"\]\(((?!https?://|#)[^)#\s]+)", README.read_text())
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert targets
    assert not missing


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    """`mkdocs build --strict`: a broken link or anchor, or a page left out of the
    navigation, fails it."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "apis" / "index.html").is_file()


def test_where_things_live_lists_every_room_in_the_order_a_request_meets_them() -> None:
    section = README.read_text().split("## Where things live", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([\w./]+)` \|", section, re.M)
    assert listed == ROOMS
    package = ROOT / "bucketserve"
    rooms = {
        p.name + "/" if p.is_dir() else p.name
        for p in package.iterdir()
        if not p.name.startswith("__")
        and p.name != "py.typed"
        and (p.is_dir() or p.suffix == ".py")
        and p.name.removesuffix(".py") not in SHARED
    }
    assert rooms == set(ROOMS)
