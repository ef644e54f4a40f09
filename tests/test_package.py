"""The package imports cheaply: no torch at import or for ``--help``/``--version``."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

import slurm_elastic

NO_TORCH = "import sys; {body}; assert 'torch' not in sys.modules, sorted(sys.modules)"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_import_does_not_import_torch() -> None:
    proc = _python(NO_TORCH.format(body="import slurm_elastic, slurm_elastic.marker"))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("args", [["--help"], ["--version"]])
def test_cli_help_and_version_do_not_import_torch(args: list[str]) -> None:
    body = (
        "from click.testing import CliRunner; from slurm_elastic.cli import cli; "
        f"r = CliRunner().invoke(cli, {args!r}); assert r.exit_code == 0, r.output; "
        "print(r.output)"
    )
    proc = _python(NO_TORCH.format(body=body))
    assert proc.returncode == 0, proc.stderr
    if args == ["--version"]:
        assert slurm_elastic.__version__ in proc.stdout


def test_console_script_works() -> None:
    exe = shutil.which("slurm-elastic")
    assert exe is not None, "console script missing: pip install -e '.[test]'"
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"slurm-elastic, version {slurm_elastic.__version__}"
    helptext = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert helptext.returncode == 0, helptext.stderr
    assert "Usage: slurm-elastic" in helptext.stdout


def test_console_script_rejects_unknown_command() -> None:
    exe = shutil.which("slurm-elastic")
    assert exe is not None
    proc = subprocess.run([exe, "no-such-command"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "No such command" in proc.stderr
