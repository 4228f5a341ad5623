"""Start Volcano and/or Kueue on a running testbed (``python -m testbeds.k8s.cluster up``).

    python -m testbeds.k8s.addons --workdir /tmp/k8s volcano kueue

Their processes carry the cluster's marker, so ``cluster down`` ends them too.
"""

from __future__ import annotations

import argparse
import sys

from .cluster import KubeCluster
from .kueue import Kueue
from .volcano import Volcano

ADDONS = {"volcano": Volcano, "kueue": Kueue}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbeds.k8s.addons", description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True, help="the running cluster's workdir")
    ap.add_argument("addons", nargs="+", choices=sorted(ADDONS))
    args = ap.parse_args(argv)
    cluster = KubeCluster.attach(args.workdir)
    for name in args.addons:
        ADDONS[name](cluster).start()
        print(f"# {name} started on the cluster in {args.workdir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
