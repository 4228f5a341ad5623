"""`mpilaunch stacks` through a YARN job's key-value store: the request, the reply and their keys
(mpilaunch/backends/yarn/stacks_kv.py; pure), and how the application's credentials are read
(client.py: the command, the PEM split). The exchange itself runs on the real YARN testbed
(tests/e2e/yarn/test_yarn_hang.py)."""

import json

import pytest

from mpilaunch.backends.yarn import client as yc
from mpilaunch.backends.yarn import stacks_kv as sk
from mpilaunch.backends.yarn.keys import KV_PREFIX
from mpilaunch.hang import verdict as v
from mpilaunch.hang.verdict import EXITED, NATIVE, PYTHON, RUNNING, STOPPED, Frame, RankStack

SITE = "/venv/lib/python3.11/site-packages"
RID = "0123456789abcdef0123456789abcdef"


def allreduce(rank, worker, extra=0):
    """A rank waiting in mpi4py's allreduce as py-spy --native shows it, ``extra`` frames deeper."""
    return RankStack(
        rank,
        worker,
        RUNNING,
        (
            Frame("opal_progress", "/usr/lib/libopen-pal.so.40", 0, NATIVE),
            Frame("PMPI_Allreduce", "/usr/lib/libmpi.so.40", 0, NATIVE),
            Frame("__pyx_f_6mpi4py_3MPI_PyMPI_allreduce", f"{SITE}/mpi4py/MPI.cpython-311.so", 0, NATIVE),
            Frame("step", "/home/u/train.py", 41, PYTHON, "total = comm.allreduce(x)"),
            *(Frame(f"outer{i}", "/home/u/train.py", 100 + i, PYTHON, "step()") for i in range(extra)),
            Frame("<module>", "/home/u/train.py", 60, PYTHON, "main()"),
        ),
        pid=1000 + rank,
        tool="py-spy --native",
    )


def sleeping(rank, worker, extra=0):
    return RankStack(
        rank,
        worker,
        RUNNING,
        (
            Frame("step", "/home/u/train.py", 12, PYTHON, "    time.sleep(600)"),
            *(Frame(f"outer{i}", "/home/u/train.py", 100 + i, PYTHON, "step()") for i in range(extra)),
            Frame("<module>", "/home/u/train.py", 60, PYTHON, "main()"),
        ),
        pid=1000 + rank,
        tool="py-spy --native",
    )


def job(n=8, odd=5, extra=0):
    return [(sleeping if r == odd else allreduce)(r, f"job-worker-{r // 4}", extra) for r in range(n)]


def test_stacks_kv_reply_round_trip_gives_the_same_verdict_and_report():
    stacks = job() + [RankStack(8, "job-worker-2", EXITED, exit_code=3), RankStack(9, "job-worker-2", STOPPED)]
    raw = sk.encode_reply(RID, stacks, 1.23456)
    back, seconds = sk.decode_reply(raw, RID)
    assert back == stacks and seconds == 1.235
    assert v.report(v.diagnose(back), seconds) == v.report(v.diagnose(stacks), 1.235)
    assert sorted(r for g in v.diagnose(back).odd for r in g.ranks) == [5, 8, 9]


