"""Facts about the device a measurement runs on, recorded with it: the CPU's model name, the
simulator's hardware preset a GPU corresponds to, its memory."""
from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gb(device: str) -> float:
    """The device's memory: the GPU's, or the machine's RAM."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory / 1e9
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def hardware_name(device_name: str, cuda: bool) -> str:
    """The simulator's hardware preset a device corresponds to (a bundle from another one warns)."""
    from sim.scenario.presets.hardware import preset_of_device

    return preset_of_device(device_name) if cuda else "cpu"





def tables_system(hardware: str) -> str:
    """The folder a device's measured tables are filed under (sim/formats/operator_layout.py)."""
    from sim.scenario.presets.hardware import HARDWARE

    return HARDWARE[hardware].tables_system if hardware in HARDWARE else hardware
