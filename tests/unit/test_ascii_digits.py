"""Numbers read from paths, queries and patches are ASCII digits: ``str.isdigit`` also
takes "²" and other digits ``int`` refuses, which made a 500 of a pod name, a PodUid, a
resourceVersion or a JSON-Patch index (found by fuzzing the running platform). And not
too many of them: ``int`` refuses more than 4300 digits."""

from __future__ import annotations

import pytest

from trainyard_common.dialects import dlc, k8s_api, openpai_v2
from trainyard_common.limits import MAX_DIGITS, digits
from trainyard_launcher.taskexec import ExecRefused, exec_argv

BIG = "9" * 5000  # int() refuses it: ValueError


@pytest.mark.parametrize("text", ["²", "1²", "٣", "１", "", "-1", " 1", BIG, "1" * 19])
def test_other_digits_are_not_numbers(text: str) -> None:
    assert not digits(text)


def test_ascii_digits_are() -> None:
    assert digits("0") and digits("0123456789") and digits("9" * MAX_DIGITS)


def test_pod_names_and_ids_with_other_digits_are_none_of_ours() -> None:
    assert k8s_api.parse_pod_name("job-master-²") is None
    assert k8s_api.parse_pod_name("job-master-3") == ("job", "master", 3)
    assert dlc.parse_pod_id("j1", "j1-worker-²") is None
    assert dlc.parse_pod_id("j1", "j1-worker-2") == ("worker", 2)


@pytest.mark.parametrize("index", ["²", BIG])
@pytest.mark.parametrize("op", ["test", "add", "replace", "remove"])
def test_a_patch_path_with_other_digits_is_a_patch_error(op: str, index: str) -> None:
    target = {"spec": {"x": [1, 2]}}
    with pytest.raises(k8s_api.PatchError):
        k8s_api.json_patch(target, [{"op": op, "path": f"/spec/x/{index}", "value": 1}])
    with pytest.raises(k8s_api.PatchError):  # on the way there
        k8s_api.json_patch({"x": [{}]}, [{"op": op, "path": f"/x/{index}/y", "value": 1}])


def test_an_openpai_template_index_too_long_for_int_is_left_unrendered() -> None:
    ref = "$data.uri[" + BIG + "]"
    assert openpai_v2.render(f"<% {ref} %>", {"data": {"uri": ["a"]}}) == (f"<% {ref} %>", [ref])


@pytest.mark.parametrize("command", [["echo", "a\x00b"], "echo a\x00b"])
def test_an_exec_command_with_a_nul_is_refused_naming_it(command: list[str] | str) -> None:
    with pytest.raises(ExecRefused) as refused:
        exec_argv(command)
    assert refused.value.status == 422 and "NUL" in refused.value.detail
