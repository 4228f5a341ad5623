"""One unit of either mode (an MPI rank or a PS task): unit FAIL_UNIT exits FAIL_CODE, the others sleep."""

import os
import sys
import time

unit = int(
    os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK") or os.environ.get("DTF_TASK_INDEX") or 0
)
print(f"unit {unit} started", flush=True)
if unit == int(os.environ.get("FAIL_UNIT", "-1")):
    print(f"unit {unit} about to fail", flush=True)
    sys.exit(int(os.environ.get("FAIL_CODE", "7")))
time.sleep(float(os.environ.get("SLEEP", "120")))
