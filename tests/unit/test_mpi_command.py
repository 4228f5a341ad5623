"""mpirun argv and environment per flavour (pure), and version detection."""

import pytest

from mpilaunch.core import env_names, mpi, rank_env
from support.mpi_outputs import INTEL_VERSION, MPICH_VERSION, OMPI4_VERSION, OMPI5_MPIEXEC_VERSION, OMPI5_VERSION

OMPI4 = mpi.MpiInfo("openmpi", "4.1.4", "/usr/bin/mpirun.openmpi")
OMPI5 = mpi.MpiInfo("openmpi", "5.0.11", "/venv/bin/mpirun")
MPICH = mpi.MpiInfo("mpich", "4.0.2", "/usr/bin/mpiexec.hydra")
INTEL = mpi.MpiInfo("intel", "2021.10", "/opt/intel/bin/mpirun")

ENVIRON = {"NCCL_DEBUG": "INFO", "HOROVOD_FUSION_THRESHOLD": "1", "PYTHONPATH": "/src", "HOME": "/root", "FOO": "bar"}


def build(info, hosts=2, **kw):
    args = dict(
        ranks=4,
        hosts=hosts,
        hostfile="/run/hostfile",
        shim="/bin/mpilaunch-rsh",
        command=["python", "train.py"],
        environ=ENVIRON,
        user_env=("FOO", "SEED=3"),
    )
    args.update(kw)
    return mpi.build_mpirun(info, **args)


def pairs(argv, flag):
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


# Real `--version` outputs, captured from the installations the suite runs.
INTEL_2019_VERSION = (
    "Intel(R) MPI Library for Linux* OS, Version 2019 Update 9 Build 20200923 (id: abd58e492)\n"
    "Copyright 2003-2020, Intel Corporation.\n"
)


@pytest.mark.parametrize(
    "text,expected",
    [
        (OMPI4_VERSION, ("openmpi", "4.1.4")),
        ("mpirun (Open MPI) 4.1.4\n", ("openmpi", "4.1.4")),
        (OMPI5_VERSION, ("openmpi", "5.0.11")),
        (OMPI5_MPIEXEC_VERSION, ("openmpi", "5.0.11")),
        (MPICH_VERSION, ("mpich", "4.0.2")),
        (INTEL_VERSION, ("intel", "2021.18.1")),
        (INTEL_2019_VERSION, ("intel", "2019")),
        ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619\nCopyright", ("intel", "2021.10")),
        ("something else", None),
        ("mpirun (IBM Spectrum MPI) 10.4.0.3\n", None),
    ],
)
def test_parse_version_output(text, expected):
    assert mpi.parse_version_output(text) == expected


def test_detected_intel_and_openmpi_majors():
    assert mpi.MpiInfo(*mpi.parse_version_output(INTEL_VERSION), "/x").major == 2021
    assert mpi.MpiInfo(*mpi.parse_version_output(OMPI5_VERSION), "/x").major == 5


def test_unknown_mpi_error_names_what_was_found():
    e = mpi.unknown_mpi_error("/opt/x/bin/mpirun", "\n  mpirun (IBM Spectrum MPI) 10.4.0.3\nmore\n")
    assert (
        e.message
        == "cannot tell which MPI /opt/x/bin/mpirun is: its --version printed 'mpirun (IBM Spectrum MPI) 10.4.0.3'"
    )
    assert "--mpi openmpi|mpich|intel" in e.hint
    assert "printed nothing" in mpi.unknown_mpi_error("/x", "").message
    assert len(mpi.unknown_mpi_error("/x", "y" * 500).message) < 150


