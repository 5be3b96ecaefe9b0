"""Row value decoding: each value must equal what pymysql returns for the same column."""

from __future__ import annotations

import datetime
import random
import re
from collections.abc import Callable
from decimal import Decimal

import pytest
from pymysql import converters as pymysql_converters

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.decoding import values as values_module
from airflow_provider_vitess.decoding.values import RowDecoder, decode_row, decode_value
from airflow_provider_vitess.exceptions import ValueDecodeError

T = query_pb2.Type
UTF8MB4_GENERAL_CI = 45
LATIN1_SWEDISH_CI = 8
BINARY = 63


def field(
    type_: int, name: str = "c", charset: int = 0, column_type: str = "", decimals: int = 0
) -> query_pb2.Field:
    return query_pb2.Field(name=name, type=type_, charset=charset, column_type=column_type, decimals=decimals)  # type: ignore[arg-type]


def row(*values: bytes | None) -> query_pb2.Row:
    return query_pb2.Row(
        lengths=[-1 if v is None else len(v) for v in values],
        values=b"".join(v for v in values if v is not None),
    )


def one(f: query_pb2.Field, data: bytes | None) -> object:
    """Decode through the row path (what the stream uses)."""
    return RowDecoder([f]).decode(row(data))[0]


# -- integers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_", "text", "expected"),
    [
        (T.INT8, b"-128", -128),
        (T.INT8, b"127", 127),
        (T.UINT8, b"255", 255),
        (T.INT16, b"-32768", -32768),
        (T.UINT16, b"65535", 65535),
        (T.INT24, b"-8388608", -8388608),
        (T.UINT24, b"16777215", 16777215),
        (T.INT32, b"-2147483648", -2147483648),
        (T.UINT32, b"4294967295", 4294967295),
        (T.INT64, b"-9223372036854775808", -9223372036854775808),
        (T.INT64, b"9223372036854775807", 9223372036854775807),
        (T.UINT64, b"18446744073709551615", 18446744073709551615),
        (T.UINT64, b"0", 0),
        (T.YEAR, b"2155", 2155),
        (T.YEAR, b"0", 0),
    ],
)
def test_integers(type_: int, text: bytes, expected: int) -> None:
    value = one(field(type_), text)
    assert value == expected
    assert type(value) is int


# -- DECIMAL -------------------------------------------------------------------------------


def test_decimal_65_30_is_exact() -> None:
    text = "-12345678901234567890123456789012345.123456789012345678901234567890"
    value = one(field(T.DECIMAL, column_type="decimal(65,30)"), text.encode())
    assert value == Decimal(text)
    assert str(value) == text  # every digit kept, trailing zero included


def test_decimal_small_values_compare_with_pymysql() -> None:
    for text in ("0.50", "-0.000000000000000000000000000001", "99999999999999999999999999999999999"):
        assert one(field(T.DECIMAL), text.encode()) == pymysql_converters.decoders[246](text)


# -- FLOAT / DOUBLE: rounded the way MariaDB prints them ----------------------------------


@pytest.mark.parametrize(
    ("stream_text", "column_type", "decimals", "server_text"),
    [
        # Stream text is Go's shortest float32 form; server_text is MariaDB 10.11's SELECT output.
        (b"1.2345678E+00", "float", 31, "1.23457"),
        (b"1.2345679E+04", "float(10,4)", 4, "12345.6787"),
        (b"1.2345679E+04", "", 4, "12345.6787"),  # no column_type: Field.decimals decides
        (b"3.4028235E+38", "float", 31, "3.40282e38"),
        (b"1E-40", "float", 31, "9.99995e-41"),
        (b"100000.5", "float", 31, "100000"),  # half-even at the 6th digit, as the server
        (b"1.23457", "float", 31, "1.23457"),  # copy phase: server text comes through unchanged
        (b"12345.6787", "float(10,4) unsigned", 4, "12345.6787"),
        (b"1E-01", "float", 31, "0.1"),
    ],
)
def test_float32(stream_text: bytes, column_type: str, decimals: int, server_text: str) -> None:
    f = field(T.FLOAT32, column_type=column_type, decimals=decimals)
    assert one(f, stream_text) == float(server_text)


