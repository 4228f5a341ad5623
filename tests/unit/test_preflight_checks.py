"""--preflight's judgement of the workers' answers (mpilaunch/preflight/checks.py), and its probe's
reading of nvidia-smi (mpilaunch/preflight/probe.py). The answers here are what the probe sends; the
probe itself runs on real workers in tests/e2e/local/test_preflight.py and the ssh and pod tests."""

from __future__ import annotations

import json
import subprocess
import sys

from mpilaunch.preflight import checks

HEALTHY = {"host": "n", "gpus": None, "gpu_error": None, "scratch": "/tmp", "scratch_free": 50 << 30, "kernel_s": 0.1}


def answers(n: int, **overrides) -> dict:
    out = {f"w-{i}": dict(HEALTHY, clock=1000.0) for i in range(n)}
    for worker, changes in overrides.items():
        out[worker.replace("_", "-")] = {**out[worker.replace("_", "-")], **changes}
    return out


def judged(found: dict, gpus: dict | None = None, margin: float = checks.DEFAULT_MARGIN) -> checks.Verdict:
    received = {w: 1000.05 for w in found}
    travel = {w: 0.2 for w in found}
    return checks.judge(found, gpus or {}, received, travel, margin)


def test_preflight_a_healthy_job_has_no_finding():
    verdict = judged(answers(8))
    assert verdict.findings == [] and verdict.failed_workers == []
    assert verdict.medians == {"kernel_s": 0.1} and set(verdict.figures) == {f"w-{i}" for i in range(8)}


def test_preflight_compute_the_slow_worker_among_8_is_named_with_its_numbers():
    verdict = judged(answers(8, w_5={"kernel_s": 0.41}))
    assert verdict.failed_workers == ["w-5"]
    (finding,) = verdict.findings
    assert finding.check == "compute"
    assert finding.line("node-3") == (
        "mpilaunch: preflight: worker w-5 (node node-3) compute kernel 0.41 s, median 0.1 s (over the 50% margin)"
    )


def test_preflight_compute_noise_within_the_margin_is_no_finding():
    found = {f"w-{i}": dict(HEALTHY, kernel_s=0.3) for i in range(8)}
    found["w-1"]["kernel_s"], found["w-2"]["kernel_s"], found["w-3"]["kernel_s"] = 0.36, 0.42, 0.27
    assert judged(found).findings == []
    assert judged(found, margin=0.3).failed_workers == ["w-2"]


def test_preflight_compute_a_few_milliseconds_more_is_no_finding_however_many_times():
    """A kernel of tens of milliseconds: one descheduled slice on a busy machine doubles it."""
    tiny = {f"w-{i}": dict(HEALTHY, kernel_s=0.02) for i in range(4)}
    tiny["w-3"]["kernel_s"] = 0.06  # 3x the median, 40 ms more
    assert judged(tiny).findings == []
    tiny["w-3"]["kernel_s"] = 0.08
    assert judged(tiny).failed_workers == ["w-3"]


def test_preflight_gpus_fewer_than_planned_ecc_and_throttling_are_findings():
    gpu = {"index": 0, "name": "H100", "ecc": 0, "throttle": 0}
    found = answers(
        3,
        w_0={"gpus": [gpu, {**gpu, "index": 1}]},
        w_1={"gpus": [gpu]},  # one of its two missing
        w_2={"gpus": [gpu, {**gpu, "index": 1, "ecc": 2, "throttle": 0x40 | 0x1}]},  # 0x1: idle, not a finding
    )
    lines = [f.message for f in judged(found, gpus={"w-0": 2, "w-1": 2, "w-2": 2}).findings]
    assert lines == [
        "has 1 GPUs, the plan gives it 2",
        "GPU 1 (H100) has 2 uncorrected ECC errors",
        "GPU 1 (H100) is throttled: HW thermal slowdown",
    ]


