"""The exec path: what runs once per MPI daemon to reach a pod through the exec API. The
shim's transport (``transport.py``), its websocket client (``exec_stream.py``) and the
job's exec relay (``relay.py``). Standard library only (contract ``hot-paths-stdlib``)."""
