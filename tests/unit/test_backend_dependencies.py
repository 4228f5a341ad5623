"""A backend whose client cannot start: one error line and a hint that says what to do, nothing else.

Both cases were found on a Python that is not the suite's own: with Python 3.12 and newer,
``pip install 'mpilaunch[yarn]'`` gave a YARN backend that could not import skein (skein 0.8.2
imports distutils, which 3.12 removed), and the message blamed the extra the user had just
installed; and a machine without a Hadoop client got skein's own traceback printed under
mpilaunch's error.
"""

import importlib
import os
import subprocess
import sys

import pytest

pytest.importorskip("skein")

YARN_JOB = ["--backend", "yarn", "--np", "2", "--start-timeout", "5", "--", "true"]
# What Python 3.12 and newer do to `import distutils` without setuptools: this suite's Python (3.11)
# still has the module, so the test takes it away as 3.12 did, before anything imports it.
WITHOUT_DISTUTILS = "import sys; sys.modules['distutils'] = None; from mpilaunch.cli import main; main()"


def run(argv, env):
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def test_a_backend_package_that_cannot_import_a_removed_module_is_named_with_the_fix(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = run([sys.executable, "-c", WITHOUT_DISTUTILS, "--name", "no-distutils", *YARN_JOB], env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "mpilaunch: error: the yarn backend's package 'skein' cannot be imported: it needs the module "
        "'distutils' (Python 3.12 removed it)",
        "  hint: pip install setuptools",
    ]
    assert list(tmp_path.iterdir()) == []  # no run directory


def test_yarn_without_a_hadoop_client_is_one_error_and_one_hint(tmp_path):
    """No `yarn` on PATH, no Hadoop or Java settings: skein's driver cannot start."""
    env = {"PATH": os.path.dirname(sys.executable), "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    proc = run([sys.executable, "-m", "mpilaunch", "--name", "no-hadoop", *YARN_JOB], env)
    assert proc.returncode == 3, proc.stderr  # allocation failed
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("mpilaunch: error: cannot start the skein driver to talk to YARN: "), proc.stderr
    assert lines[1].startswith("  hint: check JAVA_HOME, HADOOP_CONF_DIR"), proc.stderr
    # skein's Client.__del__ on a client whose driver never started printed an AttributeError here
    assert len(lines) == 2, proc.stderr


def test_a_missing_module_is_blamed_on_the_package_whose_import_needed_it(tmp_path, monkeypatch):
    """A third-party backend (``acme_backend``) imports its client (``acme_client``): a module the
    backend itself lacks is the backend's to ask for; one its client lacks names the client."""
    from mpilaunch.backends import missing_module_error

    for name, text in {
        "acme_backend": "import acme_client\nimport acme_rpc\n",
        "acme_client": "import acme_transport\n",
    }.items():
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))

    def error_of_importing_the_backend():
        for name in ("acme_backend", "acme_client"):
            sys.modules.pop(name, None)
        importlib.invalidate_caches()  # a module written since the last try
        with pytest.raises(ModuleNotFoundError) as caught:
            __import__("acme_backend")
        return caught.value

    error = missing_module_error("acme", "acme", error_of_importing_the_backend(), own="acme_backend")
    assert (
        str(error) == "the acme backend's package 'acme_client' cannot be imported: it needs the module "
        "'acme_transport' (not installed)"
    )
    (tmp_path / "acme_transport.py").write_text("")
    error = missing_module_error("acme", "acme", error_of_importing_the_backend(), own="acme_backend")
    assert str(error) == "the acme backend needs the Python package 'acme_rpc'"
