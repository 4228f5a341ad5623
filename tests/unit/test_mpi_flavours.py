"""The MPI flavours as strategy objects (mpilaunch/core/mpi/): the registry, each flavour's rules on
real captured output, and a new flavour that takes one module and one registration."""

import pytest

from mpilaunch.core import envcheck, hostfile, inherited, mpi, placement
from mpilaunch.core.mpi.base import LaunchArgs, MpiFlavour, MpiInfo
from mpilaunch.core.mpi.intel import IntelMpi
from mpilaunch.core.mpi.mpich import Mpich
from mpilaunch.core.mpi.openmpi import OpenMpi
from support.mpi_outputs import (
    INTEL_VERSION,
    MPICH_VERSION,
    OMPI4_VERSION,
    OMPI5_VERSION,
    OPENMPI4_ABORT,
    OPENMPI5_ABORT,
)

OMPI4 = MpiInfo("openmpi", "4.1.4", "/usr/bin/mpirun.openmpi")
OMPI5 = MpiInfo("openmpi", "5.0.11", "/venv/bin/mpirun")
MPICH = MpiInfo("mpich", "4.0.2", "/usr/bin/mpiexec.hydra")
INTEL = MpiInfo("intel", "2021.10", "/opt/intel/bin/mpiexec.hydra")
HOSTS = [("job-worker-0", 8), ("job-worker-1", 2)]
RAS = "^slurm,gridengine,tm,pbs,lsf,alps,flux"

ORTED_FORCE_TERMINATE = (
    "[j-worker-1:16036] [[21145,0],1] FORCE-TERMINATE AT Not found:-13 - error "
    "../../../../../../orte/mca/plm/rsh/plm_rsh_component.c(335)"
)
HYDRA_PROXY = "[proxy:0:1@w-1] HYDU_sock_connect (utils/sock/sock.c:111): unable to get host address for x.invalid"
HYDRA_MPIEXEC = "[mpiexec@l] HYDU_sock_write (utils/sock/sock.c:254): write error (Bad file descriptor)"


def build(info, **kw):
    args = dict(
        ranks=3,
        hosts=2,
        hostfile="/run/hostfile",
        shim="/run/rsh",
        command=["prog"],
        environ={"NCCL_DEBUG": "INFO"},
        extra_args=("--x",),
    )
    args.update(kw)
    return mpi.build_mpirun(info, **args)


# ------------------------------------------------------------------ the registry


def test_registry_knows_the_three_flavours_in_the_order_mpi_lists_them():
    assert mpi.names() == ("openmpi", "mpich", "intel")
    assert [type(mpi.for_name(n)) for n in mpi.names()] == [OpenMpi, Mpich, IntelMpi]
    assert all(mpi.FLAVOURS[n].name == n for n in mpi.names())
    with pytest.raises(ValueError, match="unknown MPI flavour 'mvapich' \\(known: openmpi, mpich, intel\\)"):
        mpi.for_name("mvapich")


def test_a_flavour_built_on_another_is_detected_before_it():
    order = [f.name for f in mpi.detection_order()]
    assert order.index("intel") < order.index("mpich")  # Intel's hydra descends from MPICH's


def test_what_every_flavour_must_answer():
    assert MpiFlavour.__abstractmethods__ == {"parse_version", "hostfile_line", "agent_env", "argv", "agent_setting"}


@pytest.mark.parametrize(
    "text, flavour, version",
    [
        (OMPI5_VERSION, "openmpi", "5.0.11"),
        (OMPI4_VERSION, "openmpi", "4.1.4"),
        (MPICH_VERSION, "mpich", "4.0.2"),
        (INTEL_VERSION, "intel", "2021.18.1"),
    ],
)
def test_each_flavour_reads_only_its_own_version_output(text, flavour, version):
    assert {f.name: f.parse_version(text) for f in mpi.FLAVOURS.values() if f.parse_version(text)} == {flavour: version}
    assert mpi.parse_version_output(text) == (flavour, version)