@pytest.mark.parametrize(
    ("stream_text", "column_type", "server_text"),
    [
        (b"1E-01", "double", "0.1"),
        (b"1.7976931348623157E+308", "double", "1.7976931348623157e308"),
        (b"5E-324", "double", "5e-324"),
        (b"-0E+00", "double", "-0"),
        (b"1.23456E+00", "double(10,3)", "1.235"),
    ],
)
def test_float64(stream_text: bytes, column_type: str, server_text: str) -> None:
    value = one(field(T.FLOAT64, column_type=column_type), stream_text)
    assert value == float(server_text)
    assert type(value) is float


# -- dates and times -----------------------------------------------------------------------


def test_date_datetime_timestamp_values() -> None:
    assert one(field(T.DATE), b"2024-02-29") == datetime.date(2024, 2, 29)
    assert one(field(T.DATE), b"1000-01-01") == datetime.date(1000, 1, 1)
    assert one(field(T.DATETIME), b"9999-12-31 23:59:59.999999") == datetime.datetime(
        9999, 12, 31, 23, 59, 59, 999999
    )
    assert one(field(T.DATETIME), b"2020-01-02 03:04:05.5") == datetime.datetime(2020, 1, 2, 3, 4, 5, 500000)
    value = one(field(T.TIMESTAMP), b"1970-01-01 00:00:01.123")
    assert value == datetime.datetime(1970, 1, 1, 0, 0, 1, 123000)
    assert isinstance(value, datetime.datetime) and value.tzinfo is None


def test_zero_and_invalid_dates_stay_text() -> None:
    assert one(field(T.DATE), b"0000-00-00") == "0000-00-00"
    assert one(field(T.DATE), b"2020-00-00") == "2020-00-00"
    assert one(field(T.DATE), b"2020-02-30") == "2020-02-30"
    assert one(field(T.DATETIME), b"0000-00-00 00:00:00.000000") == "0000-00-00 00:00:00.000000"
    assert one(field(T.TIMESTAMP), b"0000-00-00 00:00:00.000") == "0000-00-00 00:00:00.000"


def test_time_is_a_signed_duration() -> None:
    assert one(field(T.TIME), b"-838:59:59.000000") == -datetime.timedelta(hours=838, minutes=59, seconds=59)
    assert one(field(T.TIME), b"838:59:59") == datetime.timedelta(hours=838, minutes=59, seconds=59)
    assert one(field(T.TIME), b"-00:00:01.5") == datetime.timedelta(seconds=-1.5)
    assert one(field(T.TIME), b"-00:00:00.000001") == datetime.timedelta(microseconds=-1)
    assert one(field(T.TIME), b"00:00:00") == datetime.timedelta(0)


@pytest.mark.parametrize(
    ("type_", "text"),
    [
        (T.DATE, "2024-02-29"),
        (T.DATE, "0000-00-00"),
        (T.DATE, "2023-02-29"),
        (T.DATE, "9999-12-31"),
        (T.DATETIME, "2024-02-29 23:59:59"),
        (T.DATETIME, "2024-02-29 23:59:59.1"),
        (T.DATETIME, "2024-02-29 23:59:59.000001"),
        (T.DATETIME, "0000-00-00 00:00:00"),
        (T.DATETIME, "2020-13-01 00:00:00.00"),
        (T.TIMESTAMP, "2038-01-19 03:14:07.999999"),
        (T.TIME, "-838:59:59.000000"),
        (T.TIME, "-00:00:01.5"),
        (T.TIME, "-01:02:03.04"),
        (T.TIME, "12:34:56.789"),
        (T.TIME, "00:00:00"),
    ],
)
def test_temporal_values_match_pymysql_converters(type_: int, text: str) -> None:
    converters: dict[int, Callable[[str], object]] = {
        T.DATE: pymysql_converters.convert_date,
        T.DATETIME: pymysql_converters.convert_datetime,
        T.TIMESTAMP: pymysql_converters.convert_datetime,
        T.TIME: pymysql_converters.convert_timedelta,
    }
    expected = converters[type_](text)
    value = one(field(type_), text.encode())
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("type_", "text"), [(T.DATE, b"yesterday"), (T.DATETIME, b"2020-01-01"), (T.TIME, b"1h")]
)
def test_temporal_garbage_is_an_error(type_: int, text: bytes) -> None:
    with pytest.raises(ValueDecodeError, match=rf"column 'when' \({T.Name(type_)}\)"):
        RowDecoder([field(type_, name="when")]).decode(row(text))


