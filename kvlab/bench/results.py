"""Benchmark results as JSON under results/<machine>/<kind>.json, with the environment.

Every result file carries the environment it was measured in (device name, torch version,
CPU, measured peak) so the book can plot any machine's results next to the ledger.
Writes are atomic (temporary file + rename): an interrupted run never leaves half a file.
"""

from __future__ import annotations

import json
import os
import platform
import re
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from ..errors import KvlabError

RESULTS_DIR_ENV = "KVLAB_RESULTS_DIR"


def results_dir() -> Path:
    """$KVLAB_RESULTS_DIR; else the results/ of the kvlab checkout the current folder is in
    (the nearest folder from here up that holds both kvlab/ and results/: the book's
    notebooks run in notebooks/); else ./results."""
    if os.environ.get(RESULTS_DIR_ENV):
        return Path(os.environ[RESULTS_DIR_ENV])
    here = Path.cwd()
    for folder in (here, *here.parents):
        if (folder / "results").is_dir() and (folder / "kvlab").is_dir():
            return folder / "results"
    return here / "results"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str = "cpu") -> str:
    """'NVIDIA H200' for CUDA devices, the CPU model otherwise."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return cpu_name()


def machine_slug(device: str = "cpu") -> str:
    """A folder name for this machine: 'nvidia-h200', 'cpu-amd-epyc-7b13-2c'."""
    name = device_name(device)
    if not device.startswith("cuda"):
        name = f"cpu {name} {os.cpu_count()}c"
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return re.sub(r"-(r|tm|cpu-@.*|processor)(?=-|$)", "", slug)[:60]


def environment(device: str = "cpu") -> dict:
    """What a result was measured on."""
    env = {
        "device": device,
        "device_name": device_name(device),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "load_average": (
            [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
        ),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_threads"] = torch.get_num_threads()
        if device.startswith("cuda"):
            env["cuda"] = torch.version.cuda
            props = torch.cuda.get_device_properties(torch.device(device))
            env["device_memory_bytes"] = props.total_memory
    except ImportError:
        env["torch"] = None
    return env


def file_mode() -> int:
    """The mode an ordinary new file gets here: 0o666 less the umask (0o644 usually)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def check_writable(device: str | None = "cpu", machine: str | None = None) -> Path:
    """Where results/<machine>/ will be written (results/ itself for device None), checked
    before a benchmark spends its time: the folder (or its nearest existing parent) must be a
    folder this process can write. Creates nothing. Raises KvlabError naming the folder, the
    reason and the ways out."""

    folder = results_dir()
    if machine or device is not None:
        folder = folder / (machine or machine_slug(device))
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    why = None
    if not existing.is_dir():
        why = f"{existing} is not a folder"
    else:
        try:  # write and remove a probe: permissions, read-only file systems, quotas
            probe = tempfile.mkdtemp(prefix=".kvlab-write-probe-", dir=existing)
            os.rmdir(probe)
        except OSError as exc:
            why = f"{existing} cannot be written ({exc.strerror or exc})"
    if why:
        raise KvlabError(
            f"cannot save results to {folder}: {why}; set {RESULTS_DIR_ENV} to a writable "
            "folder or pass --no-write"
        )
    return folder


def write_result(kind: str, payload: dict, device: str = "cpu", machine: str | None = None) -> Path:
    """Write results/<machine>/<kind>.json atomically and return its path."""
    folder = results_dir() / (machine or machine_slug(device))
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{kind}.json"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{kind}.", suffix=".partial.json")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle, indent=1, allow_nan=False)
            handle.write("\n")
        os.chmod(tmp, file_mode())  # mkstemp makes the file private; a result is ordinary data
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_results(kind: str) -> dict[str, dict]:
    """Every recorded results/<machine>/<kind>.json, by machine folder name."""
    found = {}
    root = results_dir()
    if root.is_dir():
        for path in sorted(root.glob(f"*/{kind}.json")):
            found[path.parent.name] = json.loads(path.read_text())
    return found
