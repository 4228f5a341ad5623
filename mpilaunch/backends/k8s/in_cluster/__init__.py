"""What runs inside the cluster, in the job's own pods: the launcher pod's entry point
(``launcher.py``), the reaper's (``reaper.py``), a detached job's end there (``detached.py``
and its pure rules, ``outcome.py``), and the in-pod helper the launcher asks the cluster DNS with (``dns.py``).
Nothing on the submitting side imports ``launcher`` (contract ``launchers-are-entry-points``)."""
