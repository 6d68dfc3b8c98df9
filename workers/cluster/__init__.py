"""One-machine clusters: `noloco-rt up` and `noloco-rt chaos`."""
