"""Times a user gives that have no time in UTC (a year-1 time east of it, a year-9999
time west of it): every store converts to UTC to compare, and Python's conversion
raised OverflowError, a 500 on the job lists (found by an input audit). Each is a 400
naming its parameter now."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest
from fastapi import HTTPException

from trainyard_common.dialects import dlc
from trainyard_common.limits import in_utc
from trainyard_status.app import list_filters, make_cursor, read_cursor

EARLY_EAST = "0001-01-01T00:00:00+23:59"
LATE_WEST = "9999-12-31T23:59:59-23:59"


def test_a_time_in_utc_or_refused() -> None:
    assert in_utc(datetime(2026, 1, 1, 12)) == datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert in_utc(datetime.fromisoformat("2026-01-01T13:00:00+01:00")) == datetime(
        2026, 1, 1, 12, tzinfo=UTC
    )
    for text in (EARLY_EAST, LATE_WEST):
        with pytest.raises(ValueError, match="out of range in UTC"):
            in_utc(datetime.fromisoformat(text))


@pytest.mark.parametrize(("param", "text"), [("submitted_after", EARLY_EAST),
                                             ("submitted_before", LATE_WEST)])  # fmt: skip
def test_the_lists_time_filters_name_a_time_out_of_range(param: str, text: str) -> None:
    when = datetime.fromisoformat(text)
    after, before = (when, None) if param == "submitted_after" else (None, when)
    with pytest.raises(HTTPException) as refused:
        list_filters(None, None, None, after, before)
    assert refused.value.status_code == 400
    assert str(refused.value.detail).startswith(f"{param}: ")
    # In range, whatever its zone, the filter is in UTC.
    where = list_filters(None, None, None, datetime.fromisoformat("2026-01-01T13:00+01:00"), None)
    assert where["submitted_at"]["$gte"] == datetime(2026, 1, 1, 12, tzinfo=UTC)


def test_a_cursor_out_of_range_is_not_a_cursor_this_api_gave() -> None:
    forged = base64.urlsafe_b64encode(json.dumps([EARLY_EAST, "x"]).encode()).decode()
    with pytest.raises(HTTPException) as refused:
        read_cursor(forged)
    assert refused.value.status_code == 400 and "cursor" in str(refused.value.detail)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    assert read_cursor(make_cursor(at, "job")) == (at, "job")


@pytest.mark.parametrize(("param", "text"), [("StartTime", EARLY_EAST), ("EndTime", LATE_WEST)])
def test_dlcs_list_times_name_a_time_out_of_range(param: str, text: str) -> None:
    with pytest.raises(dlc.ListJobsError) as refused:
        dlc.list_query({param: text}, user="alice", admin=True, now=datetime.now(UTC))
    assert refused.value.field == param
