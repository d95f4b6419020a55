"""MkDocs hook: the generated reference sections and a nav that takes new pages by itself.

- Every line ``<!-- polyrl-generated: NAME -->`` of a page is replaced, at build time, by the
  Markdown that ``polyrl.cli.docs_reference.generated_section(NAME)`` writes from the live code
  (the schema, the objective and estimator registries, the reward modules, the import layers).
  An unknown NAME fails the build.
- Pages directly under ``docs/`` that ``nav:`` in mkdocs.yml does not list are appended under
  "More", titled by their first heading, so a helper's new page is on the site without anyone
  editing mkdocs.yml (move it into a section of ``nav:`` when it has a place).
"""

from __future__ import annotations

import re
from pathlib import Path

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


def on_config(config, **kwargs):
    nav = config.get("nav")
    if not nav:
        return config
    listed = _listed(nav)
    extra = sorted(page.name for page in Path(config["docs_dir"]).glob("*.md") if page.name not in listed)
    if extra:
        nav.append({"More": extra})
    return config


def on_page_markdown(markdown, page, config, files, **kwargs):
    root = Path(config["config_file_path"]).resolve().parent
    return _MARKER.sub(lambda match: generated_section(match.group(1), root), markdown)
