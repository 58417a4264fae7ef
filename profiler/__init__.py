"""Everything that touches real hardware or runs an engine: the live engine (engine/), live runs
(live/) and campaigns of them (campaign.py), calibration into bundles (calibrate/), and engines
nobody here wrote as black boxes (blackbox/). Writes the formats sim/formats defines; never
imported by sim."""