def test_intel_launch_sets_hydra_bootstrap_through_the_shim_and_the_library_path():
    cmd = build(INTEL)
    argv = cmd.argv
    assert argv[argv.index("-bootstrap") + 1] == "rsh"
    assert argv[argv.index("-bootstrap-exec") + 1] == "/bin/mpilaunch-rsh"
    assert cmd.env["I_MPI_HYDRA_BOOTSTRAP"] == "rsh"
    assert cmd.env["I_MPI_HYDRA_BOOTSTRAP_EXEC"] == "/bin/mpilaunch-rsh"
    listed = argv[argv.index("-genvlist") + 1].split(",")
    assert (
        mpi.LIBDIR_ENV in listed and cmd.env[mpi.LIBDIR_ENV] == "/opt/intel/lib"
    )  # <prefix>/lib of <prefix>/bin/mpirun
    assert "-launcher" not in argv and "LD_LIBRARY_PATH" not in listed  # the worker's own path stays
    assert "-genv" not in argv
    mpich = build(MPICH)
    assert mpi.LIBDIR_ENV not in mpich.argv[mpich.argv.index("-genvlist") + 1] and mpi.LIBDIR_ENV not in mpich.env


def test_intel_rank_environment_puts_the_mpi_libdir_first():
    from mpilaunch import rank

    env = rank.program_env({mpi.LIBDIR_ENV: "/opt/intel/lib", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}, False)
    assert env["LD_LIBRARY_PATH"] == "/opt/intel/lib:/usr/local/cuda/lib64" and mpi.LIBDIR_ENV not in env
    assert rank.program_env({mpi.LIBDIR_ENV: "/opt/intel/lib"}, False)["LD_LIBRARY_PATH"] == "/opt/intel/lib"
    assert "LD_LIBRARY_PATH" not in rank.program_env({}, False)
    # -x LD_LIBRARY_PATH=$VENV/lib with impi-rt's libdir there already: sent once, seen once (issue 42)
    for sent in ("/opt/intel/lib", "/usr/local/cuda/lib64:/opt/intel/lib"):
        assert (
            rank.program_env({mpi.LIBDIR_ENV: "/opt/intel/lib", "LD_LIBRARY_PATH": sent}, False)["LD_LIBRARY_PATH"]
            == sent
        )


def test_openmpi4_uses_rsh_names_on_command_line_and_both_in_env():
    cmd = build(OMPI4)
    argv = cmd.argv
    assert argv[:3] == ["/usr/bin/mpirun.openmpi", "-np", "4"]
    assert "--tag-output" in argv and argv[argv.index("--bind-to") + 1] == "none"
    assert argv[argv.index("--map-by") + 1] == "slot"
    mca = dict(zip(pairs(argv, "--mca"), [argv[i + 2] for i, a in enumerate(argv) if a == "--mca"]))
    # the shim where mpirun runs, `false` where a daemon runs (pods): see openmpi_agent
    assert mca["plm_rsh_agent"] == "/bin/mpilaunch-rsh : false"
    assert mca["plm_rsh_no_tree_spawn"] == "1"
    assert "--leave-session-attached" in argv
    assert int(mca["plm_rsh_num_concurrent"]) >= 128
    assert cmd.env["OMPI_MCA_plm_rsh_agent"] == "/bin/mpilaunch-rsh : false"
    assert cmd.env["PRTE_MCA_plm_ssh_agent"] == "/bin/mpilaunch-rsh : false"
    assert cmd.env["OMPI_MCA_orte_default_hostfile"] == "/run/hostfile"
    assert cmd.env["PRTE_MCA_prte_default_hostfile"] == "/run/hostfile"
    assert argv[-2:] == ["python", "train.py"]


def test_openmpi5_uses_prte_names_because_it_ignores_ompi_mca_agent():
    cmd = build(OMPI5)
    argv = cmd.argv
    assert argv[argv.index("--output") + 1] == "tag"
    keys = pairs(argv, "--prtemca")
    assert "plm_ssh_agent" in keys and "plm_ssh_no_tree_spawn" in keys
    assert "--mca" not in argv and "--leave-session-attached" in argv
    assert cmd.env["PRTE_MCA_plm_ssh_agent"] == "/bin/mpilaunch-rsh : false"


def test_openmpi5_daemons_fork_ranks_on_their_progress_thread():
    """PRRTE's launch threads lose ranks that exit before their pid is stored
    (the job then never ends); mpi.PRRTE_SPAWN_ON_PROGRESS_THREAD. Open MPI 4
    has no such parameter and is left alone."""
    argv = build(OMPI5).argv
    values = dict(zip(pairs(argv, "--prtemca"), [argv[i + 2] for i, a in enumerate(argv) if a == "--prtemca"]))
    assert values["odls_base_max_threads"] == "0"
    assert "odls_base_max_threads" not in " ".join(build(OMPI4).argv)