# -- text and bytes ------------------------------------------------------------------------


def test_text_types_are_str_with_4_byte_utf8() -> None:
    text = "héllo 😀 𝄞"
    for type_ in (T.VARCHAR, T.CHAR, T.TEXT):
        value = one(field(type_, charset=UTF8MB4_GENERAL_CI), text.encode())
        assert value == text
        assert type(value) is str
    assert one(field(T.VARCHAR, charset=UTF8MB4_GENERAL_CI), b"") == ""


def test_text_with_binary_charset_is_bytes() -> None:
    assert one(field(T.VARCHAR, charset=BINARY), b"a\x00b") == b"a\x00b"
    assert one(field(T.TEXT, charset=BINARY), b"\xff") == b"\xff"


def test_latin1_text_from_copy_phase_and_binlog_phase() -> None:
    f = field(T.VARCHAR, charset=LATIN1_SWEDISH_CI)
    assert one(f, "café".encode()) == "café"  # copy phase: utf8mb4 connection
    assert one(f, b"caf\xe9") == "café"  # binlog phase: stored latin1 bytes
    assert one(f, b"\x80\x81") == "€\x81"  # MySQL latin1 is cp1252, with C1 controls in its holes


def test_invalid_utf8_is_an_error_naming_column() -> None:
    decoder = RowDecoder(
        [field(T.INT64, "id"), field(T.VARCHAR, "name", UTF8MB4_GENERAL_CI)], table="customer"
    )
    with pytest.raises(ValueDecodeError, match=r"table 'customer': column 'name' \(VARCHAR\)"):
        decoder.decode(row(b"1", b"\xff\xfe"))


@pytest.mark.parametrize("type_", [T.VARBINARY, T.BINARY, T.BLOB, T.GEOMETRY, T.VECTOR, T.RAW])
def test_binary_types_are_bytes_and_keep_zero_bytes(type_: int) -> None:
    value = one(field(type_, charset=BINARY), b"\x00a\x00b\x00")
    assert value == b"\x00a\x00b\x00"
    assert type(value) is bytes


def test_empty_value_is_not_null() -> None:
    assert RowDecoder([field(T.VARBINARY), field(T.VARBINARY)]).decode(row(b"", None)) == (b"", None)


def test_bit_json_enum_set_expression() -> None:
    assert one(field(T.BIT, charset=BINARY), b"\x02\xaa") == b"\x02\xaa"
    assert one(field(T.JSON, charset=BINARY), b'{"a": [1, "\xc3\xa9"]}') == '{"a": [1, "é"]}'
    assert one(field(T.ENUM, charset=UTF8MB4_GENERAL_CI), b"b") == "b"
    assert one(field(T.SET, charset=UTF8MB4_GENERAL_CI), b"x,y") == "x,y"
    assert one(field(T.EXPRESSION), b"JSON_INSERT(`j`, '$.a', 1)") == "JSON_INSERT(`j`, '$.a', 1)"


def test_literal_types() -> None:
    assert one(field(T.HEXNUM), b"0x41") == b"A"
    assert one(field(T.HEXNUM), b"0x141") == b"\x01A"
    assert one(field(T.HEXVAL), b"X'4142'") == b"AB"
    assert one(field(T.BITNUM), b"0b101") == b"\x05"
    assert one(field(T.BITNUM), b"0b1000000001") == b"\x02\x01"
    assert one(field(T.NULL_TYPE), b"") is None


def test_unknown_type_stays_bytes() -> None:
    assert one(field(9999), b"\x01\x02") == b"\x01\x02"


# -- rows ----------------------------------------------------------------------------------


