"""The observer: evaluation, replica spread, consensus export, status and metrics (its CLI
command registers lazily in noloco_rt.cli; the library never imports this package)."""
