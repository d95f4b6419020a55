"""The one resolver of plug-in references (polyrl/core/plugins.py), on a kind made up for the test.

Reward modules and environments are both this resolver with their own PluginKind; these tests pin
what each reference form resolves to and the exact message of each failure, whatever the kind.
"""

from __future__ import annotations

import textwrap

import pytest

from polyrl.core.errors import PolyrlError
from polyrl.core.plugins import PluginKind, load_plugin_class, register_plugin, registered_plugins


class WidgetError(PolyrlError):
    pass


class Widget:
    def spin(self):
        return 1


def _kind(calls: list[str]) -> PluginKind:
    return PluginKind(
        noun="widget",
        name_noun="widget",
        entry_point_noun="widget entry point",
        group="polyrl.test_widgets",  # no installed package offers this group
        error=WidgetError,
        registry={"spinner": Widget},
        ensure_builtins=lambda: calls.append("builtins"),
        methods=("spin",),
        wants="a class with a spin() method",
        file_module_prefix="polyrl_test_widget_file",
        entry_point_check_noun="widget",
    )


def test_registered_name_and_module_reference_resolve():
    calls: list[str] = []
    kind = _kind(calls)
    assert load_plugin_class(kind, " spinner ") is Widget
    assert load_plugin_class(kind, f"{__name__}:Widget") is Widget
    assert calls == ["builtins", "builtins"]  # the built-ins are imported before every look-up


def test_file_reference_is_relative_to_base_dir_and_loaded_once(tmp_path):
    (tmp_path / "mine.py").write_text(
        textwrap.dedent("""
        class Mine:
            def spin(self):
                return 2
    """)
    )
    kind = _kind([])
    cls = load_plugin_class(kind, "mine.py:Mine", base_dir=tmp_path)
    assert cls().spin() == 2
    assert cls.__module__.startswith("polyrl_test_widget_file_mine_")
    assert load_plugin_class(kind, str(tmp_path / "mine.py") + ":Mine") is cls  # same file, same module


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("", "widget reference must be a non-empty string, got ''"),
        (":Widget", "unknown widget ':Widget' (expected 'module:Class' or 'file.py:Class'). Registered names: spinner."),
        ("nope", "unknown widget 'nope'. Registered names: spinner. Entry points: (none). "),
        ("missing.py:X", "widget 'missing.py:X': file "),
        ("polyrl_no_such_module_xyz:X", "widget 'polyrl_no_such_module_xyz:X': cannot import 'polyrl_no_such_module_xyz': "),
        (f"{__name__}:Nothing", f"widget '{__name__}:Nothing': {__name__!r} has no attribute 'Nothing'"),
        (f"{__name__}:WidgetError", f"widget '{__name__}:WidgetError' is not a class with a spin() method"),
    ],
)
def test_each_failure_raises_the_kinds_error_with_its_message(tmp_path, ref, message):
    with pytest.raises(WidgetError) as caught:
        load_plugin_class(_kind([]), ref, base_dir=tmp_path)
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_file_that_fails_to_import_names_its_line(tmp_path):
    (tmp_path / "broken.py").write_text("x = 1\nraise RuntimeError('boom')\n")
    with pytest.raises(WidgetError) as caught:
        load_plugin_class(_kind([]), "broken.py:X", base_dir=tmp_path)
    assert str(caught.value) == f"widget 'broken.py:X' failed to load: {tmp_path / 'broken.py'}, line 2: RuntimeError: boom"


def test_register_sets_the_name_and_refuses_a_clash():
    kind = _kind([])
    register = register_plugin(kind, "other")

    @register
    class Other(Widget):
        pass

    assert Other.name == "other" and list(registered_plugins(kind)) == ["other", "spinner"]
    assert register(Other) is Other  # registering the same class again is fine
    with pytest.raises(WidgetError, match=r"^widget name 'other' is already registered to .*test_plugins\..*Other$"):
        register_plugin(kind, "other")(Widget)
    with pytest.raises(WidgetError, match="^widget name must be a non-empty string, got ''$"):
        register_plugin(kind, "")
