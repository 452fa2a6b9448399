"""A job's YAML is read as its own platform reads it: YAML 1.1 for Kubernetes-style
jobs (yes is a boolean there), js-yaml 3 for OpenPAI's, whose rest-server reads job YAML
with it (yes is a word, 1e-4 a number). The js-yaml reading is checked against js-yaml
itself, the copy the OpenPAI JS SDK brings (make setup installs it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from trainyard_common.dialects import parse_job, parse_job_yaml, translate
from trainyard_common.dialects.openpai_v2 import js_number
from trainyard_common.parsing import parse_yaml
from trainyard_sdk.client import load_payload

JS_YAML = Path(__file__).resolve().parents[2] / "tools" / "js" / "node_modules" / "js-yaml"

# Plain scalars where YAML 1.1 and js-yaml 3 part ways, and some where they agree.
SCALARS = [
    "yes", "no", "on", "off", "y", "n", "True", "TRUE", "tRue", "1e-4", "1.0e3", "1e3",
    "12e", "0x1F", "0b101", "017", "08", "0o17", "1_000", "1_", "1:30", "-1:20", "1:30.5",
    ".5", "1.", "0.1_", "~", "Null", "nuLL", "-0", "+12", "3.25", "-.inf", "yes please", "=",
]  # fmt: skip


def document(scalars: list[str]) -> str:
    return "".join(f"k{i}: {text}\n" for i, text in enumerate(scalars)) + "empty:\nyes: key\n"


def test_js_yaml_reads_the_words_yaml_1_1_takes_for_booleans_as_words() -> None:
    text = "a: yes\nb: off\nc: True\nd: 1e-4\ne: 1.0e3\nf: 017\nyes: key\n"
    assert parse_yaml(text, js_yaml=True) == {
        "a": "yes", "b": "off", "c": True, "d": 0.0001, "e": 1000.0, "f": 15, "yes": "key",
    }  # fmt: skip
    assert parse_yaml(text) == {
        "a": True, "b": False, "c": True, "d": "1e-4", "e": "1.0e3", "f": 15, "true": "key",
    }  # fmt: skip


@pytest.mark.skipif(
    shutil.which("node") is None or not JS_YAML.exists(),
    reason="node or js-yaml is missing (make setup installs tools/js)",
)
def test_the_js_yaml_reading_is_js_yamls() -> None:
    finite = [s for s in SCALARS if "inf" not in s]  # JSON holds no Infinity
    text = document(finite)
    script = (
        f"const y = require({json.dumps(str(JS_YAML))});"
        "let t = ''; process.stdin.on('data', d => t += d);"
        "process.stdin.on('end', () => console.log(JSON.stringify(y.safeLoad(t))));"
    )
    done = subprocess.run(
        ["node", "-e", script], input=text, capture_output=True, text=True, timeout=60, check=True
    )
    theirs = json.loads(done.stdout)
    ours = parse_yaml(text, js_yaml=True)
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        mine = ours[key]
        # JavaScript has one number type: 1000 and 1000.0 are the same number there.
        assert mine == value and isinstance(mine, bool) == isinstance(value, bool), (key, mine)
        assert isinstance(mine, str) == isinstance(value, str), (key, mine, value)


OPENPAI_V2 = """\
protocolVersion: 2
name: amp
type: job
parameters:
  amp: yes
  lr: 1e-4
prerequisites:
  - {name: img, type: dockerimage, uri: python:3.11}
taskRoles:
  train:
    instances: 1
    dockerImage: img
    resourcePerInstance: {cpu: 1, memoryMB: 1024, gpu: 0}
    commands:
      - python train.py --amp <% $parameters.amp %> --lr <% $parameters.lr %>
"""


def test_an_openpai_job_in_yaml_is_read_as_openpai_reads_it_wherever_it_comes_in(
    tmp_path: Path,
) -> None:
    """OpenPAI renders --amp yes --lr 0.0001 (js-yaml, then JavaScript's numbers)."""
    for payload in (
        parse_job_yaml(OPENPAI_V2),
        parse_job(OPENPAI_V2, "text/yaml"),
        parse_job(OPENPAI_V2, None),  # a bus message: JSON, else YAML
        load_payload(tmp_path / "job.yaml", OPENPAI_V2),  # yard submit job.yaml
    ):
        [role] = translate(payload, user="u").spec.roles
        assert role.command == "python train.py --amp yes --lr 0.0001"
    # A Kubernetes-style job stays YAML 1.1, as the API server reads it.
    kube = "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: x}\nspec: {a: yes}\n"
    assert parse_job_yaml(kube)["spec"] == {"a": True}


NUMBERS = [1e-5, 1e-7, 1e-4, 1e21, 1.5e21, 1e16, 123.456, -0.5, 1000.0, 2.5e-7, 1e20,
           0.1 + 0.2, 5e-324, 1.7976931348623157e308, 100.0, -1e-6, 0.0]  # fmt: skip


def test_a_number_renders_as_javascript_writes_it() -> None:
    """What OpenPAI writes for <% $parameters.lr %> (String(value))."""
    assert [js_number(v) for v in (1e-5, 1e-7, 1e21, 1e16, 1000.0, 2.5e-7)] == [
        "0.00001", "1e-7", "1e+21", "10000000000000000", "1000", "2.5e-7",
    ]  # fmt: skip


@pytest.mark.skipif(shutil.which("node") is None, reason="node is missing (make setup has it)")
def test_numbers_render_as_node_writes_them() -> None:
    script = f"for (const v of {json.dumps(NUMBERS)}) console.log(String(v))"
    done = subprocess.run(
        ["node", "-e", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert [js_number(v) for v in NUMBERS] == done.stdout.split()


def test_a_boolean_written_as_a_yaml_1_1_word_is_refused_saying_why() -> None:
    """js-yaml reads extras.gangAllocation: no as the word "no" (OpenPAI then gangs the
    job, as it gangs any value but false): refused here, saying what to write."""
    text = OPENPAI_V2 + "extras:\n  gangAllocation: no\n"
    [error] = translate(parse_job_yaml(text), user="u").errors
    assert error.path == "$.extras.gangAllocation" and "write true or false" in error.message
    assert translate(parse_job_yaml(text.replace(": no", ": false")), user="u").errors == []


def test_a_forced_dialect_picks_the_reading() -> None:
    """/v1/jobs?dialect=openpai_v2: read as OpenPAI reads it, without detecting."""
    assert parse_job(OPENPAI_V2, "text/yaml", dialect="openpai_v2")["parameters"]["amp"] == "yes"
    assert parse_job(OPENPAI_V2, "text/yaml", dialect="native")["parameters"]["amp"] is True


def test_integers_past_javascripts_exact_ones_render_as_its_doubles() -> None:
    from trainyard_common.dialects.openpai_v2 import render

    text, _ = render(
        "<% $parameters.a %> <% $parameters.b %> <% $parameters.c %>",
        {"$parameters": {"a": 10**21, "b": 12345678901234567891, "c": 2**53 - 1}},
    )
    assert text == "1e+21 12345678901234567000 9007199254740991"
