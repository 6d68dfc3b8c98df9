"""Durable run state that outlives every worker (docs/architecture.md §5).

backend             a folder or an fsspec URL: atomic writes, reads, listings
stage_checkpoints   checksummed stage checkpoints: naming, manifests, the latest valid one
cursors             each first-stage worker's data cursor, by name
"""
