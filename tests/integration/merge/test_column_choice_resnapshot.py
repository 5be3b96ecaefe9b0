"""A re-snapshot for a changed column choice leaves no clear value in any target mode (issue 38
item 6).

On the real vtgate, captured with column control and merged through the job into real Delta
tables: a ``changelog`` table and a ``history`` table (one sync), each with a string column and
an INT column, are snapshotted and caught up with ``include_columns`` leaving a third column
out. Then the choice changes as a user would change it: the third column is included and both
the string and the INT column are hashed (the INT one becomes a string). The catch-up is refused
with the remedy (``ColumnsChangedError``: re-snapshot), the re-snapshot is taken as it says and
merged, then one more catch-up. Afterwards, in both tables: no value of a hashed column is
anything but a hash (no clear value in any row of the current table nor in its data files), the
changelog replayed in (window, order) and the history's current versions equal the source's
``SELECT *`` with the two columns hashed, and the catch-up after the re-snapshot is merged.

The second test kills the re-snapshot twice, before it planned its window (the sync records the
new choice first) and mid-copy, and resumes it: each later run finds the new choice recorded
already, and the window must still be marked so that its merge replaces the table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_provider_vitess.capture.columns import WINDOW_COLUMNS, TableColumns
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.exceptions import ColumnsChangedError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.modes import TargetMode, TargetShape
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.staging import Manifest, WindowStager
from airflow_provider_vitess.staging.manifest import COLUMN_CHOICE_CHANGED
from tests.support import merge_workload as wl
from tests.support.delta_check import spark_session
from tests.support.local import LocalVitess

pytestmark = pytest.mark.integration

LOG = "colctl_rechoice_log"  # changelog
HIST = "colctl_rechoice_hist"  # history
TABLES = (LOG, HIST)
MODES = {LOG: TargetMode.CHANGELOG, HIST: TargetMode.HISTORY}
P = "_vitess_"
BEFORE = TableColumns(include=("id", "email", "score"))
AFTER = TableColumns(include=("id", "email", "score", "extra"), hash=("email", "score"))
HEX = re.compile(r"^[0-9a-f]{64}$")


def sha(salt: str, value: Any) -> str | None:
    return None if value is None else hashlib.sha256((salt + str(value)).encode()).hexdigest()


class Case:
    """The two source tables, one sync over them (its runner swapped when the choice changes),
    and every clear value of the columns hashed later."""

    def __init__(self, vitess: LocalVitess, root: Path, tables: tuple[str, ...] = TABLES) -> None:
        self.tables = tables
        self.hook: VitessHook = wl.hook_for(vitess, "vitess_colctl_rechoice")
        self.root, self.token = root, uuid.uuid4().hex[:8]
        self.salt = f"salt-{uuid.uuid4().hex}"
        self.store = CheckpointStore(f"sqlite:///{root}/store.db")
        self.sync_id = f"colctl_rechoice_{self.token}"
        self.emails: list[str] = []
        self.scores: list[int] = []
        statements = []
        for t in tables:
            statements += [
                f"DROP TABLE IF EXISTS commerce.{t}",
                f"CREATE TABLE commerce.{t} (id INT NOT NULL PRIMARY KEY, email VARCHAR(80), "
                "score INT, extra VARCHAR(20)) DEFAULT CHARSET=utf8mb4",
            ]
        wl.execute(self.hook, *statements)
        self.execute(*[self.insert(t, i) for t in tables for i in range(1, 7)])
        self.sync = wl.Sync(self.sync_id, "commerce", tables, self.runner(BEFORE), self.store)
        self.targets: dict[str, TableTarget] = {}

    def runner(self, choice: TableColumns) -> CaptureRunner:
        spec = SyncSpec(
            self.sync_id,
            "commerce",
            self.tables,
            str(self.root / "stage"),
            columns={t: choice for t in self.tables},
            hash_salt=self.salt if choice.hash else None,
        )
        return CaptureRunner(self.hook, self.store, spec, holder="test-colctl-rechoice")

    def email(self, t: str, i: int, n: int = 0) -> str:
        value = f"clear{self.token}{t[-3:]}{i}x{n}@example.test"
        self.emails.append(value)
        return value

    def score(self, t: str, i: int, n: int = 0) -> int:
        value = 7_000_000 + 10_000 * n + 100 * i + TABLES.index(t)
        self.scores.append(value)
        return value

    def insert(self, t: str, i: int, n: int = 0) -> str:
        return (
            f"INSERT INTO commerce.{t} (id, email, score, extra) "
            f"VALUES ({i}, '{self.email(t, i, n)}', {self.score(t, i, n)}, 'x{i}')"
        )

    def execute(self, *statements: str) -> None:
        wl.execute(self.hook, *statements)

    def changes(self, n: int) -> None:
        """Round ``n``'s changes in both tables: an update of each column, a delete, an insert."""
        for t in self.tables:
            self.execute(
                f"UPDATE commerce.{t} SET email = '{self.email(t, 1, n)}' WHERE id = 1",
                f"UPDATE commerce.{t} SET score = {self.score(t, 2, n)}, extra = 'e{n}' WHERE id = 2",
                f"DELETE FROM commerce.{t} WHERE id = {2 + n}",
                self.insert(t, 10 + n, n),
            )

    def merge(self, *windows: tuple[Manifest, bool]) -> None:
        if not self.targets:
            self.targets = {
                t: dataclasses.replace(
                    target, shape=TargetShape(MODES[t], metadata=True), path=str(self.root / "delta" / t)
                )
                for t, target in self.sync.targets(self.root / "delta").items()
            }
        chosen = tuple(
            WindowToMerge(m.window_seq, m.path, self.tables if snap else ()) for m, snap in windows
        )
        merge(spark_session(), MergePlan(self.sync_id, chosen, self.targets))

    def first_windows(self, catch_up: bool = True) -> None:
        """The snapshot (and a catch-up) with the first choice, merged: clear values in Delta."""
        windows = [(self.sync.capture(snapshot=True), True)]
        if catch_up:
            self.changes(1)
            windows.append((self.sync.capture(), False))
        self.merge(*windows)
        rows = _rows(self.targets[self.tables[-1]].path)
        assert {r["email"] for r in rows} & set(self.emails), "the clear values are in Delta before"
        assert "extra" not in rows[0]

    def change_choice(self) -> None:
        """The new choice: refused by the catch-up, which names the remedy (a re-snapshot)."""
        self.changes(2)
        self.sync.runner = self.runner(AFTER)
        with pytest.raises(ColumnsChangedError, match=r'"resnapshot_tables": \["colctl_rechoice_'):
            self.sync.capture()

    def check(self, last_seq: int) -> None:
        """No clear value anywhere in either table; each equals its oracle; the last catch-up is in."""
        clear = [*self.emails, *(str(s) for s in self.scores)]
        for t in self.tables:
            rows = _rows(self.targets[t].path)
            assert [c for c in rows[0] if not c.startswith(P)] == ["id", "email", "score", "extra"]
            for r in rows:
                for c in ("email", "score"):
                    assert r[c] is None or HEX.match(r[c]), f"{t}: a clear {c} in Delta: {r}"
            assert not [r for r in rows if {r["email"], r["score"]} & set(clear)]
            assert not _in_files(self.targets[t].path, self.emails), f"{t}: a clear email in a data file"
            assert max(r[P + "window_seq"] for r in rows) == last_seq, "the last window is merged"
            if MODES[t] is TargetMode.CHANGELOG:
                assert _replayed(rows) == self.source(t)
            else:
                current = [(r["id"], r["email"], r["score"], r["extra"]) for r in rows if r[P + "current"]]
                assert len(current) == len({c[0] for c in current}), "one current version per key"
                assert {c[0]: c for c in current} == self.source(t)

    def source(self, t: str) -> dict[int, tuple[Any, ...]]:
        """``SELECT *`` with the hashed columns as the new choice stages them."""
        _, rows = wl.select_all(self.hook, "commerce", t)
        return {r[0]: (r[0], sha(self.salt, r[1]), sha(self.salt, r[2]), r[3]) for r in rows}