def test_row_with_nulls_and_mixed_types() -> None:
    fields = [
        field(T.INT64, "id"),
        field(T.VARCHAR, "name", UTF8MB4_GENERAL_CI),
        field(T.DECIMAL, "amount"),
        field(T.DATETIME, "at"),
        field(T.BLOB, "data", BINARY),
        field(T.TIME, "dur"),
    ]
    r = row(b"7", None, b"1.50", b"2024-01-02 03:04:05", b"\x00\x01", None)
    expected = (7, None, Decimal("1.50"), datetime.datetime(2024, 1, 2, 3, 4, 5), b"\x00\x01", None)
    decoder = RowDecoder(fields)
    assert decoder.decode(r) == expected
    assert decoder.names == ("id", "name", "amount", "at", "data", "dur")
    assert decode_row(fields, r) == expected
    assert decoder.decode(row(None, None, None, None, None, None)) == (None,) * 6


def test_decode_value() -> None:
    assert decode_value(field(T.UINT64), b"18446744073709551615") == 18446744073709551615
    assert decode_value(field(T.UINT64), None) is None
    with pytest.raises(ValueDecodeError, match=r"column 'c' \(UINT64\)"):
        decode_value(field(T.UINT64), b"1.5")


def test_column_count_mismatch() -> None:
    decoder = RowDecoder([field(T.INT64, "a"), field(T.INT64, "b")], table="t")
    with pytest.raises(ValueDecodeError, match=r"table 't': row has 1 values but the table has 2 columns"):
        decoder.decode(row(b"1"))
    with pytest.raises(ValueDecodeError, match="row has 3 values"):
        decoder.decode(row(b"1", b"2", b"3"))


def test_lengths_not_matching_values() -> None:
    decoder = RowDecoder([field(T.VARBINARY, "a"), field(T.VARBINARY, "b")])
    short = query_pb2.Row(lengths=[2, 2], values=b"abc")
    with pytest.raises(ValueDecodeError, match="lengths add up to 4 bytes but the row has 3"):
        decoder.decode(short)
    long = query_pb2.Row(lengths=[1, -1], values=b"abc")
    with pytest.raises(ValueDecodeError, match="lengths add up to 1 bytes but the row has 3"):
        decoder.decode(long)
    # Same mismatch where a converter would fail on the truncated slice first.
    ints = RowDecoder([field(T.INT64, "a"), field(T.INT64, "b")])
    with pytest.raises(ValueDecodeError, match="lengths add up to 4 bytes but the row has 2"):
        ints.decode(query_pb2.Row(lengths=[2, 2], values=b"12"))


@pytest.mark.parametrize(
    ("type_", "text"),
    [(T.INT32, b"12x"), (T.UINT64, b""), (T.DECIMAL, b"1.2.3"), (T.FLOAT64, b"abc"), (T.FLOAT32, b"1E+39")],
)
def test_unparseable_numbers_name_column_and_type(type_: int, text: bytes) -> None:
    decoder = RowDecoder([field(T.INT64, "id"), field(type_, "amount")], table="orders")
    with pytest.raises(ValueDecodeError, match=rf"table 'orders': column 'amount' \({T.Name(type_)}\)"):
        decoder.decode(row(b"1", text))


# -- binary-flagged text -------------------------------------------------------------------
UTF8MB4_BIN = 46


@pytest.mark.parametrize("type_", [T.BLOB, T.VARBINARY, T.BINARY])
def test_bin_collation_text_typed_binary_by_vitess_decodes_as_text(type_: int) -> None:
    # Vitess types utf8mb4_bin text (and MariaDB JSON) as BINARY/VARBINARY/BLOB from the
    # column's BINARY flag; pymysql goes by charset and returns str, so must we.
    assert one(field(type_, charset=UTF8MB4_BIN), '[1, "😀"]'.encode()) == '[1, "😀"]'
    assert one(field(type_, charset=BINARY), b"\x00a") == b"\x00a"
    assert one(field(type_, charset=0), b"\x00a") == b"\x00a"


