"""Every ``MPILAUNCH_*`` environment variable, named once: who sets it and who reads it.

A name written as a literal in two modules drifts unseen (a typo reads as "unset"); every module
takes its names from here, and ``tests/unit/test_env_names.py`` finds any ``"MPILAUNCH_...``
literal elsewhere in the package, as ``test_exit_codes`` does for exit statuses. Pure constants:
the rank wrapper, the shim and the agent import them on their hot paths.
"""

# ---- what a user sets --------------------------------------------------------------------------
BACKEND = "MPILAUNCH_BACKEND"  # --backend's default (cli, core/spec.py)
STATE_DIR = "MPILAUNCH_STATE_DIR"  # where job records go, instead of $XDG_STATE_HOME/mpilaunch (runtime/record.py)
KEEP_RECORDS = "MPILAUNCH_KEEP_RECORDS"  # how many job records to keep (runtime/record.py)
PY_SPY = "MPILAUNCH_PY_SPY"  # the hang probe's py-spy, or "none" for the fallback (hang/probe.py, hang/collect.py)
# the submitting side's knobs of the Kubernetes backend
K8S_RELAY = "MPILAUNCH_K8S_RELAY"  # 0: every shim opens its own exec stream (no relay; k8s/exec_path/relay.py)
K8S_PYTHON = "MPILAUNCH_K8S_PYTHON"  # the worker pods' python (default python3)
K8S_CLUSTER_DOMAIN = "MPILAUNCH_K8S_CLUSTER_DOMAIN"  # the cluster's DNS domain (default cluster.local)
K8S_TOOLS = "MPILAUNCH_K8S_TOOLS"  # image: the image's own mpilaunch runs, not the job's ConfigMap (k8s/tools.py)
TOOLS_BYTECODE = "MPILAUNCH_TOOLS_BYTECODE"  # 0: the package zip without bytecode (image_tools; for measuring)
K8S_SA_DIR = "MPILAUNCH_K8S_SA_DIR"  # where an in-cluster client reads its ServiceAccount token (k8s/api.py)
LOCAL_FORK_FROM = "MPILAUNCH_LOCAL_FORK_FROM"  # local backend: fork agents from this many workers on

# ---- what every rank's (and the shim's) environment carries -----------------------------------
CONTEXT = "MPILAUNCH_CONTEXT"  # the job's context file, read by the shim (rsh_agent/shim.py)
WORKER = "MPILAUNCH_WORKER"  # the worker's name: set by its agent or pod, read by the rank wrapper and probe
JOB = "MPILAUNCH_JOB"  # the job's marker on its processes and pods (local backend, hang/probe.py)
SESSION = "MPILAUNCH_SESSION"  # an agent session's marker on the processes it started (agent/proctree.py)
ATTEMPT = "MPILAUNCH_ATTEMPT"  # --retries: which run of mpirun this is (1, 2, ...), seen by the program
SERVING = "MPILAUNCH_SERVING"  # --spares, k8s launcher pod: {worker: the spare pod serving it} (k8s/spares.py)
STATUS_TOKEN = "MPILAUNCH_STATUS_TOKEN"  # the rank wrappers' lines count only with it (core/rank_lines.py)
WORKER_PATH = "MPILAUNCH_WORKER_PATH"  # the worker's PATH where mpirun's daemon started (core/rank_env.py)
WORKER_CWD = "MPILAUNCH_WORKER_CWD"  # the worker's directory, set by the shim's remote command
FORWARDED = "MPILAUNCH_FORWARDED"  # the names of the variables forwarded to every rank (core/rank_env.py)
WORKER_SLOTS = "MPILAUNCH_WORKER_SLOTS"  # "4,4": each worker's slots in plan order (core/rank_env.py)
MASTER_ADDR = "MPILAUNCH_MASTER_ADDR"  # torch.distributed's rendezvous, made by mpilaunch (core/rank_env.py)
MASTER_PORT = "MPILAUNCH_MASTER_PORT"
MPI_LIBDIR = "MPILAUNCH_MPI_LIBDIR"  # Intel MPI's <prefix>/lib, put on the rank's library path (rank.py)

# ---- set by a backend for its own pieces in a worker, container or pod ------------------------
IMAGE = "MPILAUNCH_IMAGE"  # a pod's image, named by `mpilaunch check-image` (runtime/image_tools.py)
POD_NAME = "MPILAUNCH_POD_NAME"  # the downward API's metadata.name, where the hostname is not it
MESH_SIDECARS = "MPILAUNCH_MESH_SIDECARS"  # 1: a service mesh's sidecars are kept (k8s/mesh.py)
SSH_ZIP = "MPILAUNCH_SSH_ZIP"  # the ssh backend's package zip on a host (ssh/remote.py)
TOOLS = "MPILAUNCH_TOOLS"  # YARN: the directory of mpilaunch's pieces in a container (yarn/tools.py)
PYTHON = "MPILAUNCH_PYTHON"  # YARN (and a worker of an unknown image): the container's python
ENV_DIR = "MPILAUNCH_ENV_DIR"  # YARN --env-archive: the container's copy of the packed environment
YARN_JOB = (
    "MPILAUNCH_YARN_JOB"  # a YARN worker container's job, GPUs and key-value prefix (yarn/in_cluster/container.py)
)
YARN_GPUS = "MPILAUNCH_YARN_GPUS"
YARN_KV = "MPILAUNCH_YARN_KV"
YARN_WORKER_NAMES = "MPILAUNCH_YARN_WORKER_NAMES"  # the workers' names, taken in order by the containers
YARN_WORKER_NAME = "MPILAUNCH_YARN_WORKER_NAME"  # a replacement container's name (--retries)
YARN_CONTAINER = "MPILAUNCH_YARN_CONTAINER"  # the container's id, in its agent's environment
ORPHAN_TIMEOUT = "MPILAUNCH_ORPHAN_TIMEOUT"  # YARN's driver: --orphan-timeout (yarn/in_cluster/driver.py)
DEADLINE_S = "MPILAUNCH_DEADLINE_S"  # YARN's driver: end the application after this long (yarn/in_cluster/driver.py)
TASK_HOST = "MPILAUNCH_TASK_HOST"  # a PS task starter's address to report (task_starter.py)
TASK_PORT = "MPILAUNCH_TASK_PORT"  # a PS task's reserved port and address, given to its program
TASK_ADDRESS = "MPILAUNCH_TASK_ADDRESS"
