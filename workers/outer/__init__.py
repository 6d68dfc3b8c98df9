"""The outer exchange (docs/architecture.md §4): the snapshot service, the exchange and bootstrap clients, the outer step."""