@pytest.mark.parametrize("info", [OMPI4, OMPI5], ids=["openmpi4", "openmpi5"])
def test_openmpi_forwards_nccl_horovod_pythonpath_and_user_vars(info):
    cmd = build(info)
    xs = pairs(cmd.argv, "-x")
    # names on the command line, values in mpirun's environment (-x NAME exports it from there)
    assert {"NCCL_DEBUG", "HOROVOD_FUSION_THRESHOLD", "PYTHONPATH", "FOO", "SEED"} <= set(xs)
    assert not any("=" in x for x in xs) and "HOME" not in xs
    assert {k: cmd.env[k] for k in ("NCCL_DEBUG", "HOROVOD_FUSION_THRESHOLD", "PYTHONPATH", "FOO", "SEED")} == {
        "NCCL_DEBUG": "INFO",
        "HOROVOD_FUSION_THRESHOLD": "1",
        "PYTHONPATH": "/src",
        "FOO": "bar",
        "SEED": "3",
    }
    assert "HOME" not in cmd.env


SECRET = "s3cr3t-value-of-32-characters-xy"


@pytest.mark.parametrize("info", [OMPI4, OMPI5, MPICH, INTEL], ids=["openmpi4", "openmpi5", "mpich", "intel"])
def test_secret_env_values_are_on_no_command_line(info):
    """-x NAME=VALUE, -x NAME and mpilaunch's own per-rank variables (the status token among
    them): every value in mpirun's environment, none in its argv; --dry-run masks the forwarded ones."""
    environ = {**ENVIRON, "HF_TOKEN": SECRET}
    cmd = build(
        info,
        environ=environ,
        user_env=("HF_TOKEN", f"API_KEY={SECRET[::-1]}"),
        rank_env={env_names.STATUS_TOKEN: "feedbeef" * 4, rank_env.WORKER_SLOTS_ENV: "2,2"},
    )
    joined = " ".join(cmd.argv)
    for value in (SECRET, SECRET[::-1], "feedbeef", "2,2", "INFO"):
        assert value not in joined, (value, cmd.argv)
    assert cmd.env["HF_TOKEN"] == SECRET and cmd.env["API_KEY"] == SECRET[::-1]
    assert cmd.env[env_names.STATUS_TOKEN] == "feedbeef" * 4 and cmd.env[rank_env.WORKER_SLOTS_ENV] == "2,2"
    if info.flavour == "openmpi":
        names = pairs(cmd.argv, "-x")
    else:
        assert "-genvnone" not in cmd.argv and "-genv" not in cmd.argv  # hydra takes one of -genvnone/-genvlist
        names = cmd.argv[cmd.argv.index("-genvlist") + 1].split(",")
    assert {"HF_TOKEN", "API_KEY", env_names.STATUS_TOKEN, rank_env.WORKER_SLOTS_ENV} <= set(names)
    assert "HOME" not in names
    shown = cmd.shown_env()
    assert shown["HF_TOKEN"] == "<set, 32 chars>" and shown["API_KEY"] == "<set, 32 chars>"
    assert shown[env_names.STATUS_TOKEN] == "<set, 32 chars>" and shown["NCCL_DEBUG"] == "<set, 4 chars>"
    assert shown[rank_env.WORKER_SLOTS_ENV] == "2,2"  # mpilaunch's own plan is no secret
    assert shown["HYDRA_LAUNCHER_EXEC"] == "/bin/mpilaunch-rsh"


