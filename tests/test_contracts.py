"""The documented contracts match the code: protocol messages, environment names, events and their
fields, exit codes, job-state changes through the one table, scheduler names compared only in the
scheduler packages, plan.json read only through the typed record, report parts as dataclasses."""

from __future__ import annotations

import ast
import re

from codegraph import ROOT, _graph

from orchestrator.cli.exitcodes import REFUSED_STATES, STATE_EXIT_CODES
from orchestrator.core.states import JobState
from orchestrator.events import EVENT_KINDS, EVENT_TYPES
from worker_entry import protocol


def test_architecture_doc_lists_exactly_the_protocol_messages():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("### Messages", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M))
    defined = {f"{k}" for k in protocol.NODE_MESSAGES} | set(protocol.COMMANDS) | set(protocol.TRANSFER_MESSAGES)
    assert documented == defined, f"missing in the doc: {defined - documented}; not in the code: {documented - defined}"


def test_architecture_doc_lists_every_environment_name():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    names = {v for k, v in vars(protocol.Env).items() if k.isupper() and k != "PREFIX"}
    missing = {n for n in names if f"`{n}`" not in doc}
    assert not missing, f"environment names not documented in docs/architecture.md: {missing}"


def _documented_events() -> dict[str, tuple[str, ...]]:
    """docs/events.md's table: each kind with the fields its last column names (in backticks, outside
    parentheses: those explain a field or list its values)."""
    doc = (ROOT / "docs" / "events.md").read_text()
    table = doc.split("| event | when | fields |", 1)[1].split("\n\n", 1)[0]
    out: dict[str, tuple[str, ...]] = {}
    for row in (line for line in table.splitlines() if line.startswith("| `")):
        cells = [c.strip() for c in row.strip()[1:-1].split(" | ")]
        assert len(cells) == 3, f"a row of docs/events.md's table is not `event | when | fields`: {row}"
        (kind,) = re.findall(r"`([a-z_]+)`", cells[0])
        fields = cells[2]
        while re.search(r"\([^()]*\)", fields):
            fields = re.sub(r"\([^()]*\)", "", fields)
        assert kind not in out, f"{kind} is documented twice"
        out[kind] = tuple(re.findall(r"`([a-z_]+)`", fields))
    return out


def test_events_doc_lists_exactly_the_event_kinds_and_their_fields():
    documented = _documented_events()
    assert set(documented) == EVENT_KINDS, (EVENT_KINDS - set(documented), set(documented) - EVENT_KINDS)
    wrong = {
        kind: {"doc": fields, "code": EVENT_TYPES[kind].field_names()}
        for kind, fields in documented.items()
        if fields != EVENT_TYPES[kind].field_names()
    }
    assert not wrong, f"docs/events.md lists other fields (or another order) than the event classes: {wrong}"


def test_every_job_state_has_an_exit_code_or_is_refused_at_the_cli_edge():
    coded, refused = set(STATE_EXIT_CODES), set(REFUSED_STATES)
    assert not coded & refused, coded & refused
    assert coded | refused == set(JobState), set(JobState) - coded - refused
    assert {s for s in JobState if s.is_terminal} <= coded  # every outcome has its code
    assert all(not s.is_terminal for s in refused)  # only live phases are refused


#: Assignments to a ``.state`` that are no job state: the task table's own ``become``; goodput's strings.
_OTHER_STATES = {("orchestrator/supervise/session.py", "become"), ("orchestrator/views/goodput.py", "_attempts")}


def test_every_change_of_a_job_state_goes_through_the_table():
    """Outside a constructor (an initial value), ``X.state = ...`` is ``advance(X.state, new)`` (or a
    holder's ``become``, which is): no job state changes around ``JobState.can_become``."""
    bad = []
    for path in (ROOT / "orchestrator").rglob("*.py"):
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef) or func.name == "__init__":
                continue
            for node in ast.walk(func):
                if not isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
                if not any(isinstance(t, ast.Attribute) and t.attr == "state" for t in flat):
                    continue
                value = node.value
                through = (
                    isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "advance"
                )
                if not through and (rel, func.name) not in _OTHER_STATES:
                    bad.append(f"{rel}:{node.lineno} ({func.name})")
    assert not bad, f"job states assigned around the transition table (use become/advance): {bad}"


def test_no_tfcluster_environment_name_is_spelled_outside_the_protocol():
    """TFCLUSTER_* names live in worker_entry/protocol/env.py; code elsewhere uses the constants
    (the examples are written as a user would write a training script)."""
    allowed = {ROOT / "worker_entry" / "protocol" / "env.py", ROOT / "worker_entry" / "_site" / "sitecustomize.py"}
    bad = []
    for package in ("orchestrator", "worker_entry"):
        for path in (ROOT / package).rglob("*.py"):
            if path in allowed or "examples" in path.parts:  # examples are user code: plain names
                continue
            tree = ast.parse(path.read_text())
            bad += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"TFCLUSTER_[A-Z_]+", node.value)
            ]
    assert not bad, "spell these with worker_entry.protocol.Env:\n  " + "\n  ".join(bad)


