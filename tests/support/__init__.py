"""Helpers the tests share: waits, real servers and relays, model files, runs of `up`."""
