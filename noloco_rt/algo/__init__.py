"""One replica's training math: the inner optimizer, replica state, diagnostics. Pure tensor code, no I/O."""
