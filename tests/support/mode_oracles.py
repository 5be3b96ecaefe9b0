"""The oracles of the target modes (docs/target-modes.md), shared by test_target_modes (which also
checks each key's versions and changes against the workload's record, ``modes_workload``) and
the matrix soak (``matrix_soak``, any column choice, re-snapshots, columns added).

Rows are dicts (a Delta table's rows with :func:`delta_dicts`, the source's with
:func:`source_dicts`); the data columns are those without the metadata prefix. A mismatch raises
``AssertionError`` saying which table, which keys and how.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support.delta_check import _plain, delta_txns, spark_dicts, table_dicts
from tests.support.modes_workload import Record, State

P = "_vitess_"
KEY = "id"
Row = dict[str, Any]


def delta_dicts(path: str | Path, spark: Any = None, version: int | None = None) -> list[Row]:
    """The Delta table's rows (at ``version``: time travel, a consistent cut's): read by ``spark``
    if given, else as :func:`~tests.support.delta_check.table_dicts` reads them."""
    return table_dicts(path, version) if spark is None else spark_dicts(spark, path, version)


def source_dicts(hook: VitessHook, keyspace: str, table: str) -> list[Row]:
    raw = hook.engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute(f"SELECT * FROM `{keyspace}`.`{table}`")
        names = [d[0] for d in cur.description]
        return [{n: _plain(v) for n, v in zip(names, r, strict=True)} for r in cur.fetchall()]
    finally:
        raw.close()


def as_target(
    rows: Iterable[Row],
    dropped: Iterable[str] = (),
    hashed: Mapping[str, Callable[[bytes], str]] | None = None,
) -> list[Row]:
    """Source rows as a column choice stages them: ``dropped`` columns left out, ``hashed`` ones
    (column -> the stager's digest of a value's bytes) replaced by their digest (NULL stays)."""
    gone, digest = set(dropped), dict(hashed or {})
    out = []
    for r in rows:
        row = {k: v for k, v in r.items() if k not in gone}
        for c, h in digest.items():
            if row.get(c) is not None:
                row[c] = h(str(row[c]).encode("utf-8"))
        out.append(row)
    return out


def data(row: Row) -> Row:
    return {k: v for k, v in row.items() if not k.startswith(P)}


def _frozen(rows: Iterable[Row], columns: Sequence[str]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r.get(c) for c in columns) for r in rows)


def assert_rows_equal(what: str, got: Sequence[Row], want: Sequence[Row]) -> None:
    """``got`` (target rows, data columns) == ``want`` (the source as staged), as multisets on the
    target's columns; a source column the target lacks must be NULL in every row (a column added
    to a table that no change carried yet), a target column the source lacks is an error."""
    columns = sorted({k for r in got for k in data(r)}) if got else sorted({k for r in want for k in r})
    source_columns = {k for r in want for k in r}
    assert not set(columns) - source_columns or not want, (
        f"{what}: target columns {sorted(set(columns) - source_columns)} are not in the source"
    )
    unseen = source_columns - set(columns)
    lost = [c for c in sorted(unseen) if any(r.get(c) is not None for r in want)]
    assert not lost, f"{what}: source columns {lost} hold values the target has no column for"
    g, w = _frozen(got, columns), _frozen(want, columns)
    if g != w:
        only_t, only_s = sorted((g - w).elements(), key=repr), sorted((w - g).elements(), key=repr)
        raise AssertionError(
            f"{what}: {len(only_t)} rows only in the target (e.g. {only_t[:3]}), {len(only_s)} only in "
            f"the source (e.g. {only_s[:3]}); columns {columns}"
        )


def assert_mirror(what: str, rows: Sequence[Row], source: Sequence[Row]) -> None:
    assert_rows_equal(what, [data(r) for r in rows], source)


def assert_soft_delete(
    what: str, rows: Sequence[Row], source: Sequence[Row], gone: set[int], key: Sequence[str] = (KEY,)
) -> None:
    """Live rows == the source, one row per key (no live key flagged), flagged keys == ``gone``
    (the ``id``s deleted and not inserted again), ``deleted_at`` set exactly on flagged rows.
    With another ``key`` than ``id`` (a key override: one ``id`` can have a tombstone per other
    value it had), no flagged key is live and every ``id`` in ``gone`` is flagged."""
    keys = Counter(tuple(r[c] for c in key) for r in rows)
    assert all(n == 1 for n in keys.values()), (
        f"{what}: keys with several rows {[k for k, n in keys.items() if n > 1][:5]}"
    )
    assert_rows_equal(what + " (live rows)", [data(r) for r in rows if not r[P + "deleted"]], source)
    flagged = {r[KEY] for r in rows if r[P + "deleted"]}
    if tuple(key) == (KEY,):
        assert flagged == gone, (
            f"{what}: flagged, not deleted {sorted(flagged - gone)[:5]}; "
            f"deleted, not flagged {sorted(gone - flagged)[:5]}"
        )
    else:
        live = {tuple(r[c] for c in key) for r in source}
        flagged_live = {tuple(r[c] for c in key) for r in rows if r[P + "deleted"]} & live
        assert not flagged_live and gone <= flagged, (
            f"{what}: live keys flagged {sorted(flagged_live)[:5]}; deleted, not flagged "
            f"{sorted(gone - flagged)[:5]}"
        )
    for r in rows:
        assert (r[P + "deleted_at"] is not None) == r[P + "deleted"], (what, r)
        assert r[P + "op"] in ("insert", "update", "delete") and r[P + "window_seq"] >= 1, (what, r)


def _versions_by_key(rows: Iterable[Row]) -> dict[Any, list[Row]]:
    by_key: dict[Any, list[Row]] = {}
    for r in rows:
        by_key.setdefault(r[KEY], []).append(r)
    for versions in by_key.values():
        versions.sort(
            key=lambda r: (
                r[P + "valid_from"] is not None,
                r[P + "valid_from"] or 0,
                r[P + "valid_to"] is None,
            )
        )
    return by_key


def _check_intervals(what: str, key: Any, versions: Sequence[Row]) -> None:
    """One key's versions in order: each but the last closed and not current; a deleted one
    leaves a gap (or none) before the next, any other meets it exactly: no overlap, no gap."""
    for a, b in itertools.pairwise(versions):
        assert a[P + "valid_to"] is not None and not a[P + "current"], (
            what,
            key,
            "an earlier version open",
            versions,
        )
        if a[P + "deleted"]:
            assert a[P + "valid_to"] <= b[P + "valid_from"], (what, key, "versions overlap", versions)
        else:
            assert a[P + "valid_to"] == b[P + "valid_from"], (
                what,
                key,
                "a gap or overlap not after a delete",
                versions,
            )
    last = versions[-1]
    assert last[P + "current"] == (last[P + "valid_to"] is None) and not (
        last[P + "current"] and last[P + "deleted"]
    ), (what, key, "the last version's current/valid_to/deleted disagree", versions)


def assert_history(what: str, rows: Sequence[Row], source: Sequence[Row]) -> None:
    """Current versions == the source, at most one current per key, the versions of a key never
    overlap and leave no gap except after a delete."""
    for key, versions in _versions_by_key(rows).items():
        _check_intervals(what, key, versions)
        assert sum(v[P + "current"] for v in versions) <= 1, (what, key, "several current versions", versions)
    assert_rows_equal(what + " (current versions)", [data(r) for r in rows if r[P + "current"]], source)


def _state(row: Row) -> State:
    return (int(row["vid"]), row["note"], int(row["qty"]))


def _expected_versions(states: list[State]) -> list[tuple[State, bool]]:
    """Each recorded state that is a row, with whether a delete ended it."""
    return [(s, i + 1 < len(states) and states[i + 1] is None) for i, s in enumerate(states) if s is not None]


def assert_history_states(what: str, rows: Sequence[Row], record: Record) -> None:
    """Per key, the versions in order == the states the workload recorded (each ended deleted
    where a delete followed it), intervals as :func:`assert_history` checks, one current
    version per live key."""
    by_key = _versions_by_key(rows)
    assert set(by_key) == {k for k, s in record.states.items() if any(x is not None for x in s)}, what
    wrong = []
    for key, versions in by_key.items():
        got = [(_state(v), v[P + "deleted"]) for v in versions]
        if got != _expected_versions(record.states[key]):
            wrong.append((key, got, _expected_versions(record.states[key])))
            continue
        _check_intervals(what, key, versions)
        assert versions[-1][P + "current"] == (record.states[key][-1] is not None), (what, key, versions)
    assert not wrong, f"{what}: {len(wrong)} keys' versions differ, e.g. {wrong[:3]}"


def replay_changelog(what: str, rows: Sequence[Row]) -> list[Row]:
    """The rows a changelog says the table holds: its rows in ``(window_seq, order)``; a
    window with ``snapshot`` rows starts again from them (a re-snapshot's copy); a key lives
    while some shard holds it (a move's two halves are on two shards, in either order)."""
    held: dict[Any, dict[str, Row]] = {}
    windows = itertools.groupby(
        sorted(rows, key=lambda r: (r[P + "window_seq"], r[P + "order"] or 0)),
        key=lambda r: r[P + "window_seq"],
    )
    for _, window in windows:
        changes = list(window)
        if any(r[P + "op"] == "snapshot" for r in changes):
            held = {}
        for r in changes:
            shards = held.setdefault(r[KEY], {})
            if r[P + "op"] == "delete":
                assert shards.pop(r[P + "shard"], None) is not None, (
                    what,
                    "a delete of a key its shard does not hold",
                    r,
                )
            else:
                assert r[P + "op"] != "insert" or r[P + "shard"] not in shards, (
                    what,
                    "an insert of a held key",
                    r,
                )
                shards[r[P + "shard"]] = data(r)
    out: list[Row] = []
    for key, shards in held.items():
        assert len(shards) <= 1, (what, key, "held by two shards at the end", shards)
        out.extend(shards.values())
    return out


def assert_changelog(what: str, rows: Sequence[Row], source: Sequence[Row]) -> None:
    assert_rows_equal(what + " (changelog replayed)", replay_changelog(what, rows), source)


def _canonical(changes: list[tuple[str, State, str | None]]) -> list[tuple[str, State]]:
    """Changelog rows of a key as the workload's changes: a delete and an insert on two shards
    next to each other (either order) are one move."""
    out: list[tuple[str, State]] = []
    i = 0
    while i < len(changes):
        op, after, shard = changes[i]
        if i + 1 < len(changes):
            op2, after2, shard2 = changes[i + 1]
            if {op, op2} == {"delete", "insert"} and shard != shard2:
                out.append(("move", after if op == "insert" else after2))
                i += 2
                continue
        out.append((op, after))
        i += 1
    return out


def assert_changelog_changes(what: str, rows: Sequence[Row], record: Record) -> None:
    """One ``snapshot`` row per key the snapshot copied; per key, the changes in order == the
    workload's (a move's two rows one move)."""
    snapshot = Counter(r[KEY] for r in rows if r[P + "op"] == "snapshot")
    assert all(n == 1 for n in snapshot.values()) and set(snapshot) == {
        k for k, s in record.states.items() if s[0] is not None
    }, what
    by_key: dict[Any, list[Row]] = {}
    for r in rows:
        if r[P + "op"] != "snapshot":
            by_key.setdefault(r[KEY], []).append(r)
    got = {}
    for key, changes in by_key.items():
        changes.sort(key=lambda r: (r[P + "window_seq"], r[P + "order"]))
        got[key] = _canonical(
            [(r[P + "op"], None if r[P + "op"] == "delete" else _state(r), r[P + "shard"]) for r in changes]
        )
    want = {k: [(c.op, c.after) for c in cs] for k, cs in record.changes.items()}
    wrong = [(k, got.get(k), want.get(k)) for k in sorted(set(got) | set(want)) if got.get(k) != want.get(k)]
    assert not wrong, f"{what}: {len(wrong)} keys' changes differ, e.g. {wrong[:3]}"


def assert_each_window_once(what: str, path: str | Path) -> None:
    """Every transaction id (a window of a table) in the table's Delta log once."""
    counts = Counter((app, v) for app, v, _ in delta_txns(path))
    twice = {k: n for k, n in counts.items() if n > 1}
    assert not twice, f"{what}: windows applied more than once: {twice}"


def current_rows(mode: str, rows: Sequence[Row]) -> list[Row]:
    """The rows a target in ``mode`` says the source holds (data columns): a mirror's rows, a
    soft_delete's live rows, a history's current versions, a changelog replayed."""
    if mode == "changelog":
        return replay_changelog(mode, rows)
    flag = {"soft_delete": "deleted", "history": "current"}.get(mode)
    if flag is None:
        return [data(r) for r in rows]
    keep = flag == "current"
    return [data(r) for r in rows if bool(r[P + flag]) == keep]


def assert_cut_consistent(what: str, tables: Mapping[str, Sequence[Row]], columns: Sequence[str]) -> None:
    """Tables that took every source transaction alike (the same statements in the same
    transactions), each read at one consistent cut as :func:`current_rows`, hold the same rows on
    ``columns``: a table a step ahead or behind the others shows as rows only in it."""
    frozen = {t: _frozen(rows, columns) for t, rows in tables.items()}
    first, *others = sorted(frozen)
    for t in others:
        if frozen[t] != frozen[first]:
            ahead, behind = frozen[t] - frozen[first], frozen[first] - frozen[t]
            raise AssertionError(
                f"{what}: {t} and {first} at the cut differ: {sum(ahead.values())} rows only in {t} "
                f"(e.g. {sorted(ahead, key=repr)[:3]}), {sum(behind.values())} only in {first} "
                f"(e.g. {sorted(behind, key=repr)[:3]}); columns {list(columns)}"
            )
