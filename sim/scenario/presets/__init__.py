"""Named presets: hardware datasheets, model shapes and engine overheads."""
from sim.scenario.presets.engines import ENGINES, EngineSpec
from sim.scenario.presets.hardware import HARDWARE, HardwareSpec
from sim.scenario.presets.models import MODELS, Experts, Latent, ModelSpec, load_hf_config

__all__ = ["ENGINES", "EngineSpec", "Experts", "HARDWARE", "HardwareSpec", "Latent", "MODELS", "ModelSpec", "load_hf_config"]
