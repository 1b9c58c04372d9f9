"""runs.jsonl: a .jsonl file read a block of lines per decoder call gives exactly the objects the
line-by-line reading gives, on intact files and on every kind of damage a crash or a hand edit leaves."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

from orchestrator.runs import read_jsonl
from orchestrator.runs.jsonl import objects, per_line

RECORDED = Path(__file__).parent / "data" / "recorded_run" / "heartbeats.jsonl"


def _damage(lines: list[bytes], rng: random.Random) -> bytes:
    out = list(lines)
    for _ in range(rng.randint(0, 6)):
        i = rng.randrange(len(out))
        cut = rng.randrange(len(out[i]))
        out[i] = rng.choice(
            [
                out[i][:cut] + b"\n",  # torn mid-record
                out[i][:cut],  # torn, the next record glued on
                b"\n",  # blank
                b"  \r\n",  # whitespace only
                b"[1, 2]\n",  # not an object
                b'"text"\n',
                b"\xff\xfe" + out[i],  # not UTF-8
                b"\xef\xbb\xbf" + out[i],  # a BOM mid-file
                b'{"a": 1}, {"b": 2}\n',  # two values on a line
                b"[" * 5000 + b"\n",  # too deep for the parser
            ]
        )
    data = b"".join(out)
    return data.rstrip(b"\n") if rng.random() < 0.3 else data  # a last line without its newline


@pytest.mark.parametrize("seed", range(40))
def test_blocks_give_the_objects_of_the_line_by_line_reading(seed):
    rng = random.Random(seed)
    lines = RECORDED.read_bytes().splitlines(keepends=True)[:150]
    data = _damage(lines, rng)
    want = list(per_line(io.BytesIO(data)))
    for block in (1, 97, 4096, 1 << 20):  # a block boundary anywhere, or the whole file in one
        assert list(objects(io.BytesIO(data), block)) == want


def test_an_intact_file_is_read_in_blocks_and_in_order(tmp_path):
    recs = [{"task": f"worker:{i}", "seq": i, "ts": 1.5 * i, "progress": {"steps": i}} for i in range(5000)]
    path = tmp_path / "heartbeats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert list(read_jsonl(path)) == recs
    assert list(objects(io.BytesIO(path.read_bytes()), 1000)) == recs


def test_a_glued_pair_is_one_bad_line_not_two_records():
    data = b'{"a": 1}\n{"b": 2}{"c": 3}\n{"d": 4}\n'
    assert list(objects(io.BytesIO(data))) == [{"a": 1}, {"d": 4}]


#: Lines orjson reads differently from ``json`` (or refuses): the block must give ``json``'s objects.
_DIFFERENT = [
    b'{"big": 123456789012345678901234567890}\n',  # past 64 bits: orjson would make it a float
    b'{"neg": -98765432109876543210}\n',
    b'{"nan": NaN, "inf": Infinity}\n',  # json reads these, orjson refuses them
    b'{"huge": 1e400}\n',
    b'{"s": "\\ud800"}\n',  # a lone surrogate
    b'{"frac": 0.00012345678901234567891, "ts": 1795536341.924619}\n',  # long fractions are alike
]


@pytest.mark.parametrize("seed", range(12))
def test_orjson_blocks_give_the_standard_decoders_objects(seed, monkeypatch):
    pytest.importorskip("orjson")
    from orchestrator.runs import jsonl

    rng = random.Random(seed)
    lines = RECORDED.read_bytes().splitlines(keepends=True)[:150]
    for _ in range(rng.randint(1, 4)):
        lines.insert(rng.randrange(len(lines)), rng.choice(_DIFFERENT))
    data = _damage(lines, rng)
    want = list(per_line(io.BytesIO(data)))
    got = {block: list(objects(io.BytesIO(data), block)) for block in (97, 4096, 1 << 20)}
    monkeypatch.setattr(jsonl, "_orjson", None)
    for block, objs in got.items():
        assert objs == want
        assert list(objects(io.BytesIO(data), block)) == want
    big = [o for o in want if "big" in o]
    assert all(type(o["big"]) is int for o in big)


def test_an_intact_block_is_decoded_by_orjson_where_installed():
    pytest.importorskip("orjson")
    from orchestrator.runs import jsonl

    data = RECORDED.read_bytes().rstrip(b"\n")
    fast = jsonl._fast(data)
    assert fast is not None and fast == [json.loads(line) for line in data.split(b"\n")]
    assert jsonl._fast(data + b'\n{"n": 12345678901234567890}') is None  # the long integer goes to json
