"""A rank that remembers attempts: the first one sleeps (or fails), a relaunch succeeds at once.

Each rank leaves ``$ATTEMPT_MARKER.<rank>`` behind; finding it means this is
a relaunch (``--retries``, or a resubmitted job). Without ATTEMPT_MARKER
(pods have no file system in common), MPILAUNCH_ATTEMPT tells. First attempt: rank FAIL_UNIT exits FAIL_CODE,
the others sleep SLEEP seconds (long enough to lose a worker under them). A relaunch
waits (at most 120 s) for the file $RELAUNCH_GATE when that is set, so that a test can look
at the relaunched job before it ends.
"""

import os
import sys
import time

unit = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK") or 0)
if os.environ.get("ATTEMPT_MARKER"):
    marker = f"{os.environ['ATTEMPT_MARKER']}.{unit}"
    first = not os.path.exists(marker)
    open(marker, "a").close()
else:
    first = os.environ["MPILAUNCH_ATTEMPT"] == "1"
print(
    f"unit {unit} started ({'first attempt' if first else 'relaunch'}) on {os.environ.get('MPILAUNCH_WORKER')}"
    f" as attempt {os.environ.get('MPILAUNCH_ATTEMPT')}",
    flush=True,
)
if first:
    if unit == int(os.environ.get("FAIL_UNIT", "-1")):
        sys.exit(int(os.environ.get("FAIL_CODE", "3")))
    time.sleep(float(os.environ.get("SLEEP", "120")))
elif os.environ.get("RELAUNCH_GATE"):
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["RELAUNCH_GATE"]) and time.monotonic() < deadline:
        time.sleep(0.05)
