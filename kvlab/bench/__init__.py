"""Microbenchmarks that hold the ledger against the machine. Results: results/<machine>/."""
