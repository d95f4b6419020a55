"""replace_dir: a staged folder takes the place of the old one, nothing else is left."""

import pytest

from polyrl.core.folders import replace_dir


def test_replaces_an_existing_folder_and_leaves_nothing_behind(tmp_path):
    final = tmp_path / "report"
    final.mkdir()
    (final / "old.txt").write_text("old")
    staging = tmp_path / ".report.partial"
    staging.mkdir()
    (staging / "new.txt").write_text("new")
    assert replace_dir(staging, final) == final
    assert sorted(p.name for p in final.iterdir()) == ["new.txt"] and (final / "new.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no staging, no retired copy


def test_publishes_where_no_folder_was(tmp_path):
    staging = tmp_path / ".out.partial"
    staging.mkdir()
    (staging / "a").write_text("1")
    replace_dir(staging, tmp_path / "out")
    assert (tmp_path / "out" / "a").read_text() == "1" and not staging.exists()


def test_a_failed_publish_puts_the_old_folder_back(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with pytest.raises(OSError):
        replace_dir(tmp_path / "missing-staging", final)  # the rename in fails after the old one moved aside
    assert (final / "old.txt").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
