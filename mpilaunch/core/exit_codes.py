"""Every exit status mpilaunch gives, in one place (README, "Exit status").

Pure constants: the per-rank and per-task helpers import them too.
"""

EXIT_OK = 0
EXIT_RANK_FAILED = 1  # a rank (or PS task) failed: its own code is in the report
# the same 1, where no status here says more: mpirun's launcher ended without telling mpirun's exit, a
# helper pod's work failed (it restarts); also what a job's result holds until its run says otherwise
EXIT_FAILED = 1
EXIT_USAGE = 2  # bad input: one line and a hint, nothing allocated
EXIT_ALLOCATION = 3  # workers never became ready, or the cluster refused (credentials, quota, image check)
EXIT_PLACEMENT = 4  # a rank ran elsewhere than planned, or ranks are missing
# a worker (pod, container, host, its agent) went away during the run: the cluster's fault, not the
# program's; distinct from a rank's own code and from mpirun's generic 255, which used to hide the cause
EXIT_WORKER_LOST = 5
# --preflight enforce: a worker failed a check before the program started; nothing ran, all released
EXIT_PREFLIGHT = 6
EXIT_NO_SPEC = 75  # a PS task starter: its launcher went away before sending the cluster spec
# --stall-timeout: no output and unchanged stacks that long; the verdict names the rank(s) holding the
# job up. Not timeout(1)'s 124-127, not 128+signal, and no code a program or MPI commonly exits with.
EXIT_HUNG = 86
EXIT_TIMEOUT = 124  # --timeout, as timeout(1)
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGINT, as a shell reports it
