"""The agent channel's wire: what the rsh shim (client, ``rsh_agent/``) and the exec agent
(server, ``agent/``) both speak. Standard library only: both start once per worker or daemon."""