# -- fast paths: same results as the general parsers -------------------------------------
# DATE/DATETIME/TIMESTAMP/TIME try ``fromisoformat`` on text of vtgate's exact shape first; the
# regex parsers decide everything else. Both paths must agree on every input.


def _temporal_samples() -> list[bytes]:
    rnd = random.Random(20240517)
    samples = [
        b"2024-02-29",
        b"2023-02-29",
        b"0000-00-00",
        b"2020-00-00",
        b"0001-01-01",
        b"9999-12-31",
        b"2024-13-01",
        b"2024-W01-1",  # ISO week date: fromisoformat reads it, MySQL never sends it
        b"20240101",
        b"2024-001",
        b"2024-01-02 03:04:05",
        b"2024-01-02T03:04:05",
        b"2024-01-02 03:04:05.5",
        b"2024-01-02 03:04:05.000001",
        b"2024-01-02 03:04:05,5",
        b"2024-01-02 03:04:05Z",
        b"2024-01-02 03:04:05.1+01:00",
        b"2024-01-02 030405.1",
        b"2024-01-02 24:00:00",
        b"2024-01-02 23:60:00",
        b"2024-01-02 3:04:05",
        b"2024-01-02 03:04:05.1234567",
        b"0000-00-00 00:00:00.000000",
        b"2024-02-30 00:00:00.00",
        b"\xd9\xa2024-01-02",  # non-ASCII digit
        b"12:34:56",
        b"12:34:56.789",
        b"00:00:00",
        b"23:59:59.999999",
        b"24:00:00",
        b"99:59:59",
        b"838:59:59.000000",
        b"-838:59:59",
        b"-00:00:01.5",
        b"123456",
        b"12:34:56,5",
        b"12:34:56Z",
        b"12:60:00",
    ]
    for _ in range(2000):
        y, mo, d = rnd.randint(0, 9999), rnd.randint(0, 13), rnd.randint(0, 32)
        h, mi, s = rnd.randint(0, 25), rnd.randint(0, 60), rnd.randint(0, 60)
        frac = rnd.choice(
            [b""] + [b"." + str(rnd.randint(0, 10**k - 1)).zfill(k).encode() for k in range(1, 7)]
        )
        date = f"{y:04d}-{mo:02d}-{d:02d}".encode()
        samples += [date, date + f" {h:02d}:{mi:02d}:{s:02d}".encode() + frac]
        sign = rnd.choice([b"", b"-"])
        samples.append(sign + f"{rnd.randint(0, 850):02d}:{mi:02d}:{s:02d}".encode() + frac)
    return samples


def _outcome(convert: Callable[[bytes], object], data: bytes) -> object:
    try:
        value = convert(data)
    except ValueError as exc:
        return ("error", str(exc))
    return (type(value), value)


@pytest.mark.parametrize(
    ("fast", "general"),
    [
        (values_module._date, values_module._date_text),
        (values_module._datetime, values_module._datetime_text),
        (values_module._time, values_module._time_text),
    ],
)
def test_temporal_fast_path_agrees_with_general_parser(
    fast: Callable[[bytes], object], general: Callable[[bytes], object]
) -> None:
    for data in _temporal_samples():
        assert _outcome(fast, data) == _outcome(general, data), data


@pytest.mark.parametrize(
    ("type_", "convert"),
    [
        (T.DATE, pymysql_converters.convert_date),
        (T.DATETIME, pymysql_converters.convert_datetime),
        (T.TIMESTAMP, pymysql_converters.convert_datetime),
        (T.TIME, pymysql_converters.convert_timedelta),
    ],
)
def test_temporal_server_shapes_equal_pymysql(type_: int, convert: Callable[[str], object]) -> None:
    # The shapes MariaDB prints (so the ones pymysql parses): regex-valid text of each type.
    shapes: dict[int, re.Pattern[bytes]] = {
        T.DATE: values_module._DATE_RE,
        T.DATETIME: values_module._DATETIME_RE,
        T.TIMESTAMP: values_module._DATETIME_RE,
        T.TIME: values_module._TIME_RE,
    }
    decoder = RowDecoder([field(type_)])
    checked = 0
    for data in _temporal_samples():
        if not shapes[type_].fullmatch(data) or (type_ == T.DATE and b" " in data):
            continue
        expected = convert(data.decode())
        value = decoder.decode(row(data))[0]
        assert value == expected, data
        assert type(value) is type(expected), data
        checked += 1
    assert checked > 1000


