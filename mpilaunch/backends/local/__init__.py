"""The local backend: one exec agent process per worker on this machine (``backend.py``)."""
