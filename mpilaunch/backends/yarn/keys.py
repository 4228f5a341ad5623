"""Names the submitting side and the containers of a YARN job share: skein services and key-value keys.

Every key lives under ``KV_PREFIX`` in the application's key-value store.
"""

from ...core import env_names

SERVICE = "worker"  # the skein service of the worker containers
LAUNCHER_SERVICE = "launcher"  # ... and of the launcher container (--launcher cluster)
KV_PREFIX = "mpilaunch/"

# the worker containers' agents
WORKER_SECRET_KEY = "secret"  # the job's agent secret, read once by every worker container
WORKER_KEY = "worker/"  # + worker name: its agent's address and facts (JSON)
GPU_KEY = "gpu/"  # + node/index: which container holds a GPU

# the launcher container
SPEC_KEY = "launcher/spec"  # the launch description (LaunchDescription, JSON)
LAUNCHER_SECRET_KEY = "launcher/secret"  # the agent secret, for the launcher's shims; deleted once read
INFO_KEY = "launcher/info"
OUT_KEY = "launcher/out/"
EXIT_KEY = "launcher/exit"
STOP_KEY = "launcher/stop"
# `mpilaunch stacks NAME` asks the launcher container for every rank's stacks (stacks_kv.py)
STACKS_REQUEST_KEY = "launcher/stacks/request/"  # + request id: what is asked (JSON)
STACKS_REPLY_KEY = "launcher/stacks/reply/"  # + request id: the launcher's answer (JSON)

# What the shim passes to the agents with each daemon command. mpirun runs on
# the submitting machine with its MPI, so its daemons need the same one in the
# containers; with --env-archive the archive's environment wins instead.
FORWARD_ENV = (
    "PATH",
    env_names.WORKER_PATH,
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "OPAL_PREFIX",
    "PRTE_PREFIX",
    "OMPI_ALLOW_RUN_AS_ROOT",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
)
FORWARD_ENV_WITH_ARCHIVE = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