# ------------------------------------------------------------------ each flavour's launch


def test_openmpi4_argv():
    assert build(OMPI4).argv == [
        "/usr/bin/mpirun.openmpi",
        "-np",
        "3",
        "--hostfile",
        "/run/hostfile",
        "--map-by",
        "slot",
        "--bind-to",
        "none",
        "--tag-output",
        "--leave-session-attached",
        "--mca",
        "plm",
        "rsh",
        "--mca",
        "ras",
        RAS,
        "--mca",
        "plm_rsh_agent",
        "/run/rsh : false",
        "--mca",
        "plm_rsh_no_tree_spawn",
        "1",
        "--mca",
        "plm_rsh_num_concurrent",
        "128",
        "--mca",
        "routed_radix",
        "64",
        "-x",
        "NCCL_DEBUG",
        "-x",
        "MPILAUNCH_FORWARDED",
        "--x",
        "prog",
    ]


def test_openmpi5_argv_and_its_mca_environment():
    cmd = build(OMPI5)
    assert cmd.argv == [
        "/venv/bin/mpirun",
        "-np",
        "3",
        "--hostfile",
        "/run/hostfile",
        "--map-by",
        "slot",
        "--bind-to",
        "none",
        "--output",
        "tag",
        "--leave-session-attached",
        "--prtemca",
        "plm",
        "ssh",
        "--prtemca",
        "ras",
        RAS,
        "--prtemca",
        "plm_ssh_agent",
        "/run/rsh : false",
        "--prtemca",
        "plm_ssh_no_tree_spawn",
        "1",
        "--prtemca",
        "plm_ssh_num_concurrent",
        "128",
        "--prtemca",
        "routed_radix",
        "64",
        "--prtemca",
        "odls_base_max_threads",
        "0",
        "-x",
        "NCCL_DEBUG",
        "-x",
        "MPILAUNCH_FORWARDED",
        "--x",
        "prog",
    ]
    assert cmd.env["PRTE_MCA_plm"] == "ssh" and cmd.env["PRTE_MCA_odls_base_max_threads"] == "0"
    assert "OMPI_MCA_plm" not in cmd.env


def test_mpich_argv():
    assert build(MPICH).argv == [
        "/usr/bin/mpiexec.hydra",
        "-n",
        "3",
        "-f",
        "/run/hostfile",
        "-launcher",
        "rsh",
        "-launcher-exec",
        "/run/rsh",
        "-rmk",
        "user",
        "-genvlist",
        "NCCL_DEBUG,MPILAUNCH_FORWARDED",
        "-prepend-rank",
        "--x",
        "prog",
    ]


def test_intel_argv_and_its_library_directory_for_the_ranks():
    cmd = build(INTEL)
    assert cmd.argv == [
        "/opt/intel/bin/mpiexec.hydra",
        "-n",
        "3",
        "-machinefile",
        "/run/hostfile",
        "-bootstrap",
        "rsh",
        "-bootstrap-exec",
        "/run/rsh",
        "-rmk",
        "user",
        "-genvlist",
        "NCCL_DEBUG,MPILAUNCH_FORWARDED,MPILAUNCH_MPI_LIBDIR",
        "-prepend-rank",
        "--x",
        "prog",
    ]
    assert cmd.env[mpi.LIBDIR_ENV] == "/opt/intel/lib"


def test_every_launch_sets_every_flavours_agent_names():
    """A nested mpirun of another flavour inside the job finds the same agent and hostfile."""
    wanted = {"OMPI_MCA_plm_rsh_agent", "PRTE_MCA_plm_ssh_agent", "HYDRA_LAUNCHER_EXEC", "I_MPI_HYDRA_BOOTSTRAP_EXEC"}
    for info in (OMPI4, OMPI5, MPICH, INTEL):
        assert wanted <= set(build(info).env)


