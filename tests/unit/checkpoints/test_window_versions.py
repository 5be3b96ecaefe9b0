"""The consistent cut's rules on a real (SQLite) checkpoint store: which version each table has at
a window, idle tables carried forward, refusals named, and pruning that keeps the oldest cut whole;
each version's format and Iceberg snapshot, the SQL per format, and the reads in the recorded
format."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowKind
from airflow_provider_vitess.checkpoints.versions import TableCommit
from airflow_provider_vitess.consistent_reads import consistent_cut, consistent_tables, cut_sql
from airflow_provider_vitess.exceptions import CutUnavailableError
from airflow_provider_vitess.merge.iceberg_catalog import IcebergCatalog
from airflow_provider_vitess.merge.job.formats import sql_at
from airflow_provider_vitess.merge.plan import TABLE_FORMATS
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
PATHS = {"a": "/lake/a", "b": "/lake/b"}
# Iceberg's: <warehouse>/<namespace>/<table>; the catalog is named for the warehouse, "vitess_"
# and the first 12 hex digits of sha256("/wh").
ICEBERG_PATHS = {"a": "/wh/lake/a", "b": "/wh/lake/b"}
CATALOG = "vitess_c5fb2bb54259"


def _vgtid(n: int) -> Vgtid:
    return Vgtid((ShardGtid("ks", "0", f"MariaDB/0-1-{n}"),))


class Sync:
    def __init__(self, tmp_path: Path) -> None:
        self.now = T0
        self.store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}", clock=lambda: self.now)
        self.store.migrate()
        self.store.ensure_sync("s", "ks", ["a", "b"], {})
        self.end = 0

    def window(
        self,
        targets: dict[str, int | None],
        *,
        commit: bool = True,
        paths: Mapping[str, str] = PATHS,
        commits: Mapping[str, TableCommit] | None = None,
    ) -> int:
        kind = WindowKind.SNAPSHOT if self.end == 0 else WindowKind.CATCHUP
        seq = self.store.plan_window("s", kind, _vgtid(self.end))
        self.end += 1
        self.store.mark_staged("s", seq, _vgtid(self.end), f"/stage/{seq}/_manifest.json")
        self.now += timedelta(minutes=1)
        if commits is None:  # as a caller before formats were recorded
            self.store.mark_merged("s", seq, targets, paths=paths)
        else:
            self.store.mark_merged("s", seq, targets, paths=paths, commits=commits)
        if commit:
            self.store.commit("s", seq)
        return seq

    def cut(self, **kw: object) -> tuple[int, dict[str, tuple[int, int]]]:
        taken = consistent_cut(self.store, "s", **kw)  # type: ignore[arg-type]
        return taken.seq, {t: (v.version, v.seq) for t, v in taken.tables.items()}


@pytest.fixture
def sync(tmp_path: Path) -> Sync:
    return Sync(tmp_path)


def test_each_table_has_the_version_of_its_latest_write_at_or_before_the_window(sync: Sync) -> None:
    with pytest.raises(CutUnavailableError, match="no committed window yet"):
        sync.cut()
    sync.window({"a": 0, "b": 0})  # 1: the snapshot
    sync.window({"a": 1})  # 2: b idle
    sync.window({"b": 1})  # 3: a idle
    sync.window({"a": 2, "b": 2})  # 4
    assert sync.cut(window=1) == (1, {"a": (0, 1), "b": (0, 1)})
    assert sync.cut(window=2) == (2, {"a": (1, 2), "b": (0, 1)})
    assert sync.cut(window=3) == (3, {"a": (1, 2), "b": (1, 3)})
    assert sync.cut() == (4, {"a": (2, 4), "b": (2, 4)})
    # By time: windows were merged at T0+1, +2, +3, +4 minutes.
    assert sync.cut(as_of=T0 + timedelta(minutes=2, seconds=30))[0] == 2
    with pytest.raises(CutUnavailableError, match="no window it keeps versions for was merged by"):
        sync.cut(as_of=T0)


def test_a_window_not_committed_is_refused_and_not_in_the_committed_cut(sync: Sync) -> None:
    sync.window({"a": 0, "b": 0})
    sync.window({"a": 1, "b": 1}, commit=False)  # MERGED: in Delta, not committed
    assert sync.cut() == (1, {"a": (0, 1), "b": (0, 1)})
    with pytest.raises(CutUnavailableError, match=r"window 2 is not committed .*committed up to window 1"):
        sync.cut(window=2)


def test_a_table_without_a_delta_table_is_left_out(sync: Sync) -> None:
    sync.window({"a": 0, "b": None})  # b's snapshot was empty: no Delta table
    assert sync.cut() == (1, {"a": (0, 1)})


def test_pruning_keeps_the_oldest_kept_cut_whole_and_refuses_older_ones(sync: Sync) -> None:
    sync.window({"a": 0, "b": 0})  # 1
    sync.window({"a": 1})  # 2
    sync.window({"a": 2})  # 3
    sync.window({"a": 3})  # 4
    sync.store.prune_windows("s", keep=2)  # keeps windows 3 and 4
    assert sync.cut(window=3) == (3, {"a": (2, 3), "b": (0, 1)}), "b's version from window 1 stays"
    with pytest.raises(CutUnavailableError, match=r"window 2 is older than the oldest window .* \(3\)"):
        sync.cut(window=2)
    # The next capture task rewrites the sync's config: the limit is not in it, so it stays.
    sync.store.ensure_sync("s", "ks", ["a", "b"], {"staging": "/stage"})
    with pytest.raises(CutUnavailableError, match=r"window 2 is older than the oldest window .* \(3\)"):
        sync.cut(window=2)


def _iceberg(snapshot: int | None, catalog: str | None = None) -> TableCommit:
    return TableCommit("iceberg", snapshot, catalog)


def test_each_version_keeps_its_format_and_iceberg_snapshot_and_its_sql_names_it(sync: Sync) -> None:
    """Iceberg's time travel names a snapshot id, not our version: the cut's SQL is the snapshot's
    (the table named as the merge names it, quoted); a Delta table's is its version's."""
    ice = {"a": _iceberg(5117000000000000001), "b": _iceberg(5117000000000000002)}
    sync.window({"a": 0, "b": 0}, paths=ICEBERG_PATHS, commits=ice)
    sync.window({"a": 1}, paths=ICEBERG_PATHS, commits={"a": _iceberg(6230000000000000003)})
    taken = consistent_cut(sync.store, "s")
    assert {t: (v.version, v.seq, v.table_format, v.snapshot_id) for t, v in taken.tables.items()} == {
        "a": (1, 2, "iceberg", 6230000000000000003),
        "b": (0, 1, "iceberg", 5117000000000000002),
    }
    assert cut_sql(taken) == {
        "a": f"SELECT * FROM `{CATALOG}`.`lake`.`a` VERSION AS OF 6230000000000000003",
        "b": f"SELECT * FROM `{CATALOG}`.`lake`.`b` VERSION AS OF 5117000000000000002",
    }
    first = consistent_cut(sync.store, "s", window=1)
    assert cut_sql(first)["a"] == f"SELECT * FROM `{CATALOG}`.`lake`.`a` VERSION AS OF 5117000000000000001"


def test_a_version_recorded_without_a_format_is_delta_and_a_delta_one_reads_its_version(sync: Sync) -> None:
    sync.window({"a": 0, "b": 0})  # before the store recorded formats: no commits given
    sync.window({"a": 1}, commits={"a": TableCommit("delta")})
    taken = consistent_cut(sync.store, "s")
    assert {t: (v.recorded_format, v.table_format, v.snapshot_id) for t, v in taken.tables.items()} == {
        "a": ("delta", "delta", None),
        "b": (None, "delta", None),
    }
    assert cut_sql(taken) == {
        "a": "SELECT * FROM delta.`/lake/a` VERSION AS OF 1",
        "b": "SELECT * FROM delta.`/lake/b` VERSION AS OF 0",
    }


def test_an_iceberg_version_without_its_snapshot_says_so_instead_of_sql(sync: Sync) -> None:
    sync.window({"a": 0, "b": 0}, paths=ICEBERG_PATHS, commits={"a": _iceberg(None), "b": _iceberg(42)})
    sql = cut_sql(consistent_cut(sync.store, "s"))
    assert sql["a"] == (
        "-- no SQL for table 'a' at version 0: Iceberg table /wh/lake/a: version 0 was recorded "
        "without its snapshot id (by a provider before the store kept them), and Iceberg's time "
        "travel names a snapshot; consistent_tables finds it in the table's metadata log"
    )
    assert sql["b"] == f"SELECT * FROM `{CATALOG}`.`lake`.`b` VERSION AS OF 42"


def test_every_table_format_has_its_sql_at_a_version() -> None:
    assert {name: sql_at("/wh/lake/a", 3, name, 77) for name in TABLE_FORMATS} == {
        "delta": "SELECT * FROM delta.`/wh/lake/a` VERSION AS OF 3",
        "iceberg": f"SELECT * FROM `{CATALOG}`.`lake`.`a` VERSION AS OF 77",
    }
    with pytest.raises(ValueError, match="table format 'hudi' is not one of delta, iceberg"):
        sql_at("/wh/lake/a", 3, "hudi")


class _Format:
    """A table format that tells what it was asked to read (in which catalog)."""

    def __init__(self, name: str, catalog: IcebergCatalog | None) -> None:
        self.name, self.catalog = name, None if catalog is None else catalog.name

    def read_at(self, spark: object, path: str, version: int, snapshot_id: int | None = None) -> str:
        where = "" if self.catalog is None else f" in {self.catalog}"
        return f"{self.name} {path} v{version} snapshot {snapshot_id}{where}"


@pytest.fixture
def formats(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    made: list[str] = []

    def for_session(spark: object, name: str, catalog: IcebergCatalog | None = None) -> _Format:
        made.append(name)
        return _Format(name, catalog)

    monkeypatch.setattr("airflow_provider_vitess.merge.job.formats.for_session", for_session)
    return made


def test_consistent_tables_reads_each_table_in_its_recorded_format(sync: Sync, formats: list[str]) -> None:
    sync.window({"a": 0, "b": 0}, paths=ICEBERG_PATHS, commits={"a": _iceberg(7), "b": _iceberg(8)})
    frames: dict[str, object] = dict(consistent_tables(object(), sync.store, "s"))  # type: ignore[arg-type]
    assert frames == {
        "a": "iceberg /wh/lake/a v0 snapshot 7",
        "b": "iceberg /wh/lake/b v0 snapshot 8",
    }
    assert formats == ["iceberg"], "one format object per format"


def test_consistent_tables_reads_a_jdbc_catalogs_tables_through_the_catalog_given(
    sync: Sync, formats: list[str]
) -> None:
    """A table recorded in a JDBC catalog is read through that catalog, which the caller gives
    (with its credentials); without it, or with another, it is refused naming the remedy."""
    sync.window({"a": 0, "b": 0}, paths=ICEBERG_PATHS, commits={"a": _iceberg(7, "lake"), "b": _iceberg(8)})
    lake = IcebergCatalog("lake", "jdbc:postgresql://db/iceberg", "org.postgresql:postgresql:42.7.14")
    frames: dict[str, object] = dict(consistent_tables(object(), sync.store, "s", iceberg_catalog=lake))  # type: ignore[arg-type]
    assert frames == {
        "a": "iceberg /wh/lake/a v0 snapshot 7 in lake",
        "b": "iceberg /wh/lake/b v0 snapshot 8",
    }
    other = IcebergCatalog("other", "jdbc:postgresql://db/other", "org.postgresql:postgresql:42.7.14")
    for given in (None, other):
        with pytest.raises(
            ValueError, match=r"table 'a' is named in the Iceberg JDBC catalog 'lake'.*iceberg_catalog="
        ):
            consistent_tables(object(), sync.store, "s", iceberg_catalog=given)  # type: ignore[arg-type]


def test_consistent_tables_table_format_is_deprecated_and_names_only_unrecorded_formats(
    sync: Sync, formats: list[str]
) -> None:
    sync.window({"a": 0, "b": 0}, paths=ICEBERG_PATHS)  # recorded before the store kept formats
    with pytest.warns(DeprecationWarning, match=r"table_format=\.\.\.\) is deprecated"):
        frames: dict[str, object] = dict(
            consistent_tables(object(), sync.store, "s", table_format="iceberg")  # type: ignore[arg-type]
        )
    assert frames == {"a": "iceberg /wh/lake/a v0 snapshot None", "b": "iceberg /wh/lake/b v0 snapshot None"}
    sync.window({"a": 1}, paths=ICEBERG_PATHS, commits={"a": _iceberg(9)})
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(ValueError, match="table 'a' is recorded in format 'iceberg', not 'delta'"),
    ):
        consistent_tables(object(), sync.store, "s", table_format="delta")  # type: ignore[arg-type]
