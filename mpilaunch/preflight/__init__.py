"""--preflight: the job's own workers checked before its program starts (issue 52).

``probe.py`` is sent as text to every worker through the job's exec channel
(as the hang probe is) and answers with that worker's facts; ``checks.py``
judges the answers against each other and the plan (pure functions); the
workload layer (``workloads/preflight_run.py``) asks and reports.
"""