@pytest.mark.parametrize(
    "flavour, text",
    [
        ("openmpi", "job-worker-0 slots=8\njob-worker-1 slots=2\n"),
        ("mpich", "job-worker-0:8\njob-worker-1:2\n"),
        ("intel", "job-worker-0:8\njob-worker-1:2\n"),
    ],
)
def test_each_flavour_writes_its_hostfile_syntax_and_it_reads_back(flavour, text):
    assert mpi.for_name(flavour).render_hostfile(HOSTS) == hostfile.render(HOSTS, flavour) == text
    assert hostfile.parse(text) == HOSTS


def test_rank_wrapper_options_spawn_and_connect_back():
    openmpi, mpich, intel = (mpi.for_name(n) for n in mpi.names())
    assert openmpi.rank_wrapper_options(OMPI5) == ["--linger-ms", "100"]
    assert mpich.rank_wrapper_options(MPICH) == [] and intel.rank_wrapper_options(INTEL) == []
    assert openmpi.spawn_argv(OMPI5, ["mpirun"])[:2] == ["/bin/sh", "-c"]
    assert openmpi.spawn_argv(OMPI4, ["mpirun"]) == ["mpirun"] and mpich.spawn_argv(MPICH, ["x"]) == ["x"]
    assert (openmpi.proxies_connect_back, mpich.proxies_connect_back, intel.proxies_connect_back) == (False, True, True)
    assert intel.connect_back_args("10.0.0.1") == ["-localhost", "10.0.0.1", "-wdir", "/"]
    with pytest.raises(NotImplementedError):
        openmpi.connect_back_args("10.0.0.1")


# ------------------------------------------------------------------ reading mpirun's output


@pytest.mark.parametrize("lines", [OPENMPI4_ABORT, OPENMPI5_ABORT], ids=["openmpi4", "openmpi5"])
def test_open_mpi_names_the_first_failed_rank_hydra_does_not(lines):
    assert mpi.for_name("openmpi").first_failed_rank(lines) == (3, 7)
    assert mpi.for_name("mpich").first_failed_rank(lines) is None
    assert mpi.first_failed_rank(lines) == (3, 7)  # every flavour's rules: the printing mpirun may be another


def test_daemon_and_proxy_lines_are_each_flavours_own():
    openmpi, mpich, intel = (mpi.for_name(n) for n in mpi.names())
    assert openmpi.daemon_host(ORTED_FORCE_TERMINATE) == "j-worker-1"
    assert mpich.daemon_host(ORTED_FORCE_TERMINATE) is None
    proxy_said = ("w-1", "unable to get host address for x.invalid")
    assert mpich.proxy_error(HYDRA_PROXY) == intel.proxy_error(HYDRA_PROXY) == proxy_said
    assert openmpi.proxy_error(HYDRA_PROXY) is None and mpich.proxy_error(HYDRA_MPIEXEC) is None
    assert "ORTE was unable to reliably start" in openmpi.generic_daemon_advice and mpich.generic_daemon_advice == ()
    assert mpi.daemon_error([HYDRA_PROXY, HYDRA_MPIEXEC]) == "on w-1: unable to get host address for x.invalid"


def test_output_tags():
    assert not mpi.tag_has_space(OMPI4) and mpi.tag_has_space(OMPI5) and mpi.tag_has_space(MPICH)
    assert mpi.tag_has_space(MpiInfo("", "", ""))  # a launcher that named no flavour known here


# ------------------------------------------------------------------ what other modules ask of a flavour


@pytest.mark.parametrize(
    "flavour, major, needle",
    [
        ("openmpi", 5, "PRTE_MCA_plm_ssh_agent"),
        ("openmpi", 4, "OMPI_MCA_plm_rsh_agent"),
        ("mpich", 4, "-launcher-exec"),
        ("intel", 2021, "I_MPI_HYDRA_BOOTSTRAP"),
    ],
)
def test_agent_setting_is_the_placement_hint(flavour, major, needle):
    assert needle in mpi.for_name(flavour).agent_setting(major)
    assert placement.agent_setting(flavour, major) == mpi.for_name(flavour).agent_setting(major)
    assert placement.agent_setting("spectrum", 10) == "spectrum takes the agent from its own option"