@pytest.mark.parametrize("info", [OMPI5, MPICH], ids=["openmpi5", "mpich"])
def test_secret_env_mpiruns_own_paths_stay_on_the_command_line_when_they_differ(info):
    """-x PATH=... / LD_LIBRARY_PATH=...: mpirun's own search and loader paths are not changed by
    a value meant for the ranks; a PATH equal to mpirun's own travels by name like any other."""
    cmd = build(
        info,
        environ={"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/lib"},
        user_env=("PATH=/opt/venv/bin:/usr/bin", "LD_LIBRARY_PATH"),
    )
    assert "PATH" not in cmd.env and cmd.env["LD_LIBRARY_PATH"] == "/lib"
    assert cmd.env[mpi.WORKER_PATH_ENV] == "/opt/venv/bin:/usr/bin"  # the rank's program gets the user's
    if info.flavour == "openmpi":
        xs = pairs(cmd.argv, "-x")
        assert "PATH=/opt/venv/bin:/usr/bin" in xs and "LD_LIBRARY_PATH" in xs
    else:
        genv = {cmd.argv[i + 1]: cmd.argv[i + 2] for i, a in enumerate(cmd.argv) if a == "-genv"}
        assert genv == {"PATH": "/opt/venv/bin:/usr/bin"}
        assert "LD_LIBRARY_PATH" in cmd.argv[cmd.argv.index("-genvlist") + 1].split(",")


def test_more_than_128_hosts_raise_concurrency_and_radix():
    argv = build(OMPI5, hosts=300).argv
    values = dict(zip(pairs(argv, "--prtemca"), [argv[i + 2] for i, a in enumerate(argv) if a == "--prtemca"]))
    assert values["plm_ssh_num_concurrent"] == "300"
    assert int(values["routed_radix"]) > 300


def test_root_needs_allow_run_as_root_for_openmpi_only():
    assert "--allow-run-as-root" in build(OMPI4, as_root=True).argv
    assert "--allow-run-as-root" not in build(OMPI4).argv
    assert "--allow-run-as-root" not in build(MPICH, as_root=True).argv


def test_mpich_uses_hydra_rsh_launcher_and_explicit_env():
    cmd = build(MPICH)
    argv = cmd.argv
    assert argv[:5] == ["/usr/bin/mpiexec.hydra", "-n", "4", "-f", "/run/hostfile"]
    assert argv[argv.index("-launcher") + 1] == "rsh"
    assert argv[argv.index("-launcher-exec") + 1] == "/bin/mpilaunch-rsh"
    # -genvlist: only the listed names, each with its value from mpiexec's environment
    assert "-genvnone" not in argv and "-genv" not in argv and "-prepend-rank" in argv
    listed = argv[argv.index("-genvlist") + 1].split(",")
    genv = {name: cmd.env[name] for name in listed}
    assert {k: v for k, v in genv.items() if not k.startswith("MPILAUNCH_")} == {
        "HOROVOD_FUSION_THRESHOLD": "1",
        "NCCL_DEBUG": "INFO",
        "PYTHONPATH": "/src",
        "FOO": "bar",
        "SEED": "3",
    }
    # the rank wrapper's digest covers exactly the user's forwarded variables, each with its value's digest
    listed = [entry.split("=")[0] for entry in genv[rank_env.FORWARDED_LIST_ENV].split(",")]
    assert listed == ["HOROVOD_FUSION_THRESHOLD", "NCCL_DEBUG", "PYTHONPATH", "FOO", "SEED"]
    assert f"FOO={rank_env.digest([('FOO', 'bar')])}" in genv[rank_env.FORWARDED_LIST_ENV].split(",")
    assert cmd.env["HYDRA_LAUNCHER_EXEC"] == "/bin/mpilaunch-rsh"


def test_intel_reads_the_slots_per_host_from_a_machinefile():
    """Intel's -f ignores ``host:n`` (ranks per host = the launcher's cores)."""
    argv = build(INTEL).argv
    assert argv[argv.index("-machinefile") + 1] == "/run/hostfile" and "-f" not in argv


def test_intel_uses_bootstrap_options():
    cmd = build(INTEL)
    assert cmd.argv[cmd.argv.index("-bootstrap-exec") + 1] == "/bin/mpilaunch-rsh"
    assert cmd.env["I_MPI_HYDRA_BOOTSTRAP"] == "rsh"
    assert cmd.env["I_MPI_HYDRA_BOOTSTRAP_EXEC"] == "/bin/mpilaunch-rsh"


