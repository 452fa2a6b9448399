"""Each service's settings come from one typed class read at start; a bad value stops
the service with a message naming the variable, instead of a bare int() traceback or a
silently ignored typo."""

from __future__ import annotations

import pytest

from trainyard_common.config import SettingError, choice_setting, number_setting
from trainyard_gateway.settings import GatewaySettings
from trainyard_launcher.settings import LauncherSettings
from trainyard_placement.domain import UnknownPolicy, UnknownSetting
from trainyard_placement.settings import PlacementSettings


def test_numbers_are_checked_and_named() -> None:
    assert number_setting({}, "X", 2.5) == 2.5
    assert number_setting({"X": ""}, "X", 2.5) == 2.5
    assert number_setting({"X": " 7 "}, "X", 1, whole=True) == 7
    for raw, words in [
        ("abc", "not a number"),
        ("nan", "not a finite number"),
        ("inf", "not a finite number"),
        ("-1", "must be at least 0"),
    ]:
        with pytest.raises(SettingError, match=f"^X={raw!r}: {words}"):
            number_setting({"X": raw}, "X", 1)
    with pytest.raises(SettingError, match="not a whole number"):
        number_setting({"X": "1.5"}, "X", 1, whole=True)
    with pytest.raises(SettingError, match="must be above 0"):
        number_setting({"X": "0"}, "X", 1, above=True)


def test_choices_are_checked_and_named() -> None:
    assert choice_setting({"M": " ON "}, "M", "auto", ("auto", "on")) == "on"
    with pytest.raises(SettingError, match="^M='maybe': must be one of auto, on$"):
        choice_setting({"M": "maybe"}, "M", "auto", ("auto", "on"))


def test_launcher_settings() -> None:
    assert LauncherSettings.from_env({}) == LauncherSettings()
    read = LauncherSettings.from_env(
        {
            "YARD_LAUNCHER": "kubernetes",
            "YARD_LOG_MAX_BYTES": "0",
            "YARD_PIP_ARGS": "--index-url 'http://mirror/simple' -q",
            "YARD_TASK_ISOLATION": "off",
            "YARD_LAUNCHER_MINUTE_S": "0.5",
            "YARD_START_DEADLINE_S": "0",
        }
    )
    assert read.backend == "kubernetes" and read.task_isolation == "off"
    assert read.log_max_bytes == 0 and read.start_deadline_s == 0
    assert read.pip_args == ("--index-url", "http://mirror/simple", "-q")
    assert read.minute_s == 0.5
    for name, raw in [
        ("YARD_LAUNCHER", "docker"),
        ("YARD_TASK_ISOLATION", "maybe"),
        ("YARD_LOG_MAX_BYTES", "64M"),
        ("YARD_TASK_UID_BASE", "0"),  # a system uid: never a task's
        ("YARD_LAUNCHER_MINUTE_S", "0"),
        ("YARD_LAUNCHER_KILL_GRACE_S", "-1"),
        ("YARD_PIP_ARGS", "'unclosed"),
    ]:
        with pytest.raises(SettingError, match=f"^{name}"):
            LauncherSettings.from_env({name: raw})


def test_placement_settings() -> None:
    default = PlacementSettings.from_env({})
    assert default.lease_ttl_s == 5.0 and default.rules.backfill
    read = PlacementSettings.from_env(
        {
            "YARD_PLACEMENT_POLICY": "Best-Fit",
            "YARD_PLACEMENT_PREEMPTION": "off",
            "YARD_PLACEMENT_LEASE_TTL_S": "2",
        }
    )
    assert read.policy == "best-fit" and read.rules.victims is None and read.lease_ttl_s == 2
    with pytest.raises(UnknownPolicy):
        PlacementSettings.from_env({"YARD_PLACEMENT_POLICY": "spread"})
    with pytest.raises(UnknownSetting):
        PlacementSettings.from_env({"YARD_PLACEMENT_BACKFILL": "eager"})
    with pytest.raises(SettingError, match="^YARD_PLACEMENT_LEASE_TTL_S='0': must be above 0"):
        PlacementSettings.from_env({"YARD_PLACEMENT_LEASE_TTL_S": "0"})


def test_gateway_settings() -> None:
    default = GatewaySettings.from_env({})
    assert default.backends["intake"] == ("http://127.0.0.1:8081",)
    read = GatewaySettings.from_env(
        {"YARD_STATUS_URL": "http://status.trainyard.svc:8082/", "YARD_INTAKE_PORT": "9001"}
    )
    assert read.backends["status"] == ("http://status.trainyard.svc:8082",)
    assert read.backends["intake"] == ("http://127.0.0.1:9001",)
    replicas = GatewaySettings.from_env({"YARD_STATUS_URL": "http://a:1, http://b:2/"})
    assert replicas.backends["status"] == ("http://a:1", "http://b:2")
    with pytest.raises(SettingError, match="^YARD_STATUS_URL='b:2': not an http"):
        GatewaySettings.from_env({"YARD_STATUS_URL": "http://a:1,b:2"})
    with pytest.raises(SettingError, match="^YARD_STATUS_URL='status:8082': not an http"):
        GatewaySettings.from_env({"YARD_STATUS_URL": "status:8082"})
    with pytest.raises(SettingError, match="^YARD_LAUNCHER_PORT='0'"):
        GatewaySettings.from_env({"YARD_LAUNCHER_PORT": "0"})
