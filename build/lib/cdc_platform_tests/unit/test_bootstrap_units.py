"""Installing the stack's Debian packages leaves the host's services as they were: a
service the install enabled (MariaDB's) is disabled again, one enabled before stays."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cdc_platform_tests.conftest import REPO_ROOT


def _run(etc: Path, state: Path, before: str) -> subprocess.CompletedProcess[str]:
    script = f'say() {{ echo "$*"; }}; SUDO=""; STATE={state}; . {REPO_ROOT}/scripts/units.sh; restore_units "{before}"'
    env = {"SYSTEMD_ETC": str(etc), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=False)


def test_only_services_the_install_enabled_are_disabled_again(tmp_path: Path) -> None:
    etc, state = tmp_path / "etc", tmp_path / "state"
    wants = etc / "multi-user.target.wants"
    wants.mkdir(parents=True)
    for unit in ("mariadb.service", "postgresql.service", "ssh.service"):
        (wants / unit).symlink_to(f"/lib/systemd/system/{unit}")
    result = _run(etc, state, "postgresql.service")  # the host had PostgreSQL enabled already
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in wants.iterdir()) == ["postgresql.service", "ssh.service"]
    assert (state / "stamps" / "units-left-disabled").read_text() == "mariadb.service\n"
    assert "left mariadb.service disabled" in result.stdout
