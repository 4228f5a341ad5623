"""``scripts/build-image.sh``'s options and tags, without building (``--print-tag``).

The builds themselves run on the real node (``testbeds/k8s/build-node.sh``, the real-pod
tests in ``tests/e2e/k8s/``); here: ``--with-horovod`` names its own image, the tag covers
the wheel and the extra build arguments, and a missing wheel or a wrong option is refused,
naming what to do.
"""

from __future__ import annotations

import re
import subprocess

from support.helpers import REPO

SCRIPT = REPO / "scripts" / "build-image.sh"
TAG = re.compile(r"mpilaunch\.local/(mpilaunch(?:-tf|-horovod|-horovod-layers)?):([0-9a-f]{12})")


def run(*args, cache=None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(cache or "/nonexistent")}
    if cache is not None:
        env["MPILAUNCH_CACHE"] = str(cache)
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def tag_of(*args, cache=None) -> tuple[str, str]:
    p = run(*args, "--print-tag", cache=cache)
    assert p.returncode == 0, p.stderr
    m = TAG.fullmatch(p.stdout.strip())
    assert m, p.stdout
    return m.group(1), m.group(2)


def test_each_variant_names_its_image_and_the_wheel_is_in_the_tag(tmp_path):
    wheel = tmp_path / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"one")
    plain, tf = tag_of(), tag_of("--with-tf")
    horovod = tag_of("--with-horovod", "--horovod-wheel", str(wheel))
    assert (plain[0], tf[0], horovod[0]) == ("mpilaunch", "mpilaunch-tf", "mpilaunch-horovod")
    assert len({plain[1], tf[1], horovod[1]}) == 3
    wheel.write_bytes(b"another")
    assert tag_of("--with-horovod", "--horovod-wheel", str(wheel))[1] != horovod[1]
    assert tag_of("--build-arg", "EXTRA_MPIS=0")[1] != plain[1]
    # the layers below the wheel's: no wheel needed, a name of their own
    assert tag_of("--with-horovod", "--layers-only")[0] == "mpilaunch-horovod-layers"


def test_with_horovod_uses_the_checked_build_of_build_horovod(tmp_path):
    build = tmp_path / "mpilaunch-horovod" / "openmpi"
    (build / "wheel").mkdir(parents=True)
    wheel = build / "wheel" / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"built")
    # no .done: that build never passed its check
    p = run("--with-horovod", "--print-tag", cache=tmp_path)
    assert p.returncode == 1 and "scripts/build-horovod.sh" in p.stderr and "--horovod-wheel" in p.stderr, p.stderr
    (build / ".done").touch()
    assert tag_of("--with-horovod", cache=tmp_path) == tag_of("--with-horovod", "--horovod-wheel", str(wheel))


def test_wrong_options_are_refused_saying_why(tmp_path):
    p = run("--horovod-wheel", str(tmp_path / "x.whl"), "--print-tag")
    assert p.returncode == 2 and "--horovod-wheel needs --with-horovod" in p.stderr, p.stderr
    p = run("--build-arg", "EXTRA_MPIS", "--print-tag")
    assert p.returncode == 2 and "NAME=VALUE" in p.stderr, p.stderr
    p = run("--with-horovod", "--horovod-wheel", str(tmp_path / "missing.whl"), "--print-tag")
    assert p.returncode == 1 and "not a wheel file" in p.stderr, p.stderr
    p = run("--layers-only", "--print-tag")
    assert p.returncode == 2 and "--layers-only goes with --with-horovod" in p.stderr, p.stderr
    p = run("--with-horovod", "--layers-only", "--archive", str(tmp_path / "x.tar"), "--print-tag")
    assert p.returncode == 2, p.stderr
    p = run("--help")
    assert p.returncode == 0 and "--with-horovod" in p.stdout and "set -euo" not in p.stdout, p.stdout


def test_the_dockerfile_mounts_a_folder_that_always_exists_and_git_ignores_its_wheels():
    assert (REPO / "docker" / "wheels" / "README.md").is_file()
    assert "source=docker/wheels" in (REPO / "docker" / "Dockerfile").read_text()
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "docker/wheels/horovod-0.28.1-cp311-cp311-linux_x86_64.whl"], cwd=REPO
    )
    assert ignored.returncode == 0
