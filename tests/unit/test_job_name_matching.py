"""The suite finds a job's leftover processes by its name (``tests/support/helpers.py``). The
suite's parts run side by side, and one test's job name may end another's: "sigkill-local" and
"k8s-sigkill-local" (a CI run failed "sigkill-local" on the other part's live processes)."""

from __future__ import annotations

from tests.support.helpers import names_job


def test_a_job_is_found_by_its_name_its_workers_and_its_run_directory():
    named = names_job("sigkill-local")
    assert named("python -m mpilaunch --name sigkill-local --np 4 -- python x.py")
    assert named("python -m mpilaunch.agent --name sigkill-local-worker-0 --port 0")
    assert named("python -IS /tmp/mpilaunch-sigkill-local-di45iwpj/mpilaunch.rank -- python x.py")
    assert named('relay {"job": "sigkill-local"} /tmp/s.sock')


def test_a_job_whose_name_ends_with_it_is_not_found():
    named = names_job("sigkill-local")
    assert not named("python -m mpilaunch --name k8s-sigkill-local --backend k8s")
    assert not named("python -m mpilaunch --name rp-exit-sigkill-local -q")
    assert not named("python -IS /tmp/mpilaunch-k8s-sigkill-local-x1/mpilaunch.rank")
    assert not named("python -m mpilaunch --name sigkill-locally")