def _rows(path: str) -> list[dict[str, Any]]:
    return [r.asDict() for r in spark_session().read.format("delta").load(path).collect()]


def _in_files(path: str, clear: list[str]) -> list[str]:
    """Clear values in the data files of the table's current version (bytes and decoded)."""
    found = []
    for name in spark_session().read.format("delta").load(path).inputFiles():
        file = Path(name.removeprefix("file:"))
        data = file.read_bytes()
        text = repr(pq.read_table(file).to_pylist())
        found += [c for c in clear if c.encode() in data or c in text]
    return found


def _replayed(rows: list[dict[str, Any]]) -> dict[int, tuple[Any, ...]]:
    """The changelog applied in (window, order): a snapshot, insert or update row sets its key,
    a delete ends it."""
    state: dict[int, tuple[Any, ...]] = {}
    for r in sorted(rows, key=lambda r: (r[P + "window_seq"], r[P + "order"])):
        if r[P + "op"] == "delete":
            state.pop(r["id"], None)
        else:
            state[r["id"]] = (r["id"], r["email"], r["score"], r["extra"])
    return state


def test_a_resnapshot_for_a_changed_column_choice_leaves_no_clear_value_in_changelog_or_history(
    vitess: LocalVitess, tmp_path: Path
) -> None:
    case = Case(vitess, tmp_path)
    case.first_windows()
    case.change_choice()
    resnapshot = case.sync.capture(snapshot=True)  # as the error says
    case.changes(3)
    after = case.sync.capture()  # the sync goes on with the new choice
    case.merge((resnapshot, True), (after, False))
    case.check(after.window_seq)
    assert resnapshot.stats[COLUMN_CHOICE_CHANGED] == sorted(TABLES)


def test_a_killed_and_resumed_resnapshot_for_a_changed_column_choice_still_replaces_the_table(
    vitess: LocalVitess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = Case(vitess, tmp_path, (HIST,))
    case.first_windows(catch_up=False)
    case.change_choice()

    def dies(*_: Any, **__: Any) -> None:
        raise RuntimeError("the capture dies")

    # A run that dies before it planned its window (vtgate gone when it takes the copy's start):
    # it recorded the new choice already.
    with monkeypatch.context() as patched:
        patched.setattr(case.hook, "open_vstream_raw", dies)
        with pytest.raises(RuntimeError, match="the capture dies"):
            case.sync.runner.snapshot()
    assert case.store.open_window(case.sync_id) is None
    assert case.store.sync_config(case.sync_id)[WINDOW_COLUMNS][HIST]["hash"] == ["email", "score"]
    # The next one plans the window and dies mid-copy; the one after resumes it.
    with monkeypatch.context() as patched:
        patched.setattr(WindowStager, "add_rows", dies)
        with pytest.raises(RuntimeError, match="the capture dies"):
            case.sync.runner.snapshot()
    window = case.store.open_window(case.sync_id)
    assert window is not None and window.state is WindowState.PLANNED
    resumed = case.sync.runner.snapshot()  # the next run: it resumes the planned window
    assert resumed.resumed and resumed.seq == window.seq
    case.merge((resumed.manifest, True))
    case.check(resumed.seq)
    assert resumed.manifest.stats[COLUMN_CHOICE_CHANGED] == [HIST]
