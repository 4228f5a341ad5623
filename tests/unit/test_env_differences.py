"""The environment check names what differs: each forwarded variable a rank saw otherwise than
mpilaunch sent, with both values (a secret masked as ``render`` masks it), and it takes the MPI
launcher's predictable rewrite of a path list for no difference (issue 42).

Pure: the rank wrapper's side (rank_env, the env line) and mpilaunch's (envcheck); the real runs
are in tests/e2e/local/test_env_check.py.
"""

from __future__ import annotations

import pytest

from mpilaunch.core import envcheck, mpi, rank_env, rank_lines

SENT = {"LD_LIBRARY_PATH": "/venv/lib", "HF_TOKEN": "hf_secret_value", "SEED": "7"}
E = envcheck.Expected(
    command="python",
    program="/venv/bin/python",
    flavour="openmpi",
    major=4,
    mpirun="/usr/bin/mpirun.openmpi",
    version="4.1.4",
    env_digest=rank_env.digest(SENT.items()),
    forwarded=SENT,
    prepended_dirs=("/usr/lib", "/usr/lib64"),
)


def rank_sees(**changes) -> dict:
    """A rank's environment: what mpilaunch sent, then ``changes`` (None: unset) by a startup file."""
    env = {rank_env.FORWARDED_LIST_ENV: rank_env.forwarded_list(SENT), **SENT}
    for name, value in changes.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    return env


def facts(env: dict) -> dict:
    """What mpilaunch learns of that rank: its start line's digest and its env line, through the text."""
    out = {"env_digest": rank_env.forwarded_digest(env)}
    changed = rank_env.changed_forwarded(env)
    if changed:
        line = "[1,2]<stderr>:" + rank_lines.format_env("2", "j-worker-1", changed, "ab12")
        assert rank_lines.parse_env(line, "cd34") is None  # another launch's token: not this one's
        parsed = rank_lines.parse_env(line, "ab12")
        assert parsed[0] == 2
        out["env_seen"] = parsed[1]
    return out


@pytest.mark.parametrize(
    "sent,seen,prepended,expected",
    [
        ("/venv/lib", "/venv/lib:/venv/lib", (), True),  # a duplicate entry
        ("/x", "/usr/lib:/x", ("/usr/lib",), True),  # Open MPI's <prefix>/lib put ahead
        ("/usr/lib", "/usr/lib:/usr/lib", ("/usr/lib",), True),  # ... even where it was already
        ("/x:/usr/lib", "/usr/lib:/x:/usr/lib", ("/usr/lib",), True),
        ("", "/usr/lib", ("/usr/lib",), True),
        ("/x", "/opt/site/lib:/x", ("/usr/lib",), False),  # a startup file's own directory
        ("/x", "/x:/usr/lib", ("/usr/lib",), False),  # appended, not put ahead: not the launcher's doing
        ("/x:/y", "/y:/x", (), False),  # reordered
        ("/x", "/y", ("/y",), False),  # the sent entry dropped
        ("/x", None, ("/usr/lib",), False),  # unset
        ("/x", "", (), False),
    ],
)
def test_env_differences_a_path_list_rewritten_by_the_launcher(sent, seen, prepended, expected):
    assert envcheck.rewritten_by_launcher("LD_LIBRARY_PATH", sent, seen, prepended) is expected


def test_env_differences_only_path_lists_are_rewritten_by_the_launcher():
    assert envcheck.rewritten_by_launcher("PYTHONPATH", "/a", "/a:/a", ()) is True
    assert envcheck.rewritten_by_launcher("NCCL_DEBUG", "INFO", "INFO", ()) is False  # not a list: never the same


def test_env_differences_the_mpi_flavours_say_what_their_launcher_puts_ahead():
    ompi = mpi.MpiInfo("openmpi", "4.1.4", "/usr/bin/mpirun.openmpi")
    assert mpi.for_name("openmpi").prepended_dirs(ompi) == ("/usr/lib", "/usr/lib64")
    assert mpi.for_name("openmpi").prepended_dirs(mpi.MpiInfo("openmpi", "5.0.8", "mpirun")) == ()  # no prefix
    intel = mpi.MpiInfo("intel", "2021.18", "/nonexistent/venv/bin/mpiexec.hydra")
    assert mpi.for_name("intel").prepended_dirs(intel) == ("/nonexistent/venv/lib",) == (intel.libdir,)
    assert mpi.for_name("mpich").prepended_dirs(mpi.MpiInfo("mpich", "4.0", "/usr/bin/mpiexec.hydra")) == ()


