"""Studies shipped with the simulator (`python -m sim sweep` with no argument runs default.yaml)."""