@pytest.mark.parametrize(
    "name",
    [
        "OMPI_MCA_plm",
        "OMPI_MCA_plm_rsh_agent",
        "PRTE_MCA_ras",
        "PMIX_MCA_plm",
        "OMPI_MCA_orte_default_hostfile",
        "OMPI_MCA_btl_tcp_if_include",
        "HYDRA_LAUNCHER",
        "I_MPI_HYDRA_BOOTSTRAP",
        "I_MPI_PMI_LIBRARY",
        "NCCL_DEBUG",
        "PATH",
    ],
)
@pytest.mark.parametrize("flavour", ["openmpi", "mpich", "intel"])
def test_pinned_setting_is_what_inherited_leaves_out(flavour, name):
    """pinned_setting answers inherited.family_of's per-flavour part (resource managers and
    torch.distributed's variables are every flavour's, and stay in inherited.py)."""
    assert mpi.for_name(flavour).pinned_setting(name) == inherited.family_of(name, flavour)


# a library each flavour's ranks load (real paths, copied from test_env_check.py)
@pytest.mark.parametrize(
    "flavour, title, library",
    [
        ("openmpi", "Open MPI", "/usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so.40.30.4"),
        ("mpich", "MPICH", "/usr/lib/x86_64-linux-gnu/libmpich.so.12.2.0"),
        ("intel", "Intel MPI", "/opt/intel/lib/libmpi.so.12.0.0"),
    ],
)
def test_title_and_abi_are_what_the_environment_check_names(flavour, title, library):
    strategy = mpi.for_name(flavour)
    assert strategy.title == title
    assert strategy.abi == envcheck.library_mpi(library)[0]


# ------------------------------------------------------------------ a new flavour: one module, one registration


class ToyMpi(MpiFlavour):
    """What a new flavour's module holds (nothing else in mpilaunch is changed for it)."""

    name = "toympi"
    title = "Toy MPI"
    executables = ("toyrun",)
    abi = "mpich-abi"

    def parse_version(self, text):
        return text.split("Toy MPI ", 1)[1].split()[0] if "Toy MPI " in text else None

    def hostfile_line(self, host, slots):
        return f"{host} cpus={slots}"

    def agent_env(self, shim, hostfile):
        return {"TOY_AGENT": shim}

    def argv(self, info: MpiInfo, launch: LaunchArgs):
        return [
            info.path,
            "--ranks",
            str(launch.ranks),
            "--hosts",
            launch.hostfile,
            "--agent",
            launch.shim,
            "--env",
            ",".join(launch.by_env),
        ]

    def rank_wrapper_options(self, info):
        return ["--linger-ms", "5"]

    def agent_setting(self, major):
        return "Toy MPI takes the agent from --agent"


@pytest.fixture
def toy():
    flavour = mpi.register(ToyMpi())
    yield flavour
    mpi.FLAVOURS.pop(flavour.name)


