"""Each rank writes files where --collect looks for them, then ends as asked: the files of a job
that succeeded, failed or ran past its --timeout (--collect's tests).

In its working directory: ``results/rank-<R>.json`` (its rank, worker and directory), and, from
rank 0, ``$HOROVOD_TIMELINE`` where that is set (what Horovod's rank 0 writes there: a JSON
array of trace events) and ``$WRITE_DIR/abs-R.txt`` where that is set (an absolute glob's file).
Then, by ``sys.argv[1]``: ``ok`` exits 0; ``fail`` exits 7 on rank 1, 0 elsewhere (after rank 1
wrote its file); ``sleep`` sleeps (a --timeout's or a --stall-timeout's job).
"""

import json
import os
import sys
import time

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK") or 0)
worker = os.environ.get("MPILAUNCH_WORKER", "?")
os.makedirs("results", exist_ok=True)
with open(os.path.join("results", f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "worker": worker, "cwd": os.getcwd()}, f)
timeline = os.environ.get("HOROVOD_TIMELINE")
if timeline and rank == 0:
    with open(timeline, "w") as f:
        json.dump([{"name": "write_files", "ph": "X", "ts": 0, "dur": 1, "pid": 0}], f)
where = os.environ.get("WRITE_DIR")
if where:
    with open(os.path.join(where, f"abs-{rank}.txt"), "w") as f:
        f.write(f"rank {rank} on {worker}\n")
print(f"rank {rank} wrote its files", flush=True)
mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
if mode == "fail":
    sys.exit(7 if rank == 1 else 0)
if mode == "sleep":
    time.sleep(3600)