def test_stacks_kv_reply_too_big_keeps_each_ranks_innermost_frames_and_the_verdict():
    stacks = job(n=64, odd=37, extra=200)  # 64 ranks, ~200 frames each
    full = len(json.dumps([s.to_dict() for s in stacks]))
    raw = sk.encode_reply(RID, stacks, 2.0, limit=full // 4)
    assert len(raw) <= full // 4
    data = json.loads(raw)
    kept = data["frames_kept"]
    assert kept in sk.FRAME_CAPS and all(len(s["frames"]) == kept for s in data["stacks"])
    back, _ = sk.decode_reply(raw, RID)
    assert [s.frames for s in back] == [s.frames[:kept] for s in stacks]  # innermost first: where each rank is
    assert v.diagnose(back).verdict == (
        "mpilaunch: hang: rank 37 (job-worker-9) is in time.sleep at train.py:12; "
        "the 63 other ranks are in MPI_Allreduce at train.py:41"
    )


def test_stacks_kv_reply_caps_long_texts_and_a_reply_that_cannot_fit_is_an_error():
    long = RankStack(
        0,
        "w",
        RUNNING,
        (Frame("f" * 5000, "/very/" + "d/" * 2000 + "train.py", 1, PYTHON, "x" * 9000),),
        note="n" * 900,
    )
    back, _ = sk.decode_reply(sk.encode_reply(RID, [long], 0.5), RID)
    frame = back[0].frames[0]
    assert len(frame.function) == 200 and len(frame.code) == 200 and len(back[0].note) == 300
    assert frame.file.endswith("/d/train.py") and len(frame.file) == 500  # the name the verdict shows stays
    with pytest.raises(sk.ReplyError, match="1000 ranks' stacks do not fit in a reply of 100 bytes"):
        sk.decode_reply(sk.encode_reply(RID, job(n=1000), 1.0, limit=100), RID)
    assert len(sk.encode_reply(RID, job(n=1024, extra=40), 1.0)) <= sk.MAX_REPLY_BYTES < 4 * 1024 * 1024


def test_stacks_kv_launcher_errors_and_foreign_replies():
    with pytest.raises(sk.ReplyError, match="^the ranks are not running$"):
        sk.decode_reply(sk.encode_error(RID, "the ranks\nare not running"), RID)
    with pytest.raises(ValueError):
        sk.decode_reply(sk.encode_reply("f" * 32, job(), 1.0), RID)  # another request's reply
    with pytest.raises(ValueError):
        sk.decode_reply(b"not json", RID)
    with pytest.raises(ValueError):
        sk.decode_reply(json.dumps({"id": RID, "stacks": [{"worker": "w"}]}).encode(), RID)  # no rank


def test_stacks_kv_request_carries_its_id_and_a_bounded_deadline():
    assert sk.decode_request(sk.encode_request(RID, 15), RID) == 15.0
    assert sk.decode_request(sk.encode_request(RID, 0.01), RID) == sk.MIN_DEADLINE_S
    assert sk.decode_request(sk.encode_request(RID, 1e9), RID) == sk.MAX_DEADLINE_S
    for bad in (
        sk.encode_request("f" * 32, 15),
        b"[1, 2]",
        b"{",
        json.dumps({"id": RID, "deadline_s": "nan"}).encode(),
        json.dumps({"id": RID, "deadline_s": [1]}).encode(),
    ):
        with pytest.raises(ValueError):
            sk.decode_request(bad, RID)


def test_stacks_kv_keys_name_one_request_and_its_reply():
    one, two = sk.new_request_id(), sk.new_request_id()
    assert one != two and len(one) == 32
    assert sk.request_key(KV_PREFIX, one) == f"mpilaunch/launcher/stacks/request/{one}"
    assert sk.reply_key(KV_PREFIX, one) == f"mpilaunch/launcher/stacks/reply/{one}"
    assert sk.request_id_of(KV_PREFIX, sk.request_key(KV_PREFIX, one)) == one
    for other in (
        sk.reply_key(KV_PREFIX, one),
        f"mpilaunch/launcher/stacks/request/{one}/x",
        "mpilaunch/launcher/stacks/request/../../launcher/secret",
        "mpilaunch/launcher/stacks/request/",
        f"other/launcher/stacks/request/{one}",
    ):
        assert sk.request_id_of(KV_PREFIX, other) is None, other


CERT = b"-----BEGIN CERTIFICATE-----\nMIIBcert\nline2\n-----END CERTIFICATE-----\n"
KEY = b"-----BEGIN PRIVATE KEY-----\nMIIEkey\n-----END PRIVATE KEY-----\n"


def test_stacks_kv_application_credentials_split_from_hadoop_fs_cat():
    assert yc.split_pem(CERT + KEY) == (CERT, KEY)
    assert yc.split_pem(CERT.rstrip(b"\n") + KEY) == (CERT, KEY)  # a file without its last newline
    for partial in (CERT, KEY, b"cat: `.skein/x/.skein.crt': No such file or directory"):
        with pytest.raises(ValueError):
            yc.split_pem(partial)
    assert yc.fs_cat_command("/jdk/bin/java", "/conf:/a.jar", " -Xss512k  -XX:+UseSerialGC", ["a", "b"]) == [
        "/jdk/bin/java",
        "-Xss512k",
        "-XX:+UseSerialGC",
        "-cp",
        "/conf:/a.jar",
        "org.apache.hadoop.fs.FsShell",
        "-cat",
        "a",
        "b",
    ]