def test_extra_args_go_before_the_command():
    argv = build(OMPI4, extra_args=("--report-bindings",)).argv
    assert argv[-3:] == ["--report-bindings", "python", "train.py"]


@pytest.mark.parametrize(
    "line,expected",
    [
        ("[1,3]<stdout>:hello", [(3, "hello")]),
        ("[1,0]<stderr>: oops", [(0, "oops")]),
        ("[1,1]<stdout>:last[1,1]<stdout>:", [(1, "last"), (1, "")]),
        ("[2] {a}[0] {b}", [(2, "{a}"), (0, "{b}")]),
        ("plain [3] line", [(None, "plain [3] line")]),
    ],
)
def test_split_tagged(line, expected):
    assert mpi.split_tagged(line) == expected


def test_open_mpi_4_tags_keep_the_ranks_own_leading_space():
    # Open MPI 4 adds no space after its tag; an unbuffered print sends " " as a chunk of its own
    assert mpi.split_tagged("[1,0]<stdout>:rank[1,0]<stdout>: [1,0]<stdout>:0", ompi_tag_space=False) == [
        (0, "rank"),
        (0, " "),
        (0, "0"),
    ]
    assert mpi.split_tagged("[1,0]<stdout>:  indented", ompi_tag_space=False) == [(0, "  indented")]
    assert mpi.tag_has_space(OMPI5) and not mpi.tag_has_space(OMPI4) and mpi.tag_has_space(MPICH)
    # an in-cluster launcher names its (the image's) MPI: its lines are parsed by that MPI's rules
    image = mpi.announced_mpi("openmpi 4.1.4, 2 workers ready")
    assert (image.flavour, image.version, mpi.tag_has_space(image)) == ("openmpi", "4.1.4", False)
    assert mpi.announced_mpi("mpich 5.0.0, 16 workers ready").flavour == "mpich"
    assert mpi.announced_mpi("something else") is None


def test_missing_mpirun_is_a_usage_error(tmp_path):
    from mpilaunch.core.errors import UsageError

    with pytest.raises(UsageError, match="no mpirun found"):
        mpi.find_mpirun("intel", None, str(tmp_path))
    with pytest.raises(UsageError, match="not found"):
        mpi.find_mpirun("auto", "/nonexistent/mpirun", str(tmp_path))


# Output of a real Open MPI 4.1.4 launch whose daemon ran where the agent path
# did not exist (the defect seen on real pods), trimmed.
ORTED_DIED = """\
--------------------------------------------------------------------------
The value of the MCA parameter "plm_rsh_agent" was set to a path
that could not be found:

  plm_rsh_agent: /tmp/mpilaunch-j-abc/mpilaunch-rsh

Please either unset the parameter, or check that the path is correct
--------------------------------------------------------------------------
[j-worker-1:16036] [[21145,0],1] FORCE-TERMINATE AT Not found:-13 - error ../../../../../../orte/mca/plm/rsh/plm_rsh_component.c(335)
[j-worker-1:16036] *** Process received signal ***
Segmentation fault
--------------------------------------------------------------------------
ORTE was unable to reliably start one or more daemons.
This usually is caused by:

* not finding the required libraries and/or binaries on
--------------------------------------------------------------------------
"""


def test_daemon_error_names_the_host_and_the_daemons_own_message():
    assert mpi.daemon_error(ORTED_DIED.splitlines()) == (
        'on j-worker-1: The value of the MCA parameter "plm_rsh_agent" was set to a path that could '
        "not be found: plm_rsh_agent: /tmp/mpilaunch-j-abc/mpilaunch-rsh"
    )


def test_daemon_error_prefers_a_hydra_proxys_own_line_and_names_its_host():
    lines = [
        "[proxy:0:1@w-1] HYDU_sock_connect (utils/sock/sock.c:111): unable to get host address for x.invalid",
        "[mpiexec@l] HYDU_sock_write (utils/sock/sock.c:254): write error (Bad file descriptor)",
    ]
    assert mpi.daemon_error(lines) == "on w-1: unable to get host address for x.invalid"


