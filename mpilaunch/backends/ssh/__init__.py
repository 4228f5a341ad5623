"""The ssh backend: plain hosts reached over ssh, one exec agent each (``backend.py``, ``options.py``).

``remote.py`` is what runs first on a host; it is sent there as text, never imported here.
"""
