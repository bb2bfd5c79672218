"""core.extras.import_ahead: a module imported in the background is there for the caller; a missing one is left
for the caller's own import to report (nothing printed, nothing raised by the thread)."""

from __future__ import annotations

import sys
import threading

from bigknn.core.extras import import_ahead


def _wait_for(name: str) -> None:
    for thread in threading.enumerate():
        if thread.name == f"import-{name}":
            thread.join(timeout=60)


def test_an_installed_module_is_imported_in_the_background(monkeypatch):
    monkeypatch.delitem(sys.modules, "json.tool", raising=False)
    import_ahead("json.tool")
    _wait_for("json.tool")
    assert "json.tool" in sys.modules


def test_a_missing_module_is_left_for_the_caller_to_report(capfd):
    errors: list = []
    monkey_hook = threading.excepthook
    threading.excepthook = errors.append
    try:
        import_ahead("bigknn_no_such_module")
        _wait_for("bigknn_no_such_module")
    finally:
        threading.excepthook = monkey_hook
    assert errors == [] and capfd.readouterr().err == ""
    assert "bigknn_no_such_module" not in sys.modules
