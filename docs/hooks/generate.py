"""MkDocs hook: the generated reference sections and a nav that takes new pages by itself.

- Every line ``<!-- polyrl-generated: NAME -->`` of a page is replaced, at build time, by the
  Markdown that ``polyrl.cli.docs_reference.generated_section(NAME)`` writes from the live code
  (the schema, the objective and estimator registries, the reward modules, the import layers).
  An unknown NAME fails the build.
- Every page of ``docs/``, sub-folders included (the comparison reports under ``docs/results/``
  and ``docs/reproductions/``), has its place in ``nav:`` of mkdocs.yml: a page that nav does
  not list fails the build, naming it. Before, such a page was appended under an automatic
  "More" section, where five guides sat unnoticed at the end, or (in a sub-folder) was built
  with no way to reach it: two reports were linked from no page.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.exceptions import PluginError

from polyrl.cli.docs_reference import generated_section

_MARKER = re.compile(r"^<!-- polyrl-generated: ([a-z0-9-]+) -->$", re.MULTILINE)


def _listed(nav: object) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_listed(item) for item in nav)) if nav else set()
    if isinstance(nav, dict):
        return set().union(*(_listed(item) for item in nav.values())) if nav else set()
    return set()


def pages_missing_from_nav(nav: object, docs_dir: Path) -> list[str]:
    """The pages under ``docs_dir`` (any depth; paths relative to it, as nav names them) that
    ``nav`` does not list, sorted."""
    listed = _listed(nav)
    pages = (page.relative_to(docs_dir).as_posix() for page in docs_dir.rglob("*.md"))
    return sorted(page for page in pages if page not in listed)


def on_config(config, **kwargs):
    nav = config.get("nav")
    if not nav:
        return config
    missing = pages_missing_from_nav(nav, Path(config["docs_dir"]))
    if missing:
        raise PluginError(
            f"docs pages with no place in mkdocs.yml's nav: {', '.join(missing)}; list each under a section of nav:"
        )
    return config


def on_page_markdown(markdown, page, config, files, **kwargs):
    root = Path(config["config_file_path"]).resolve().parent
    return _MARKER.sub(lambda match: generated_section(match.group(1), root), markdown)
