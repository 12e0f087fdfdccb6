"""kvlab: why LLM decode stays slow when the KV cache hits, computed and measured.

The package holds every number the book shows. Import the pieces you need:
`kvlab.cost` (the ledger), `kvlab.models`, `kvlab.hardware`, `kvlab.dtypes`.
"""

__version__ = "0.1.0"
