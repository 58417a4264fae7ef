"""Cost models: what one forward of a batch costs (roofline from datasheets, or calibrated from a bundle)."""