def test_preflight_gpus_without_nvidia_smi_or_unknown_fields_are_no_finding():
    unknown = {"index": 0, "name": "", "ecc": None, "throttle": None}  # a driver that answers only ids
    found = answers(2, w_1={"gpus": [unknown]})
    assert judged(found, gpus={"w-0": 1, "w-1": 1}).findings == []
    broken = answers(2, w_0={"gpus": [], "gpu_error": "nvidia-smi exited 9: NVML: Driver/library mismatch"})
    assert [f.message for f in judged(broken).findings] == [
        "GPUs not readable: nvidia-smi exited 9: NVML: Driver/library mismatch"
    ]


def test_preflight_scratch_under_a_gib_is_a_finding():
    found = answers(2, w_1={"scratch": "/dev/shm", "scratch_free": 64 << 20})
    (finding,) = judged(found).findings
    assert (finding.worker, finding.message) == ("w-1", "scratch /dev/shm has 64.0 MiB free, under 1.00 GiB")


def test_preflight_clock_skew_beyond_the_exchange_is_a_finding():
    found = answers(3, w_0={"clock": 1000.05 + 30}, w_1={"clock": 1000.05 - 0.15}, w_2={"clock": 1000.05 - 9})
    assert [(f.worker, f.message) for f in judged(found).findings] == [
        ("w-0", "clock 30.0 s ahead of this machine's"),
        ("w-2", "clock 8.8 s behind this machine's"),
    ]


def test_preflight_a_worker_that_did_not_answer_is_named():
    found = answers(2)
    found["w-1"] = "no answer within 20 s"
    verdict = judged(found)
    assert [(f.worker, f.check, f.message) for f in verdict.findings] == [
        ("w-1", "answer", "did not answer the preflight probe: no answer within 20 s")
    ]
    assert verdict.to_dict()["failed_workers"] == ["w-1"]


def test_preflight_probe_reads_only_the_workers_own_gpus(tmp_path):
    """The probe run for real, with a stand-in nvidia-smi (no GPU here): CUDA_VISIBLE_DEVICES keeps
    the worker's own devices of a machine's list."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0, H100, 0, 0x0\\n1, H100, 5, 0x8\\n2, H100, [N/A], [N/A]\\n'\n")
    smi.chmod(0o755)
    from mpilaunch.workloads.preflight_run import probe_text

    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "1,2", "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", probe_text()], env=env, capture_output=True, text=True, check=True)
    answer = json.loads(out.stdout)
    assert answer["gpus"] == [
        {"index": 1, "name": "H100", "ecc": 5, "throttle": 8},
        {"index": 2, "name": "H100", "ecc": None, "throttle": None},
    ]
    assert answer["scratch"] == str(tmp_path) and answer["scratch_free"] > 0 and answer["kernel_s"] > 0


def test_preflight_has_its_own_share_of_the_ledger_and_the_time_line():
    """The seconds spent checking the workers are the preflight's, not the start's or wire-up's."""
    from mpilaunch.runtime import summary

    phases = {"allocated": 0.0, "workers_ready": 2.0, "preflight_done": 3.0, "first_rank_start": 3.5,
              "ranks_done": 9.5, "workload_done": 9.6, "released": 10.0}  # fmt: skip
    report = {"plan": {"workers": [{}, {}]}, "timings": {"phases": phases}}
    book = summary.ledger(report)
    assert (book["start"], book["preflight"], book["wire_up"], book["program"]) == (4.0, 2.0, 1.0, 12.0)
    assert book["allocated"] == sum(v for k, v in book.items() if k not in ("unit", "count", "allocated"))
    assert ("preflight", 1.0) in summary.time_spent(phases)
    stopped = {"allocated": 0.0, "workers_ready": 2.0, "preflight_done": 3.0, "released": 3.5}  # enforce ended it
    book = summary.ledger({"plan": {"workers": [{}]}, "timings": {"phases": stopped}})
    assert (book["preflight"], book["release"], book["program"]) == (1.0, 0.5, 0.0)