def test_env_differences_the_rank_directory_is_put_first_once():
    assert rank_env.with_directory_first(None, "/i/lib") == "/i/lib"
    assert rank_env.with_directory_first("", "/i/lib") == "/i/lib"
    assert rank_env.with_directory_first("/cuda/lib64", "/i/lib") == "/i/lib:/cuda/lib64"
    assert rank_env.with_directory_first("/i/lib", "/i/lib") == "/i/lib"
    assert rank_env.with_directory_first("/cuda/lib64:/i/lib", "/i/lib") == "/cuda/lib64:/i/lib"


def test_env_differences_a_rank_names_only_what_differs_and_masks_secrets():
    assert rank_env.changed_forwarded(rank_sees()) == []
    changed = dict(
        rank_env.changed_forwarded(rank_sees(LD_LIBRARY_PATH="/opt/site lib:/venv/lib", HF_TOKEN="hf_other", SEED=None))
    )
    assert changed == {"LD_LIBRARY_PATH": "/opt/site lib:/venv/lib", "HF_TOKEN": "<set, 8 chars>", "SEED": None}
    # the old list (names only, no digests) names nothing: the digest alone tells
    old = {**rank_sees(SEED="8"), rank_env.FORWARDED_LIST_ENV: ",".join(SENT)}
    assert rank_env.changed_forwarded(old) == [] and rank_env.forwarded_digest(old) != E.env_digest
    # what the check shows is what render and --dry-run show for a forwarded value
    assert rank_env.shown_value("HF_TOKEN", "hf_secret_value") == mpi.mask("hf_secret_value")
    assert rank_env.shown_value("PATH", "/bin") == "/bin" and rank_env.shown_value("LD_PRELOAD", "/l.so") == "/l.so"


def test_env_differences_the_env_line_carries_any_value():
    value = "a b%c\td\nend"
    line = rank_lines.format_env("0", "w", [("X_PATH", value), ("GONE", None)], "ab12")
    assert "\n" not in line and "\t" not in line
    assert rank_lines.parse_env(line, "ab12") == (0, {"X_PATH": value, "GONE": None})
    assert rank_lines.parse_env("[0] " + line + "[3] ", "ab12") == (
        0,
        {"X_PATH": value, "GONE": None},
    )  # hydra glues tags


def test_env_differences_report_and_warning_name_the_variable_and_both_values():
    environments = {
        0: facts(rank_sees()),
        1: facts(rank_sees()),
        2: facts(rank_sees(LD_LIBRARY_PATH="/opt/site/lib:/venv/lib", HF_TOKEN="hf_other", SEED=None)),
        3: facts(rank_sees(LD_LIBRARY_PATH="/opt/site/lib:/venv/lib")),
        4: facts(rank_sees(LD_LIBRARY_PATH="/usr/lib:/venv/lib:/venv/lib")),  # Open MPI's own
        5: {"env_digest": "0000abcd"},
    }  # a wrapper that did not say which
    assert envcheck.digest_mismatches(E, environments) == [2, 3, 5]
    differences = envcheck.env_differences(E, environments)
    assert differences == [
        {"variable": "HF_TOKEN", "sent": "<set, 15 chars>", "seen": "<set, 8 chars>", "ranks": [2]},
        {"variable": "LD_LIBRARY_PATH", "sent": "/venv/lib", "seen": "/opt/site/lib:/venv/lib", "ranks": [2, 3]},
        {"variable": "SEED", "sent": "<set, 1 chars>", "seen": None, "ranks": [2]},
    ]
    summary = envcheck.summary(E, environments, None, True)
    assert summary["env_digest_differs"] == [2, 3, 5] and summary["env_differs"] == differences
    warning = envcheck.differences_warning([2, 3, 5], differences)
    assert warning.splitlines() == [
        "mpilaunch: warning: 3 rank(s) (2-3, 5) saw other values of the forwarded variables than mpilaunch sent "
        "(a worker's startup files may set them; report.json's environment has them):",
        "  HF_TOKEN: rank 2 saw '<set, 8 chars>'; mpilaunch sent '<set, 15 chars>'",
        "  LD_LIBRARY_PATH: ranks 2-3 saw '/opt/site/lib:/venv/lib'; mpilaunch sent '/venv/lib'",
        "  SEED: rank 2 saw unset; mpilaunch sent '<set, 1 chars>'",
        "  rank 5: which variables differ was not reported",
    ]
    assert "hf_secret_value" not in repr(summary) + warning and "hf_other" not in repr(summary) + warning
    assert "and 1 more" in envcheck.differences_warning([2, 3, 5], differences, most=2)
