"""Fault injection that a worker obeys, for tests and chaos runs only; off unless asked.

data_path   messages dropped or delayed, as a bad link would (environment variables set by
            `noloco-rt chaos`)
checkpoint_writes
            checkpoint writes that fail with ENOSPC after the first few, as a full disk
            would (an environment variable set by tests)
snapshot    a snapshot served scaled or with a NaN, as a broken peer would (worker.fault_*)
"""
