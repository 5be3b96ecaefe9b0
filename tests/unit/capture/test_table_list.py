"""What a changed table list asks of a sync's next run (capture/table_list.py)."""

from __future__ import annotations

from airflow_provider_vitess.capture.table_list import table_list_change


def test_a_new_sync_has_no_change() -> None:
    change = table_list_change(None, None, ["a", "b"], 0)
    assert change.to_snapshot == () and dict(change.removed) == {}


def test_added_left_and_back_tables() -> None:
    added = table_list_change(["a"], {}, ["a", "b"], 4)
    assert (added.added, added.back, dict(added.removed)) == (("b",), (), {})
    left = table_list_change(["a", "b"], {}, ["a"], 7)
    assert (left.to_snapshot, dict(left.removed)) == ((), {"b": 7})
    # Still out a run later: the window it left at stays (not the later committed one).
    assert dict(table_list_change(["a"], {"b": 7}, ["a"], 9).removed) == {"b": 7}
    back = table_list_change(["a"], {"b": 7}, ["a", "b"], 9)
    assert (back.added, back.back) == ((), ("b",))
    assert back.after_snapshot_of(["b"]) == {} and back.after_snapshot_of(["a"]) == {"b": 7}
