"""The stage worker process and the local supervisor (their CLI commands register lazily
in noloco_rt.cli; the library never imports this package)."""
