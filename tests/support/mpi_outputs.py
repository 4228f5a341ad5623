"""Real output of the MPI installations the suite runs, shared by the tests that parse it.

``--version`` texts (detection) and mpirun's abort messages (first-failure
parsing), copied from the installations themselves: Debian's Open MPI 4.1
and MPICH 4.0, PyPI's Open MPI 5 and Intel MPI.
"""

OMPI5_VERSION = "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
OMPI5_MPIEXEC_VERSION = "mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
OMPI4_VERSION = "mpirun.openmpi (OpenRTE) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
MPICH_VERSION = """HYDRA build details:
    Version:                                 4.0.2
    Release Date:                            Thu Apr  7 12:34:45 CDT 2022
    CC:                              gcc -Wdate-time -D_FORTIFY_SOURCE=2 -g -O2
    Configure options:                       '--with-hwloc-prefix=/usr' '--with-device=ch4:ucx' '--prefix=/usr'
    Process Manager:                         pmi
    Launchers available:                     ssh rsh fork slurm ll lsf sge manual persist
    Topology libraries available:            hwloc
    Resource management kernels available:   user slurm ll lsf sge pbs cobalt
    Demux engines available:                 poll select
"""
INTEL_VERSION = (
    "Intel(R) MPI Library for Linux* OS, Version 2021.18.1 Build 20260626 (id: b44796a)\n"
    "Copyright 2003-2026, Intel Corporation.\n"
)

# Open MPI 4's and 5's mpirun when a rank exits non-zero
OPENMPI4_ABORT = """\
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[17970,1],3]
  Exit code:    7
--------------------------------------------------------------------------""".splitlines()
OPENMPI5_ABORT = """\
--------------------------------------------------------------------------
prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-12073@1,3]
   Exit code:    7
--------------------------------------------------------------------------""".splitlines()
