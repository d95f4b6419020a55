"""What the runner prints keeps its text: a health line's '[arm]' prefix is not eaten as rich markup."""

from __future__ import annotations

import io

from rich.console import Console

from polyrl.launch.runner import plain_printer


def test_health_lines_keep_their_arm_prefix():
    console = Console(file=io.StringIO(), width=200, color_system=None)
    plain_printer(console)("[grpo] health warning at step 3: entropy_collapse: mean entropy 0.05 < 0.1")
    assert console.file.getvalue().strip() == "[grpo] health warning at step 3: entropy_collapse: mean entropy 0.05 < 0.1"
    # What the progress console did before: rich takes '[grpo]' for a style tag and drops it.
    plain = Console(file=io.StringIO(), width=200, color_system=None)
    plain.print("[grpo] health warning")
    assert plain.file.getvalue().strip() == "health warning"
