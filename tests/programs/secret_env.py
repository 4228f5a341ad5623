"""A rank that says whether it sees SECRET_TOKEN, without the value on any command line.

    secret_env.py SHA256_HEX RELEASE_FILE [MAX_WAIT_S]

Prints ``SECRET_SEEN rank=R worker=W match=yes|no`` (the variable's SHA-256
against the expected digest: the value itself is on no argv, this one's
included), then stays alive until RELEASE_FILE exists (at most MAX_WAIT_S, default
120 s), so the test can look at every process while the job runs.
"""

import hashlib
import os
import sys
import time

expected, release = sys.argv[1], sys.argv[2]
max_wait = float(sys.argv[3]) if len(sys.argv) > 3 else 120.0
value = os.environ.get("SECRET_TOKEN")
match = value is not None and hashlib.sha256(value.encode()).hexdigest() == expected
print(
    f"SECRET_SEEN rank={os.environ.get('RANK')} worker={os.environ.get('MPILAUNCH_WORKER', '?')} "
    f"match={'yes' if match else 'no'}",
    flush=True,
)
deadline = time.monotonic() + max_wait
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.1)