def test_hour_24_is_never_midnight() -> None:
    # Newer Pythons' fromisoformat read 24:00:00 as the next midnight; MySQL has no such value.
    assert one(field(T.DATETIME), b"2024-01-02 24:00:00") == "2024-01-02 24:00:00"
    assert one(field(T.TIME), b"24:00:00") == datetime.timedelta(hours=24)


@pytest.mark.parametrize(
    ("type_", "text"),
    [
        (T.DATE, b"2024-W01-1"),
        (T.DATETIME, b"2024-01-02 03:04:05Z"),
        (T.DATETIME, b"2024-01-02 030405.1"),
        (T.TIMESTAMP, b"2024-01-02 03:04:05.1+01:00"),
        (T.TIME, b"123456"),
        (T.TIME, b"12:34:56,5"),
    ],
)
def test_iso_forms_mysql_never_sends_stay_errors(type_: int, text: bytes) -> None:
    with pytest.raises(ValueDecodeError, match=rf"\({T.Name(type_)}\): cannot decode"):
        RowDecoder([field(type_, name="when")]).decode(row(text))


# -- the unrolled row loop -----------------------------------------------------------------


def _reference_decode(fields: list[query_pb2.Field], r: query_pb2.Row) -> tuple[object, ...]:
    """The plain per-column loop, one value at a time."""
    out: list[object] = []
    pos = 0
    for f, length in zip(fields, r.lengths, strict=True):
        if length < 0:
            out.append(None)
            continue
        out.append(decode_value(f, r.values[pos : pos + length]))
        pos += length
    return tuple(out)


@pytest.mark.parametrize("columns", [0, 1, 2, 5, 17, 1017])
def test_row_loop_any_width_with_nulls_anywhere(columns: int) -> None:
    rnd = random.Random(columns)
    kinds: list[tuple[query_pb2.Field, Callable[[], bytes]]] = [
        (field(T.INT64), lambda: str(rnd.randint(-(2**63), 2**63 - 1)).encode()),
        (field(T.VARCHAR, charset=UTF8MB4_GENERAL_CI), lambda: ("é" * rnd.randint(0, 5) + "x").encode()),
        (
            field(T.VARBINARY, charset=BINARY),
            lambda: bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 4))),
        ),
        (field(T.DECIMAL), lambda: f"{rnd.randint(-999, 999)}.{rnd.randint(0, 99):02d}".encode()),
        (
            field(T.DATETIME),
            lambda: f"2024-01-{rnd.randint(1, 31):02d} 01:02:03.{rnd.randint(0, 999)}".encode(),
        ),
    ]
    chosen = [kinds[rnd.randrange(len(kinds))] for _ in range(columns)]
    fields = [f for f, _ in chosen]
    decoder = RowDecoder(fields, "wide")
    assert len(decoder.names) == columns
    for _ in range(20):
        data: list[bytes | None] = []
        for _f, make in chosen:
            value = make()
            data.append(None if rnd.random() < 0.3 else value)
        r = row(*data)
        assert decoder.decode(r) == _reference_decode(fields, r)
    assert decoder.decode(row(*([None] * columns))) == (None,) * columns


def test_decoders_of_same_width_stay_independent() -> None:
    # The compiled loop is shared per column count; each decoder binds its own converters.
    ints = RowDecoder([field(T.INT64, "a"), field(T.INT64, "b")])
    texts = RowDecoder([field(T.VARCHAR, "a", UTF8MB4_GENERAL_CI), field(T.VARBINARY, "b", BINARY)], "t")
    r = row(b"12", b"34")
    assert ints.decode(r) == (12, 34)
    assert texts.decode(r) == ("12", b"34")
    with pytest.raises(
        ValueDecodeError, match=r"table 't': row has 1 values but the table has 2 columns \['a', 'b'\]"
    ):
        texts.decode(row(b"1"))
