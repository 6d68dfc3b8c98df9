"""The outer exchange (DESIGN §4): the snapshot service, the exchange and bootstrap clients, the outer step."""
