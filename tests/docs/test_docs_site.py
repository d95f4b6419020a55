"""The documentation site builds with warnings as errors, and its generated pages list what the code has."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _page_text(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text()


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    result = _build(ROOT / "mkdocs.yml", site)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return site


def test_site_builds_strict_with_every_page(built_site):
    for page in ("getting_started", "config_reference", "objectives", "architecture", "benchmarks", "results", "api"):
        assert (built_site / page / "index.html").is_file(), page
    assert (built_site / "index.html").is_file()


def test_generated_pages_hold_the_live_registries(built_site):
    from polyrl.algos.advantages import list_advantages
    from polyrl.algos.objectives import list_objectives
    from polyrl.config.schema import ExperimentConfig

    objectives = _page_text(built_site, "objectives")
    for spec in list_objectives():
        assert f'id="objective-{spec.name}"' in objectives, spec.name
    for spec in list_advantages():
        assert f'id="advantage-{spec.name}"' in objectives, spec.name
    reference = _page_text(built_site, "config_reference")
    for name in ExperimentConfig.model_fields:
        assert f"<code>{name}</code>" in reference, name
    # No marker is left unreplaced anywhere.
    for html in built_site.rglob("*.html"):
        assert "<!-- polyrl-generated:" not in html.read_text(), html


def _copy_project(tmp_path: Path) -> Path:
    """The files a build reads (config, docs, the files the generated sections read)."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("mkdocs.yml", ".importlinter", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(ROOT / "docs", project / "docs", ignore=shutil.ignore_patterns("*.png"))
    # Pages point at images; without them the build would fail for that reason instead.
    for image in (ROOT / "docs").rglob("*.png"):
        target = project / "docs" / image.relative_to(ROOT / "docs")
        target.write_bytes(b"")
    return project


def test_the_home_page_gives_the_readmes_headline_results(built_site):
    """The home page's headlines are the README's (one source: the generated readme-headlines)."""
    import html
    import re

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Headline results", 1)[1].split("\n## ", 1)[0]
    leads = re.findall(r"\*\*(.+?)\*\*", section)
    assert len(leads) >= 5, leads  # the README's headline paragraphs, each with a bold lead
    home = html.unescape((built_site / "index.html").read_text())
    for lead in leads:
        assert f"<strong>{lead}</strong>" in home, lead


def test_the_api_reference_is_read_from_the_extension_points(built_site):
    """docs/api.md is mkdocstrings' rendering of the interfaces a plug-in implements."""
    api = _page_text(built_site, "api")
    for name in (
        "polyrl.rewards.base.RewardModule.score",
        "polyrl.envs.base.Environment.step",
        "polyrl.algos.objectives.registry.register_objective",
        "polyrl.engines.base.RolloutEngine.generate",
        "polyrl.engines.weight_transport.WeightTransport",
    ):
        assert f'id="{name}"' in api, name


def test_every_page_has_a_place_in_the_nav():
    """A page of docs/ (sub-folders too) that nav: does not list fails the build (the hook), so a
    guide cannot sit unnoticed at the end of the site and a report cannot be built with no way to
    reach it. Read here without a build, so it fails fast."""
    from mkdocs.utils.yaml import yaml_load

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        from generate import pages_missing_from_nav
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    nav = yaml_load((ROOT / "mkdocs.yml").read_text())["nav"]
    assert pages_missing_from_nav(nav, ROOT / "docs") == []
    # The check finds a page that is missing: everything but the home page left out.
    missing = pages_missing_from_nav([{"Home": "index.md"}], ROOT / "docs")
    assert "getting_started.md" in missing
    assert "results/real_clip_bounds/report.md" in missing  # a report in a sub-folder counts too


@pytest.mark.slow  # two more builds, ~10 s each on 2 busy cores
def test_a_broken_link_fails_the_build_and_a_page_outside_the_nav_fails_it(tmp_path):
    project = _copy_project(tmp_path)
    (project / "docs" / "zz_new_topic.md").write_text("# A new topic\n\nSee [the setup](getting_started.md).\n")
    unlisted = _build(project / "mkdocs.yml", tmp_path / "site_unlisted")
    assert unlisted.returncode != 0
    assert "zz_new_topic.md" in unlisted.stderr + unlisted.stdout

    nav_line = "      - Writing these docs: writing_docs.md\n"
    config = (project / "mkdocs.yml").read_text()
    assert nav_line in config
    (project / "mkdocs.yml").write_text(config.replace(nav_line, nav_line + "      - A new topic: zz_new_topic.md\n"))
    ok = _build(project / "mkdocs.yml", tmp_path / "site_ok")
    assert ok.returncode == 0, ok.stderr
    home = (tmp_path / "site_ok" / "index.html").read_text()
    assert "A new topic" in home and "zz_new_topic/" in home

    (project / "docs" / "zz_new_topic.md").write_text("# A new topic\n\nSee [nowhere](no_such_page.md).\n")
    broken = _build(project / "mkdocs.yml", tmp_path / "site_broken")
    assert broken.returncode != 0
    assert "no_such_page.md" in broken.stderr + broken.stdout
