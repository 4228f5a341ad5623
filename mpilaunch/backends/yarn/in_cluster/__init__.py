"""What runs inside the YARN application's containers: each worker container's entry point
(``container.py``), the launcher container's (``launcher.py``, a detached job's end:
``detached.py``) and the ApplicationMaster's driver (``driver.py``). Nothing on the
submitting side imports ``launcher`` (contract ``launchers-are-entry-points``)."""
