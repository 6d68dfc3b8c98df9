"""The algorithm: pure tensor math, no I/O."""
