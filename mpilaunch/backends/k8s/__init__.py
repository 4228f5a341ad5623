"""The Kubernetes backend: sleeping worker pods reached through the exec API.

Kept empty on purpose: the shim imports ``transport`` from this package once
per MPI daemon, and must not pay for the backend (``backend.py``).
"""
