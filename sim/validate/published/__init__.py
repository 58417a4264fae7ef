"""`sim validate --published`: the simulator against published GPU measurements of speculative
decoding (validation/published/). catalogue reads and checks the entries, scenarios turns a case into
the scenario that reproduces it, predict runs every case, report writes the tables and the plot."""
