"""The load generator parses each rank's NodeConfig as a node does, the shared cluster once (``ConfigCache``).

One generator process plays every node of a 4,096-task start: parsing 4,096 configs that each carry the
same 70 KB cluster was ~4 s of its CPU under the GIL, beside the dials. The cache must give exactly what
``NodeConfig.parse_line`` gives for every rank, still validate every other field, and never serve a
cluster whose bytes differ.
"""

from __future__ import annotations

import pytest
from loadfleet import load_plan

from tfcluster_testbed.loadgen.loop import ConfigCache
from worker_entry import protocol as p


@pytest.fixture(scope="module")
def lines() -> list[bytes]:
    _, plan = load_plan(64, profile_s=5)
    return [p.command_line(node.node_config(0)) for node in plan.nodes]


def test_every_rank_gets_what_parse_line_gives_with_one_cluster_object(lines):
    cache = ConfigCache()
    got = [cache.parse(line) for line in lines]
    assert got == [p.NodeConfig.parse_line(line) for line in lines]
    assert len(got[0].cluster["worker"]) == 64
    assert all(c.cluster is got[0].cluster for c in got)  # parsed once, shared
    assert [c.task.index for c in got] == list(range(64))


def test_a_different_cluster_is_parsed_and_a_bad_field_still_refused(lines):
    cache = ConfigCache()
    cache.parse(lines[0])
    other = lines[1].replace(b'"node1:', b'"elsewhere:', 1)
    assert other != lines[1]
    assert cache.parse(other) == p.NodeConfig.parse_line(other)
    assert cache.parse(other).cluster != cache.parse(lines[1]).cluster
    bad = lines[2].replace(b'"heartbeat_interval_s":1.0', b'"heartbeat_interval_s":-5', 1)
    assert bad != lines[2]
    with pytest.raises(ValueError):
        cache.parse(bad)
