"""Sealed records and the handshake lines, piece by piece (the real sockets are in test_connect_back*)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from worker_entry.protocol import handshake as hs
from worker_entry.protocol import seal

REPO = Path(__file__).resolve().parent.parent
N1, N2 = "1" * 64, "2" * 64


def pair(secret: bytes = b"k" * 32, rank: int = 0) -> tuple[seal.Sealer, seal.Opener]:
    to_node, _ = seal.channel_keys(secret, N1, N2, rank)
    return seal.Sealer(to_node), seal.Opener(to_node)


def test_the_key_schedule_is_rfc5869_hkdf_and_separates_directions_ranks_and_connections():
    ikm, salt, info = os.urandom(32), os.urandom(64), b"info"
    assert seal.hkdf_sha256(ikm, salt, info) == HKDF(hashes.SHA256(), 32, salt, info).derive(ikm)
    keys = {seal.channel_keys(b"k" * 32, a, b, r) for a, b, r in ((N1, N2, 0), (N2, N1, 0), (N1, N2, 1))}
    flat = [k for ks in keys for k in ks]
    assert len(set(flat)) == 6


def test_records_round_trip_in_any_split_and_are_bounded():
    sealer, opener = pair()
    data = os.urandom(3 * seal.RECORD_MAX + 17)
    wire = sealer.seal(data) + sealer.seal(b"tail")
    assert len(wire) == len(data) + 4 + 5 * (seal.HEADER.size + seal.TAG)  # 4 records + 1
    got = b"".join(opener.feed(wire[i : i + 7919]) for i in range(0, len(wire), 7919))
    assert got == data + b"tail" and opener.pending == 0
    assert sealer.seal(b"") == b""


@pytest.mark.parametrize(
    "attack",
    [
        "flip a ciphertext bit",
        "flip a length bit",
        "replay a record",
        "swap two records",
        "drop a record",
        "another connection's record",
        "an oversized length",
        "a length below the tag",
    ],
)
def test_tampering_replay_and_reordering_fail_and_stay_failed(attack):
    sealer, opener = pair()
    recs = [sealer.seal(f"record {i}\n".encode()) for i in range(3)]
    other = pair(rank=1)[0].seal(b"record 1\n")
    bad = {
        "flip a ciphertext bit": [recs[0], recs[1][:-1] + bytes([recs[1][-1] ^ 1])],
        "flip a length bit": [recs[0], bytes([recs[1][0] ^ 0x80]) + recs[1][1:]],
        "replay a record": [recs[0], recs[0]],
        "swap two records": [recs[0], recs[2], recs[1]],
        "drop a record": [recs[0], recs[2]],
        "another connection's record": [recs[0], other],
        "an oversized length": [recs[0], seal.HEADER.pack(seal.RECORD_MAX + seal.TAG + 1) + b"x" * 64],
        "a length below the tag": [recs[0], seal.HEADER.pack(3) + b"abc"],
    }[attack]
    assert opener.feed(bad[0]) == b"record 0\n"
    with pytest.raises(seal.SealError):
        for rec in bad[1:]:
            opener.feed(rec)
    with pytest.raises(seal.SealError):
        opener.feed(recs[1])  # nothing after a failure is ever opened


@pytest.mark.parametrize("mac", ["é" * 64, "A" * 64, "0" * 63, 12, None, "0" * 65, "g" * 64])
def test_a_mac_that_is_not_64_lowercase_hex_digits_never_matches_and_never_raises(mac):
    assert hs.same_mac("0" * 64, mac) is False


def test_a_signed_refusal_is_final_and_an_unsigned_one_is_not():
    secret = b"k" * 32
    with pytest.raises(hs.Refused, match="rank 3 is not a task"):
        hs.parse_reply(hs.refused(secret, 3, N1, N2, "rank 3 is not a task of this run")[:-1], secret, 3, N1, N2)
    with pytest.raises(hs.HandshakeError) as err:
        hs.parse_reply(hs.refused(b"x" * 32, 3, N1, N2, "go away")[:-1], secret, 3, N1, N2)
    assert not isinstance(err.value, hs.Refused)
    with pytest.raises(hs.HandshakeError, match="does not hold"):
        hs.parse_reply(hs.accepted(b"x" * 32, 3, N1, N2)[:-1], secret, 3, N1, N2)
    hs.parse_reply(hs.accepted(secret, 3, N1, N2)[:-1], secret, 3, N1, N2)


BLOCK_CRYPTOGRAPHY = "import sys; sys.modules['cryptography'] = None; "


def test_worker_entry_imports_without_cryptography_and_connect_says_what_is_missing():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = (
        BLOCK_CRYPTOGRAPHY
        + "import worker_entry.agent.runner, worker_entry.agent.modes.connect, worker_entry.agent.modes.slurm, worker_entry.protocol.seal"
    )
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
    code = (
        BLOCK_CRYPTOGRAPHY
        + "from worker_entry.agent.modes.connect import main; sys.exit(main(0, {'TFCLUSTER_CONNECT': '127.0.0.1:9'}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, input=b"ab" * 32 + b"\n", capture_output=True)
    assert proc.returncode == 2
    assert b"'cryptography' package, which is missing here: pip install cryptography" in proc.stderr
    assert b"Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("stdin", "why"),
    [
        (b"", "expected the run's secret on stdin"),
        (b"zz\n", "expected the run's secret"),
        (b"abcd\n", "at least 16 bytes"),
    ],
)
def test_a_node_without_its_secret_on_stdin_says_so(stdin, why):
    env = {**os.environ, "PYTHONPATH": str(REPO), "TFCLUSTER_CONNECT": "127.0.0.1:9", "TFCLUSTER_RANK": "0"}
    proc = subprocess.run([sys.executable, "-m", "worker_entry", "connect"], env=env, input=stdin, capture_output=True)
    assert proc.returncode == 2 and why.encode() in proc.stderr and b"Traceback" not in proc.stderr
