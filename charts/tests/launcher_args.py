"""The rendered launcher argv parsed by the launcher's own parser, as the pod's environment would have it."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from tandem_launcher.cli import parse_config
from tandem_launcher.config import LauncherConfig

# Where the chart mounts the group's shared secret; the launcher checks the file exists, so here a file of ours
# stands in for the mount.
CLUSTER_SECRET_MOUNT = "/etc/tandem/cluster/secret"


def stand_in_secret() -> Path:
    """A readable secret file on this machine in place of the pod's Secret volume."""
    path = Path(tempfile.gettempdir()) / "tandem-chart-tests-cluster-secret"
    if not path.is_file():
        path.write_text("not-a-real-secret\n")
    return path


def launcher_config(args: Sequence[str], environ: Mapping[str, str] | None = None) -> LauncherConfig:
    """parse_config of a rendered argv; the cluster secret's mount path is swapped for a file that exists here."""
    argv = list(args)
    if "--cluster-secret-file" in argv:
        value = argv.index("--cluster-secret-file") + 1
        assert argv[value] == CLUSTER_SECRET_MOUNT
        argv[value] = str(stand_in_secret())
    return parse_config(argv, dict(environ or {}))