def test_sitecustomize_reads_the_same_instrument_variable():
    text = (ROOT / "worker_entry" / "_site" / "sitecustomize.py").read_text()
    assert f'"{protocol.Env.INSTRUMENT}"' in text
    assert f'"{protocol.Env.TF_CONFIG_FILE}"' in text and f'"{protocol.Env.TF_CONFIG}"' in text


SCHEDULER_NAMES = frozenset({"ssh", "slurm", "kubernetes"})


def _compares_scheduler(node: ast.AST) -> bool:
    """``x.scheduler == ...``, ``plan["scheduler"] != ...``, ``... in ("slurm", ...)``, a literal scheduler
    name compared with anything, or a ``match`` on one: a decision that belongs to a scheduler package."""
    if isinstance(node, ast.Match):
        return any(
            isinstance(c.pattern, ast.MatchValue)
            and isinstance(c.pattern.value, ast.Constant)
            and c.pattern.value.value in SCHEDULER_NAMES
            for c in node.cases
        )
    if not isinstance(node, ast.Compare):
        return False
    sides = [node.left, *node.comparators]

    def names_scheduler(x: ast.AST) -> bool:
        if isinstance(x, ast.Attribute) and x.attr == "scheduler":
            return True
        if isinstance(x, ast.Constant) and x.value in SCHEDULER_NAMES:
            return True
        if isinstance(x, ast.Subscript) and isinstance(x.slice, ast.Constant) and x.slice.value == "scheduler":
            return True
        if isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and x.func.attr == "get":
            return any(isinstance(a, ast.Constant) and a.value == "scheduler" for a in x.args)
        if isinstance(x, ast.Tuple | ast.List | ast.Set):
            return any(isinstance(e, ast.Constant) and e.value in SCHEDULER_NAMES for e in x.elts)
        return False

    return any(names_scheduler(x) for x in sides)


def _scheduler_comparisons(paths) -> list[str]:
    bad = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        bad += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree) if _compares_scheduler(n)]
    return bad


def test_the_scheduler_is_compared_only_in_the_scheduler_packages():
    """What differs per scheduler is decided by its package (its ``Scheduler`` object, its spec section and
    rules), never by comparing its name elsewhere: not in the spec either (``spec.sections``)."""
    allowed = (ROOT / "orchestrator" / "schedulers",)
    paths = [p for p in (ROOT / "orchestrator").rglob("*.py") if not any(p.is_relative_to(a) for a in allowed)]
    bad = _scheduler_comparisons(paths)
    assert not bad, "scheduler names compared outside orchestrator/schedulers:\n  " + "\n  ".join(bad)


def test_the_scheduler_check_catches_every_form():
    forms = [
        'plan.scheduler == "ssh"',
        'spec.scheduler != "kubernetes"',
        '"slurm" == kind',
        'data["scheduler"] == x',
        'data.get("scheduler", "ssh") != x',
        'kind in ("slurm", "kubernetes")',
        'match kind:\n    case "slurm":\n        pass',
    ]
    for form in forms:
        tree = ast.parse(form + "\n")
        assert any(_compares_scheduler(n) for n in ast.walk(tree)), form
    assert not any(_compares_scheduler(n) for n in ast.walk(ast.parse('x = {"slurm": 1}\ny = plan.scheduler\n')))


def test_scheduler_packages_do_not_import_each_other():
    """A fourth scheduler is one more package: the packages share only ``schedulers.base`` and the
    stages below."""
    graph = _graph("orchestrator")
    packages = {"ssh", "slurm", "kubernetes"}
    bad = []
    for mod, deps in graph.items():
        parts = mod.split(".")
        if len(parts) < 3 or parts[1] != "schedulers" or parts[2] not in packages:
            continue
        for dep in deps:
            dp = dep.split(".")
            if len(dp) >= 3 and dp[1] == "schedulers" and dp[2] in packages and dp[2] != parts[2]:
                bad.append(f"{mod} imports {dep}")
    assert not bad, "\n".join(bad)


#: The plan record's own modules: the one writer and the one reader of RUN/plan.json (and where its path is).
PLAN_RECORD_MODULES = ("orchestrator/plan/record.py", "orchestrator/runs/planfile.py", "orchestrator/runs/rundir.py")
#: What a module may ask of plan.json's path without reading it: whether a directory is a run.
PATH_ONLY = frozenset({"exists", "is_file", "stat"})


