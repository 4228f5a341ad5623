"""In-cluster launcher entry points (the k8s launcher pod, the YARN launcher container).

They sit above the lifecycle: each builds a backend standing for workers the
submitting side already allocated, and runs the same lifecycle and mpirun
workload as a launcher on the submitting machine does.
"""
