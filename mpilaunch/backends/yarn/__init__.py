"""The YARN backend: worker containers of one skein application, each running an exec agent (``backend.py``)."""