def test_a_registered_flavour_is_used_by_the_pure_planning_functions(toy, tmp_path, monkeypatch):
    from mpilaunch.core.spec import JobSpec
    from mpilaunch.workloads.mpirun_command import rank_command, without_stale_session

    assert mpi.for_name("toympi") is toy and mpi.names()[-1] == "toympi"
    assert mpi.parse_version_output("Toy MPI 1.2.3 (build 7)\n") == ("toympi", "1.2.3")
    assert hostfile.render(HOSTS, "toympi") == "job-worker-0 cpus=8\njob-worker-1 cpus=2\n"
    info = MpiInfo("toympi", "1.2.3", "/opt/toy/bin/toyrun")
    cmd = build(info, user_env=("SEED=3",))
    assert cmd.argv == [
        "/opt/toy/bin/toyrun",
        "--ranks",
        "3",
        "--hosts",
        "/run/hostfile",
        "--agent",
        "/run/rsh",
        "--env",
        "NCCL_DEBUG,SEED,MPILAUNCH_FORWARDED",
        "--x",
        "prog",
    ]
    assert cmd.env["TOY_AGENT"] == "/run/rsh" and cmd.env["SEED"] == "3"
    assert cmd.forwarded == {"NCCL_DEBUG": "INFO", "SEED": "3"}
    assert build(OMPI5).env["TOY_AGENT"] == "/run/rsh"  # its agent name is set for a nested toyrun too
    assert rank_command(JobSpec(command=("prog",)), ["wrapper"], info) == ["wrapper", "--linger-ms", "5", "--", "prog"]
    assert without_stale_session(["toyrun"], info) == ["toyrun"]
    hint = placement.likely_cause(placement.Mismatch(placement.LAUNCHER, "x"), flavour="toympi", major=1)
    assert "Toy MPI takes the agent from --agent" in hint
    assert mpi.announced_mpi("toympi 1.2.3, 2 workers ready").flavour == "toympi"
    assert "--mpi openmpi|mpich|intel|toympi" in mpi.unknown_mpi_error("/x", "?").hint
    assert "Toy MPI" in mpi.unknown_mpi_error("/x", "?").hint
    # --mpi toympi looks for its own executables on PATH and detects it by its own banner
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fake = tmp_path / "toyrun"
    fake.write_text("#!/bin/sh\necho 'Toy MPI 1.2.3'\n")
    fake.chmod(0o755)
    found = mpi.find_mpirun("toympi", None, str(tmp_path))
    assert (found.flavour, found.version, found.path) == ("toympi", "1.2.3", str(fake))


# ------------------------------------------------------------------ a job's launch tuning (tune_launch)


def tuned(info, extra=("--x",)):
    cmd = build(info, extra_args=tuple(extra))
    mpi.for_name(info.flavour).tune_launch(info, cmd, tuple(extra), 1)  # the program: "prog"
    return cmd


def test_openmpi4_launch_looks_no_worker_name_up():
    cmd = tuned(OMPI4)
    at = cmd.argv.index("if_base_do_not_resolve")
    assert cmd.argv[at - 1 : at + 2] == ["--mca", "if_base_do_not_resolve", "1"]
    assert cmd.argv[-2:] == ["--x", "prog"] and at < len(cmd.argv) - 2  # before the user's own and the program
    assert cmd.env["OMPI_MCA_if_base_do_not_resolve"] == "1"
    # Open MPI 5's PRRTE makes no such lookups; MPICH's hydra is not touched
    assert "if_base_do_not_resolve" not in tuned(OMPI5).argv
    assert tuned(MPICH).argv == build(MPICH).argv


@pytest.mark.parametrize("info", [OMPI4, OMPI5], ids=["openmpi4", "openmpi5"])
def test_users_mpi_args_replace_mpilaunchs_tunable_values_only(info):
    option = "--mca" if info.major < 5 else "--prtemca"
    prefix = "plm_rsh_" if info.major < 5 else "plm_ssh_"
    extra = (option, prefix + "no_tree_spawn", "0", option, "routed_radix", "8")
    cmd = tuned(info, extra)
    pairs = [(cmd.argv[i + 1], cmd.argv[i + 2]) for i, a in enumerate(cmd.argv[:-2]) if a == option]
    names = [name for name, _ in pairs]
    # each tuned parameter once (Open MPI 4 refuses one named twice), with the user's value
    assert (prefix + "no_tree_spawn", "0") in pairs and ("routed_radix", "8") in pairs
    assert names.count(prefix + "no_tree_spawn") == 1 and names.count("routed_radix") == 1
    assert not any(k.endswith("no_tree_spawn") or k.endswith("routed_radix") for k in cmd.env)
    # what the launch pins stays mpilaunch's: the agent; an untouched tunable keeps mpilaunch's value
    assert (prefix + "agent", "/run/rsh : false") in pairs
    assert (prefix + "num_concurrent", "128") in pairs
    assert cmd.argv[-1] == "prog"