def test_daemon_error_falls_back_to_generic_advice_then_error_lines_then_none():
    generic = ORTED_DIED.splitlines()[11:]
    assert (
        mpi.daemon_error(generic) == "ORTE was unable to reliably start one or more daemons. This usually is caused by:"
    )
    assert mpi.daemon_error(["sh: 1: /opt/x/orted: not found"] + generic) == "sh: 1: /opt/x/orted: not found"
    assert mpi.daemon_error(["[mpiexec@x] error waiting for proxy"]) == "[mpiexec@x] error waiting for proxy"
    assert mpi.daemon_error(["all fine"]) is None


def test_mpirun_version_is_remembered_until_the_binary_changes(tmp_path, monkeypatch):
    """mpirun --version runs once per binary; a changed file (an upgrade) is asked again."""
    from mpilaunch.core import mpi

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls = tmp_path / "calls"
    fake = tmp_path / "mpirun"
    fake.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'mpirun (Open MPI) 4.1.4'\n")
    fake.chmod(0o755)
    assert mpi.detect(str(fake)).version == "4.1.4"
    assert mpi.detect(str(fake)).version == "4.1.4"
    assert calls.read_text().count("x") == 1  # the second launch did not run it
    fake.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'mpirun (Open MPI) 5.0.11'\n")  # upgraded in place
    assert mpi.detect(str(fake)).version == "5.0.11"
    assert calls.read_text().count("x") == 2


@pytest.mark.parametrize("info, lingers", [(OMPI4, True), (OMPI5, True), (MPICH, False), (INTEL, False)])
def test_rank_wrapper_lingers_for_its_status_line_under_open_mpi_only(info, lingers):
    """Both Open MPI daemons drop a reaped rank's last line under load (mpi.openmpi.LINGER_MS:
    9 of 60 two-failure runs on 5.x lost a failed rank's exit line without it); hydra does not."""
    from mpilaunch.core.spec import JobSpec
    from mpilaunch.workloads.mpirun_command import rank_command

    command = rank_command(JobSpec(command=("prog", "arg")), ["wrapper"], info)
    assert command[-3:] == ["--", "prog", "arg"]
    assert ("--linger-ms" in command) is lingers


# what Debian bookworm's mpiexec (MPICH 4.0.2) printed against trixie's hydra_pmi_proxy (4.2.1), captured
HYDRA_RELEASE_MISMATCH = """\
[mpiexec@vm] HYD_pmcd_pmiserv_proxy_init_cb (pm/pmiserv/pmiserv_cb.c:460): cannot find proxy with ID 4479304
[mpiexec@vm] HYDT_dmxu_poll_wait_for_event (tools/demux/demux_poll.c:76): callback returned error status
[mpiexec@vm] HYD_pmci_wait_for_completion (pm/pmiserv/pmiserv_pmci.c:160): error waiting for event
[mpiexec@vm] main (ui/mpich/mpiexec.c:325): process manager error waiting for completion"""


def test_a_launch_across_two_hydra_releases_gets_a_hint_that_says_so():
    lines = HYDRA_RELEASE_MISMATCH.splitlines()
    hint = mpi.launch_hint(lines)
    assert hint is not None and "different MPICH releases" in hint and "--launcher cluster" in hint
    assert mpi.launch_hint(ORTED_DIED.splitlines()) is None
    assert mpi.launch_hint(["[mpiexec@x] error waiting for proxy"]) is None


def test_the_failure_message_of_a_launch_that_never_started_a_rank_ends_with_the_hint():
    from mpilaunch.runtime.output import RankOutput
    from mpilaunch.workloads.mpirun_outcome import failure_message

    output = RankOutput(echo_out=False, echo_err=False)
    output.launcher_head = HYDRA_RELEASE_MISMATCH.splitlines()
    output.launcher_tail.extend(output.launcher_head)
    message = failure_message(None, output, 255)
    assert message.splitlines()[0].startswith("mpirun exited with code 255 before any rank failed; MPI daemon ")
    assert message.splitlines()[-1].startswith("  hint: hydra's mpiexec here and the hydra_pmi_proxy")
    # a rank's failure or mpilaunch's own stop is not about the launch: no such hint
    assert "hint:" not in failure_message(None, output, 255, stopped="stopped by mpilaunch")
