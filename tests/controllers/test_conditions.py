"""Status conditions (``controllers.conditions``): lastTransitionTime moves only with the status, the generation
comes from the object, malformed conditions are refused when set."""

from __future__ import annotations

import datetime

import pytest

from controllers import find_status_condition, is_status_condition_true, remove_status_condition, set_status_condition

T0 = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
T1 = T0 + datetime.timedelta(hours=1)


def test_a_new_condition_gets_the_time_and_the_objects_generation() -> None:
    obj: dict = {"metadata": {"name": "w", "generation": 4}}
    assert set_status_condition(obj, "Ready", "False", "Pending", "waiting for the ConfigMap", now=T0)
    assert obj["status"]["conditions"] == [{
        "type": "Ready", "status": "False", "reason": "Pending", "message": "waiting for the ConfigMap",
        "observedGeneration": 4, "lastTransitionTime": "2026-01-02T03:04:05Z"}]
    assert find_status_condition(obj, "Ready") is obj["status"]["conditions"][0]
    assert not is_status_condition_true(obj, "Ready") and find_status_condition(obj, "Synced") is None


def test_the_transition_time_moves_only_when_the_status_changes() -> None:
    obj: dict = {"metadata": {"generation": 1}}
    set_status_condition(obj, "Ready", "True", "Reconciled", "size is 2", now=T0)
    assert not set_status_condition(obj, "Ready", "True", "Reconciled", "size is 2", now=T1)  # nothing new
    obj["metadata"]["generation"] = 2
    assert set_status_condition(obj, "Ready", "True", "Resized", "size is 3", now=T1)
    ready = find_status_condition(obj, "Ready")
    assert ready is not None and (ready["reason"], ready["message"], ready["observedGeneration"],
                                  ready["lastTransitionTime"]) == ("Resized", "size is 3", 2, "2026-01-02T03:04:05Z")
    assert set_status_condition(obj, "Ready", "False", "Failed", "quota", now=T1)
    assert ready["lastTransitionTime"] == "2026-01-02T04:04:05Z" and not is_status_condition_true(obj, "Ready")


def test_other_conditions_are_kept_and_one_can_be_removed() -> None:
    obj: dict = {"status": {"observedGeneration": 1, "conditions": [
        {"type": "Synced", "status": "True", "reason": "Done", "message": "", "lastTransitionTime": "x"}]}}
    set_status_condition(obj, "Ready", "True", "Reconciled", now=T0, observed_generation=7)
    assert [c["type"] for c in obj["status"]["conditions"]] == ["Synced", "Ready"]
    assert find_status_condition(obj, "Ready")["observedGeneration"] == 7  # type: ignore[index]
    assert obj["status"]["observedGeneration"] == 1
    assert remove_status_condition(obj, "Synced") and not remove_status_condition(obj, "Synced")
    assert [c["type"] for c in obj["status"]["conditions"]] == ["Ready"]
    assert not remove_status_condition({}, "Ready") and find_status_condition({"status": None}, "Ready") is None


def test_a_condition_without_generation_or_time_gets_them() -> None:
    obj: dict = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Old"}]}}
    assert set_status_condition(obj, "Ready", "True", "Old", now=T0)
    assert obj["status"]["conditions"] == [{"type": "Ready", "status": "True", "reason": "Old", "message": "",
                                            "lastTransitionTime": "2026-01-02T03:04:05Z"}]


@pytest.mark.parametrize("args, message", [
    (("", "True", "Ok"), "a condition needs a non-empty type, got ''"),
    (("Ready", "true", "Ok"), "condition 'Ready': status must be one of True, False, Unknown, got 'true'"),
    (("Ready", "True", "not reconciled"), "condition 'Ready': reason must be a CamelCase word"),
    (("Ready", "True", ""), "condition 'Ready': reason must be a CamelCase word"),
])
def test_malformed_conditions_are_refused(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        set_status_condition({}, *args)


def test_a_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="now must be a timezone-aware datetime"):
        set_status_condition({}, "Ready", "True", "Ok", now=datetime.datetime(2026, 1, 1))
