"""Can this node's NVIDIA driver run this torch build? Checked when a GPU job starts (slurm/*.sbatch):

    python -m train.cuda_env      # exit 0: fine, or no NVIDIA driver here (a CPU node); exit 2: what
                                  # does not fit and the fix

Every install path pins ``torch==2.13.0``, and its default wheel (PyPI) is built for CUDA 13.0, which
needs NVIDIA driver 580.65.06 or newer (NVIDIA's CUDA release notes, Linux). With an older driver torch
sees no GPU: a recipe with ``bf16: true`` then fails while it is parsed, with an error that does not
say why. The fix keeps the pinned version and changes the build: the CUDA 12 wheel of torch 2.13.0 from
PyTorch's own index runs on drivers from 525.60.13 on (CUDA 12's minor-version compatibility):

    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128

(https://download.pytorch.org/whl/torch/ lists the CUDA builds each version has; use a cu12x one.)
docs/training.md has the table of which driver each build needs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

# The oldest Linux driver each CUDA major version runs on (minor-version compatibility within a major)
MINIMUM_DRIVER = {13: "580.65.06", 12: "525.60.13", 11: "450.80.02"}
FIX = "pip install torch=={version} --index-url https://download.pytorch.org/whl/cu128"


def as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def driver_version() -> str | None:
    """The NVIDIA driver's version from nvidia-smi; None where there is no nvidia-smi (a CPU node)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        raise SystemExit(
            "error: nvidia-smi did not answer in 60 s: this node's GPU driver is not usable"
        ) from None
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return lines[0] if result.returncode == 0 and lines else None


def verdict(driver: str | None, cuda: str | None, torch_version: str) -> tuple[bool, str]:
    """(fits, what to say) for a driver version, the CUDA version torch was built for and torch's version."""
    base = torch_version.split("+")[0]
    if driver is None:
        return True, "no NVIDIA driver here (nvidia-smi not found): nothing to check"
    if cuda is None:
        return False, (
            f"this node has NVIDIA driver {driver} but torch {torch_version} is a CPU build: install a CUDA "
            f"build of the same version, e.g. `{FIX.format(version=base)}`"
        )
    major = as_tuple(cuda)[0]
    needed = MINIMUM_DRIVER.get(major)
    if needed and as_tuple(driver) < as_tuple(needed):
        return False, (
            f"torch {torch_version} is built for CUDA {cuda}, which needs NVIDIA driver {needed} or newer; "
            f"this node has {driver}, so torch would see no GPU (and bf16 recipes fail while parsed). "
            f"Install the CUDA 12 build of the same version from PyTorch's index: `{FIX.format(version=base)}` "
            "(it needs driver 525.60.13 or newer), or update the driver"
        )
    return True, f"NVIDIA driver {driver} runs torch {torch_version} (CUDA {cuda})"


def main(argv: list[str] | None = None) -> None:
    import argparse

    argparse.ArgumentParser(prog="python -m train.cuda_env", description=__doc__.split("\n\n")[0]).parse_args(
        argv
    )
    import torch

    fits, message = verdict(driver_version(), torch.version.cuda, torch.__version__)
    if not fits:
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)
    if torch.version.cuda and driver_version() and not torch.cuda.is_available():
        print(
            f"error: {message}, but torch sees no GPU: check CUDA_VISIBLE_DEVICES and the job's GPUs",
            file=sys.stderr,
        )
        raise SystemExit(2)
    print(f"cuda_env: {message}")


if __name__ == "__main__":
    main()
