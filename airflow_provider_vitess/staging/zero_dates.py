"""What a zero or invalid MySQL date becomes in the staged Parquet: the zero-date policy.

With a permissive ``sql_mode`` MySQL and MariaDB store DATE/DATETIME/TIMESTAMP values that are
no calendar value: ``0000-00-00``, ``0000-00-00 00:00:00``, dates with a zero part
(``2020-00-15``, ``2020-05-00``) and, with ``ALLOW_INVALID_DATES``, days past the month's end
(``2020-02-30``). The decoder keeps them as MySQL's text, as pymysql does
(:mod:`airflow_provider_vitess.decoding.values`); Parquet's date and timestamp types cannot
hold them. Such a row may reach the binlog at any time, and a binlog event cannot be fixed at
the source, so refusing it would stop the sync for good. The policy, per sync with per-table
overrides, says what to stage instead:

* ``null`` (default): NULL, as Debezium does (for nullable columns). The row is kept, the
  value lost; the staged and Delta columns are nullable anyway.
* ``epoch``: ``1970-01-01`` (``1970-01-01 00:00:00`` for DATETIME/TIMESTAMP), what Debezium
  stages for NOT NULL columns, for consumers that cannot take a NULL. A real date: it cannot
  be told apart from a stored 1970-01-01.
* ``error``: staging fails, naming the table, column, the row's key and value, and the remedy.

Why no "keep the text" mapping (a sibling string column): it would add a column to every table
with a temporal column, in staging and in Delta, for values that are rare and carry no date;
a consumer who needs to tell them apart can use ``error`` and fix the source rows, or a
re-snapshot after fixing them.

Both staging paths (the columnar one and the decoded-rows one) and both phases (copy, binlog)
convert a temporal column through :meth:`ColumnPlan.to_array
<airflow_provider_vitess.staging.columnar.ColumnPlan.to_array>`, which applies
:func:`replace_invalid` only when Arrow refuses the column: no cost for ordinary values.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_vitess.exceptions import VitessProviderError, ZeroDateError


class ZeroDatePolicy(str, enum.Enum):
    """What a zero or invalid DATE/DATETIME/TIMESTAMP value is staged as (module docstring)."""

    NULL = "null"
    EPOCH = "epoch"
    ERROR = "error"

    @classmethod
    def parse(cls, value: str | ZeroDatePolicy, what: str = "zero_date_policy") -> ZeroDatePolicy:
        if isinstance(value, ZeroDatePolicy):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            choices = ", ".join(repr(p.value) for p in cls)
            raise VitessProviderError(f"{what} {value!r} is not one of {choices}") from None


@dataclass(frozen=True)
class ZeroDatePolicies:
    """The sync's policy and its per-table overrides."""

    default: ZeroDatePolicy = ZeroDatePolicy.NULL
    tables: Mapping[str, ZeroDatePolicy] = field(default_factory=dict)

    @classmethod
    def parse(
        cls,
        default: str | ZeroDatePolicy | None = None,
        per_table: Mapping[str, str | ZeroDatePolicy] | None = None,
        tables: Iterable[str] | None = None,
    ) -> ZeroDatePolicies:
        """From operator arguments; with ``tables``, an override for another table is an error
        (a misspelt table name would otherwise be ignored silently)."""
        overrides = {
            t: ZeroDatePolicy.parse(p, f"zero_date_policies[{t!r}]") for t, p in (per_table or {}).items()
        }
        if tables is not None:
            known = set(tables)
            unknown = sorted(set(overrides) - known)
            if unknown:
                raise VitessProviderError(
                    f"zero_date_policies names {unknown}, not among the sync's tables {sorted(known)}"
                )
        return cls(ZeroDatePolicy.parse(default or ZeroDatePolicy.NULL), overrides)

    def for_table(self, table: str) -> ZeroDatePolicy:
        return self.tables.get(table, self.default)


_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH_DATETIME = datetime.datetime(1970, 1, 1)


def replace_invalid(
    values: list[Any],
    describe: Callable[[int], str],
    *,
    policy: ZeroDatePolicy,
    table: str,
    column_type: str,
    is_date: bool,
) -> list[Any] | None:
    """``values`` of one temporal column with the zero/invalid ones replaced per ``policy``.

    The decoder yields a ``str`` for exactly those values (a date or datetime otherwise). None
    when there is none: whatever Arrow refused is another error, for the caller to explain.
    Under ``error`` raises :class:`ZeroDateError` for the first one.
    """
    if str not in map(type, values):
        return None
    if policy is ZeroDatePolicy.ERROR:
        i = next(i for i, v in enumerate(values) if isinstance(v, str))
        raise ZeroDateError(
            f"{describe(i)}: the zero or invalid {column_type} value {values[i]!r} has no Parquet "
            f"value and the zero-date policy of table {table!r} is 'error'. Fix the row at the "
            "source (its change already in the binlog stays as it is), or stage such values as "
            f"NULL or 1970-01-01: zero_date_policy='null' or 'epoch' for the sync, or "
            f"zero_date_policies={{{table!r}: 'null'}}; then rerun the task (an unfinished window "
            "is read again from its start)"
        )
    value = None if policy is ZeroDatePolicy.NULL else (_EPOCH_DATE if is_date else _EPOCH_DATETIME)
    return [value if isinstance(v, str) else v for v in values]
