"""Rank EAT_RANK allocates (and touches) EAT_MIB MiB; the others wait to be ended by mpirun."""

import os
import time

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK") or 0)
print(f"rank {rank} started", flush=True)
if rank == int(os.environ.get("EAT_RANK", "1")):
    chunks = []
    for _ in range(int(os.environ.get("EAT_MIB", "1024")) // 16):
        chunks.append(b"x" * (16 << 20))  # written, so really resident
    print(f"rank {rank} holds {len(chunks) * 16} MiB and was not killed", flush=True)
else:
    time.sleep(60)
