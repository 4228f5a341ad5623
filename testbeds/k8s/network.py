"""Addresses the Kubernetes testbed's API server and its real node agree on (one module, so
neither imports the other)."""

from __future__ import annotations

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
#: pod IPs are handed out by kwok from a loopback range, so a process that
#: connects to a pod IP reaches this machine and nothing else
POD_CIDR = "127.64.0.1/16"
