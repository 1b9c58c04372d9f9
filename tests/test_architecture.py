"""The layout is the architecture: layers only import downwards, no import cycles, small modules, and
the node agent and the instrumentation stay apart."""

from __future__ import annotations

import pytest
from codegraph import ROOT, _cycles, _graph, _imports, _modules, _packages

ORCHESTRATOR_LAYERS = [
    ["core"],
    ["spec"],
    ["plan"],
    ["backends"],
    ["runs"],
    ["events"],
    ["supervise"],
    ["sinks"],
    ["transfer"],
    ["job", "views"],
    ["schedulers"],
    ["cli"],
    ["__main__"],
]
#: worker_entry, lowest first: the protocol at the bottom; the agent and the instrumentation side by side
#: (a sideways import between them fails: they run in different processes under different rules); the
#: checks may use the instrumentation's strategy; ``progress`` re-exports the public calls; the entry
#: points and examples on top.
WORKER_ENTRY_LAYERS = [
    ["protocol"],
    ["agent", "instrument"],
    ["check", "progress"],
    ["examples", "_site"],
    ["__main__"],
]
MAX_LINES = 420


def _stage(package: str, module: str, layers: list[list[str]]) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None  # the package's own __init__/__main__ entry
    for rank, names in enumerate(layers):
        if parts[1] in names:
            return rank
    raise AssertionError(f"{module}: not in any layer of {package}; add it to the layer list in this test")


def _upward(graph: dict[str, set[str]], package: str, layers: list[list[str]]) -> list[str]:
    bad = []
    for mod, deps in graph.items():
        mine = _stage(package, mod, layers)
        if mine is None:
            continue
        for dep in deps:
            if not dep.startswith(package + "."):
                continue
            theirs = _stage(package, dep, layers)
            same_subpackage = dep.split(".")[1] == mod.split(".")[1]
            if theirs is not None and (theirs > mine or (theirs == mine and not same_subpackage)):
                bad.append(f"{mod} (stage {mine}) imports {dep} (stage {theirs})")
    return sorted(bad)


@pytest.mark.parametrize(
    ("package", "layers"), [("orchestrator", ORCHESTRATOR_LAYERS), ("worker_entry", WORKER_ENTRY_LAYERS)]
)
def test_no_upward_imports(package, layers):
    bad = _upward(_graph(package), package, layers)
    assert not bad, "upward or sideways imports:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("package", ["orchestrator", "worker_entry", "tfcluster_testbed"])
def test_no_import_cycles(package):
    pkgs = _packages(package)
    # A package's __init__ re-exports its own modules: that is not a dependency edge.
    graph = {
        m: {d for d in deps if d.startswith(package) and d not in pkgs and not m.startswith(d + ".")}
        for m, deps in _graph(package).items()
    }
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n  " + "\n  ".join(cycles)


def test_the_checks_catch_an_upward_import_and_a_cycle():
    graph = {
        "orchestrator.core.text": {"orchestrator.cli.main"},
        "orchestrator.cli.main": {"orchestrator.core.text"},
        "orchestrator.job.job": {"orchestrator.views.report"},
    }
    bad = _upward(graph, "orchestrator", ORCHESTRATOR_LAYERS)
    assert bad == [
        "orchestrator.core.text (stage 0) imports orchestrator.cli.main (stage 11)",
        "orchestrator.job.job (stage 9) imports orchestrator.views.report (stage 9)",
    ]
    assert _cycles(graph) == ["orchestrator.cli.main -> orchestrator.core.text -> orchestrator.cli.main"]
    imports = _imports("orchestrator.core.text", ROOT / "orchestrator" / "core" / "text.py")
    assert imports == {"__future__", "__future__.annotations"}


@pytest.mark.parametrize("package", ["orchestrator", "worker_entry", "tfcluster_testbed", "tests", "bench"])
def test_no_module_is_too_long(package):
    """The product's modules, and the tests' and benchmarks' too: one subject a module."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / package).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


#: What the node agent must never import: it runs under the node's system rules (stdlib, no TensorFlow),
#: and the instrumentation runs in another process (the user's interpreter).
AGENT_FORBIDDEN = ("tensorflow", "keras", "tf_keras", "tensorboard", "worker_entry.instrument")
INSTRUMENT_FORBIDDEN = ("worker_entry.agent",)


def _node_side_violations(imports: dict[str, set[str]]) -> list[str]:
    """``imports``: module → every module it imports (raw, also inside functions)."""
    bad = []
    for mod, deps in imports.items():
        if mod.startswith("worker_entry.agent"):
            forbidden = AGENT_FORBIDDEN
        elif mod.startswith("worker_entry.instrument"):
            forbidden = INSTRUMENT_FORBIDDEN
        else:
            continue
        bad += [f"{mod} imports {d}" for d in sorted(deps) if any(d == f or d.startswith(f + ".") for f in forbidden)]
    return bad


def test_the_agent_and_the_instrumentation_stay_apart():
    """The agent never imports TensorFlow or the instrumentation; the instrumentation never the agent."""
    raw = {name: _imports(name, path) for name, path in _modules("worker_entry").items()}
    assert any(m.startswith("worker_entry.agent.") for m in raw) and any(
        m.startswith("worker_entry.instrument.") for m in raw
    )
    bad = _node_side_violations(raw)
    assert not bad, "\n".join(bad)


def test_the_node_side_check_catches_each_violation():
    imports = {
        "worker_entry.agent.runner": {"tensorflow", "os"},
        "worker_entry.agent.modes.slurm": {"worker_entry.instrument.progress"},
        "worker_entry.instrument.hooks": {"worker_entry.agent.writer", "worker_entry.protocol.env"},
        "worker_entry.check.main": {"tensorflow"},
    }
    assert _node_side_violations(imports) == [
        "worker_entry.agent.runner imports tensorflow",
        "worker_entry.agent.modes.slurm imports worker_entry.instrument.progress",
        "worker_entry.instrument.hooks imports worker_entry.agent.writer",
    ]
