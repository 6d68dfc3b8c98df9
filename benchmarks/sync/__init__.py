"""Sync benchmark: NoLoCo's pairwise outer exchange against all-reduce, measured and modelled."""
