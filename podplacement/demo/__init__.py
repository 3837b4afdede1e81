"""``podplacement demo``: the product run for real on this machine, end to end."""
