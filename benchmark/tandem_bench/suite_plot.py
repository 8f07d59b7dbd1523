"""The standard suite's plot: output throughput of every server on every workload, as grouped horizontal bars."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np


def plot_suite(bars: list[tuple[str, str, float]], path: Path) -> None:
    """`bars` holds (workload, server, output tokens/s); workloads keep their order, one colour per server."""
    workloads = list(dict.fromkeys(workload for workload, _, _ in bars))
    servers = list(dict.fromkeys(server for _, server, _ in bars))
    height = 0.8 / len(servers)
    figure, ax = plt.subplots(figsize=(9, 1.0 + 0.9 * len(workloads)))
    positions = np.arange(len(workloads))
    for index, server in enumerate(servers):
        values = {workload: value for workload, name, value in bars if name == server}
        rows = [i for i, workload in enumerate(workloads) if workload in values]
        widths = [values[workloads[i]] for i in rows]
        ax.barh(positions[rows] + index * height, widths, height=height, label=server)
    ax.set_yticks(positions + 0.4 - height / 2, labels=workloads, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("output tokens/s (higher is better)")
    ax.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
