"""The Grafana dashboard shipped in docs/grafana/tfcluster.json: importable structure, and every metric
its panels (and template variables) query exists in a real scrape of a running job's /metrics."""

from __future__ import annotations

import json
import re

import pytest
from conftest import REPO

DASHBOARD = REPO / "docs" / "grafana" / "tfcluster.json"
#: PromQL words that are not metric names (functions are told by the "(" after them)
KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
}
#: metrics without a sample on this machine (no GPU; a detection latency needs a lost/hung worker, the last
#: loss to training again a failure): declared only
NO_SAMPLE_HERE = re.compile(
    r"^tfcluster_task_gpu_|^tfcluster_job_detection_latency_seconds$|^tfcluster_job_last_loss_to_training_seconds$"
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside strings, label matchers,
    grouping label lists and range/offset brackets, that are not functions or keywords."""
    e = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)  # label lists
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges, subqueries
    e = re.sub(r"(?<![A-Za-z0-9_:])\d[\d.e+]*(?:ms|[smhdwy])*", " ", e)  # numbers and durations (offset 5m)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word, rest = m.group(0), e[m.end() :].lstrip()
        if rest.startswith("(") or word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def test_metric_names_are_parsed_out_of_promql():
    assert metric_names('sum by (state) (tfcluster_job_tasks{job=~"$job", state!="x"})') == {"tfcluster_job_tasks"}
    assert metric_names('rate(a_total{x="b{c}"}[5m]) / on (task) group_left(host) b_info > 0 and c') == {
        "a_total",
        "b_info",
        "c",
    }
    assert metric_names("tfcluster_a / tfcluster_b > 0.5 offset 5m") == {"tfcluster_a", "tfcluster_b"}


def queries(dash: dict) -> list[tuple[str, str]]:
    """(panel title, expression) of every target, nested rows included, and of the template variables."""
    out = []

    def walk(panels: list[dict]) -> None:
        for p in panels:
            for t in p.get("targets") or []:
                out.append((p["title"], t["expr"]))
            walk(p.get("panels") or [])

    walk(dash["panels"])
    for var in dash["templating"]["list"]:
        q = var["query"]["query"]
        inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", q)
        out.append((f"variable {var['name']}", inner.group(1) if inner else q))
    return out


def dashboard_metrics() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for title, expr in queries(json.loads(DASHBOARD.read_text())):
        for name in metric_names(expr):
            used.setdefault(name, set()).add(title)
    return used


def test_the_dashboard_is_an_importable_grafana_model():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] == "tfcluster" and dash["schemaVersion"] >= 36
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"] and dash["__inputs"][0][
        "pluginId"
    ] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in dash["panels"]}
    for want in (
        "State",
        "Tasks by state",
        "Examples/s per worker",
        "Steps/s per worker",
        "Restarts",
        "Straggler scores: relative",
        "GPU utilisation",
        "GPU temperature",
    ):
        assert want in titles, want
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}" and p["description"], p["title"]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        assert [t["refId"] for t in p["targets"]] == [chr(65 + i) for i in range(len(p["targets"]))], p["title"]
    used = dashboard_metrics()
    assert all(name.startswith("tfcluster_") for name in used), sorted(used)


def dashboard_missing(samples: set[str]) -> set[str]:
    """The metrics the dashboard queries that have no sample among ``samples`` (but those no CPU job has)."""
    return {n for n in dashboard_metrics() if n not in samples and not NO_SAMPLE_HERE.match(n)}


def scrape_names(url: str) -> tuple[set[str], set[str]]:
    """(metric family names, sample names) of one scrape of ``url``."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as r:
        text = list(text_string_to_metric_families(r.read().decode()))
    return {f.name for f in text}, {s.name for f in text for s in f.samples}


@pytest.mark.e2e
def test_every_metric_the_dashboard_queries_is_in_a_real_scrape(keras_scraped_run):
    """keras_synthetic on 3 workers of the loopback bed (``shared_runs.keras_scraped_run``, the run
    test_metrics and test_tensorboard assert on too), /metrics scraped while it trains until every
    metric the dashboard queries has had a sample: each one is served, with a sample where a CPU job
    has one."""
    assert keras_scraped_run.launched.rc == 0, keras_scraped_run.launched.stderr[-2000:]
    used = dashboard_metrics()
    missing = dashboard_missing(set(keras_scraped_run.samples))
    assert not missing, f"panels query metrics with no sample in a real training job: {sorted(missing)}"
    names = keras_scraped_run.families | keras_scraped_run.samples
    undeclared = {n: sorted(t) for n, t in used.items() if n not in names}
    assert not undeclared, f"panels query metrics the launcher does not serve: {undeclared}"