def _raw_plan_reads(tree: ast.AST) -> list[int]:
    """Lines where a module touches plan.json other than to test that it exists: ``run.plan_json`` or
    the name ``"plan.json"`` anywhere but under ``.exists()``, ``.is_file()`` or ``.stat()``."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    bad = []
    for node in ast.walk(tree):
        names_it = (isinstance(node, ast.Attribute) and node.attr == "plan_json") or (
            isinstance(node, ast.Constant) and node.value == "plan.json"
        )
        if not names_it:
            continue
        up = parents.get(node)
        while isinstance(up, ast.BinOp) and isinstance(up.op, ast.Div):  # run / "plan.json"
            up = parents.get(up)
        if not (isinstance(up, ast.Attribute) and up.attr in PATH_ONLY and isinstance(parents.get(up), ast.Call)):
            bad.append(node.lineno)
    return bad


def test_plan_json_is_read_only_through_the_typed_record():
    """Every view and scheduler reads ``runs.read_plan``'s ``PlanRecord``, never the raw file's dict."""
    bad = []
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in PLAN_RECORD_MODULES:
            continue
        bad += [f"{rel}:{line}" for line in _raw_plan_reads(ast.parse(path.read_text(), rel))]
    assert not bad, "plan.json read outside the plan record (use runs.read_plan):\n  " + "\n  ".join(bad)


def test_the_plan_json_check_catches_every_raw_read():
    for form in (
        "plan = run.read_json(run.plan_json)",
        "data = json.loads(run.plan_json.read_text())",
        "data = json.loads((path / 'plan.json').read_text())",
        "with open(run.path / 'plan.json') as f: pass",
        "p = rd.plan_json",
    ):
        assert _raw_plan_reads(ast.parse(form)), form
    for fine in ("run.plan_json.exists()", "(d / 'plan.json').is_file()", "run.plan_json.stat().st_mtime"):
        assert not _raw_plan_reads(ast.parse(fine)), fine


#: The report's typed parts (``views.reportmodel.Report``): read by attribute, never as dicts.
REPORT_PARTS = {"split", "pace", "goodput", "loss", "noise_scale"}
PART_TYPES = {"JobSplit", "Pace", "ModelPace", "Goodput", "AttemptTime", "LossCurve", "LossPoint", "NoiseScale"}


def _part_indexing(tree: ast.AST) -> list[int]:
    """Lines that index a report part as a dict: ``rep.goodput["wall_s"]``, ``rep.split.get("step_ms")``,
    or, in a function taking a part (annotated with its type), ``g["wall_s"]`` / ``g.get("wall_s")``."""
    typed: set[str] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for a in fn.args.args + fn.args.kwonlyargs:
                text = ast.unparse(a.annotation) if a.annotation is not None else ""
                if any(re.search(rf"\b{t}\b", text) for t in PART_TYPES):
                    typed.add(a.arg)

    def is_part(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr in REPORT_PARTS) or (
            isinstance(node, ast.Name) and node.id in typed
        )

    bad = []
    for node in ast.walk(tree):
        by_key = (
            isinstance(node, ast.Subscript)
            and is_part(node.value)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        )
        by_get = (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and is_part(node.func.value)
        )
        if by_key or by_get:
            bad.append(node.lineno)
    return bad


def test_no_view_indexes_a_report_part_as_a_dict():
    """The split, pace, goodput, loss and noise scale are dataclasses: a view reads them by attribute
    (``to_dict`` is for ``report --json`` alone), so a renamed field fails at once, not as a silent None."""
    bad = []
    for path in sorted((ROOT / "orchestrator" / "views").glob("*.py")) + sorted(
        (ROOT / "orchestrator/cli").glob("*.py")
    ):
        rel = str(path.relative_to(ROOT))
        bad += [f"{rel}:{line}" for line in _part_indexing(ast.parse(path.read_text(), rel))]
    assert not bad, "a report part indexed as a dict (read it by attribute):\n  " + "\n  ".join(bad)


def test_the_report_parts_are_dataclasses_and_the_part_check_catches_each_form():
    import dataclasses
    import typing

    from orchestrator.views.reportmodel import Analysis, Report

    hints = typing.get_type_hints(Report) | {"split": typing.get_type_hints(Analysis)["split"]}
    for part in REPORT_PARTS:
        kinds = [t for t in typing.get_args(hints[part]) or (hints[part],) if t is not type(None)]
        assert kinds and all(dataclasses.is_dataclass(t) for t in kinds), (part, hints[part])
    for form in (
        "x = rep.goodput['wall_s']",
        "x = rep.analysis.split['step_ms']",
        "x = report.noise_scale.get('windows')",
        "def f(g: Goodput):\n    return g['wall_s']",
        "def f(p: 'Pace | None'):\n    return p.get('models')",
    ):
        assert _part_indexing(ast.parse(form)), form
    for fine in (
        "x = rep.goodput.wall_s",
        "x = sizes[0]['split']",
        "x = text.split(',')[0]",
        "def f(g: dict):\n    g['a']",
    ):
        assert not _part_indexing(ast.parse(fine)), fine
