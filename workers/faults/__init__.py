"""Fault injection that a worker obeys, for tests and chaos runs only; off unless asked.

data_path   messages dropped or delayed, as a bad link would (environment variables set by
            `noloco-rt chaos`)
snapshot    a snapshot served scaled or with a NaN, as a broken peer would (worker.fault_*)
"""
