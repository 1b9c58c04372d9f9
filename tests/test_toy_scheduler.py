"""A scheduler is one package (issue 29.5): ``tests/toysched`` registers a fourth scheduler, and the core —
which names none — validates its section (fields, rules, roles) with FILE:LINE: field: message, plans it,
shows and records the plan, offers its schema and its command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import toysched

from orchestrator.cli.main import main
from orchestrator.plan.record import PlanRecord
from orchestrator.schedulers import load_plan, scheduler_named
from orchestrator.spec import load_spec_text
from orchestrator.spec.sections import register, sections, unregister

REPO = Path(__file__).resolve().parent.parent
SPEC = """\
version: 1
name: toyjob
scheduler: toy
toy:
  machines: [m1, m2, m3]
  gpus: 1
job:
  command: [python3, train.py]
"""


@pytest.fixture()
def toy():
    register(toysched.SECTION)
    try:
        yield
    finally:
        unregister("toy")


def _spec(tmp_path: Path, text: str) -> str:
    path = tmp_path / "toy.yaml"
    path.write_text(text)
    return str(path)


def test_the_core_names_no_scheduler_and_the_toy_is_not_built_in():
    """Nothing under orchestrator/ or worker_entry/ knows the toy: registering it is all it takes."""
    for root in ("orchestrator", "worker_entry"):
        for path in (REPO / root).rglob("*.py"):
            assert not re.search(r"\btoy\b", path.read_text()), path
    assert "toy" not in sections()


def test_a_toy_spec_validates_plans_and_is_recorded(toy, tmp_path, capsys):
    spec = _spec(tmp_path, SPEC)
    assert main(["validate", spec]) == 0
    loaded, plan = load_plan(spec, "toy-1")
    assert loaded.spec.toy.machines == ["m1", "m2", "m3"] and loaded.spec.hosts is None
    assert [str(n.task) for n in plan.nodes] == ["worker:0", "worker:1", "worker:2"]
    assert plan.scheduler == "toy" and plan.nodes[2].tf_config["cluster"] == {
        "worker": ["m1:7000", "m2:7000", "m3:7000"]
    }
    assert plan.nodes[0].argv[-1] == "toy" and plan.nodes[1].env["TFCLUSTER_NUM_GPUS"] == "1"
    record = PlanRecord.from_dict(json.loads(PlanRecord.from_plan(plan).to_json()))
    assert record.scheduler == "toy" and record.extras == {"machines": 3} and len(record.tasks) == 3
    capsys.readouterr()
    assert main(["plan", spec, "--run-id", "toy-1"]) == 0
    text = capsys.readouterr().out
    assert "scheduler toy" in text and "started by: the toy" in text and "worker:2  m3" in text
    assert main(["plan", spec, "--json", "--run-id", "toy-1"]) == 0
    assert json.loads(capsys.readouterr().out)["toy"] == {"machines": 3}  # its plan extras, under its name
    assert scheduler_named("toy").name == "toy"


def test_a_mistake_in_the_toy_section_is_reported_at_its_file_line_and_field(toy, tmp_path, capsys):
    bad = SPEC.replace("[m1, m2, m3]", "[m1, m2, m1]").replace("gpus: 1", "gpus: -1\n  colour: red")
    spec = _spec(tmp_path, bad + "hosts: [{address: a}]\n")
    assert main(["validate", spec]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:5: toy.machines[2]: m1 is already machines[0]: the toy runs one task per machine" in err  # its rule
    assert f"{spec}:6: toy.gpus: must be greater than or equal to 0" in err  # its field
    assert f"{spec}:7: toy.colour: unknown field" in err
    assert f"{spec}:10: hosts: not used with scheduler: toy (it uses toy:); remove it, or set scheduler: ssh" in err
    ps = SPEC + "tensorflow: {strategy: parameter_server}\n"
    assert main(["validate", _spec(tmp_path, ps)]) == 2
    assert "parameter_server needs toy.roles: one chief, at least one worker and one ps" in capsys.readouterr().err
    missing = "version: 1\nname: t\nscheduler: toy\njob: {command: [x]}\n"
    assert main(["validate", _spec(tmp_path, missing)]) == 2
    assert ":1: toy: required with scheduler: toy: a toy: section (at least machines)" in capsys.readouterr().err


def test_the_schema_and_the_cli_offer_what_the_toy_registers(toy, capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "toy" in schema["properties"]["scheduler"]["enum"] and "ToySpec" in schema["$defs"]
    assert {
        "if": {"properties": {"scheduler": {"const": "toy"}}, "required": ["scheduler"]},
        "then": {"required": ["toy"]},
    } in schema["allOf"]
    assert main(["toy-hello", "world"]) == 0
    assert capsys.readouterr().out == "toy says hello to world\n"


def test_without_the_toy_its_spec_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(Exception, match="scheduler"):
        load_spec_text(SPEC, "toy.yaml")
    assert main(["validate", _spec(tmp_path, SPEC)]) == 2
    assert ":3: scheduler: must be 'ssh', 'kubernetes' or 'slurm'" in capsys.readouterr().err
