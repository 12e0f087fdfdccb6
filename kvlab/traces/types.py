"""What a request trace is: `Request` and `Trace`, shared by the loader (`kvlab.traces`) and
the generators (`kvlab.traces.generate`), so neither has to import the other's module."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK_TOKENS = 512  # tokens per hash_id block in the Mooncake traces


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a trace."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]  # one per BLOCK_TOKENS-token block, each naming its whole prefix


@dataclass(frozen=True)
class Trace:
    """A validated trace. `generated` marks synthetic data made by kvlab, never real."""

    name: str
    requests: tuple[Request, ...]
    source: str  # file path, or a description of the generator and its seed
    generated: bool = False
    block_tokens: int = BLOCK_TOKENS
    #: the first `lead_in` requests are replayed before measuring (they warm the caches and
    #: load the cluster) and are left out of the results (kvlab.sim.workload.trace_slice)
    lead_in: int = 0

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def arrival_s(self) -> np.ndarray:
        return np.fromiter((r.arrival_s for r in self.requests), float, len(self.requests))

    @property
    def input_tokens(self) -> np.ndarray:
        return np.fromiter((r.input_tokens for r in self.requests), np.int64, len(self.requests))

    @property
    def output_tokens(self) -> np.ndarray:
        return np.fromiter((r.output_tokens for r in self.requests), np.int64, len(self.requests))

    @property
    def label(self) -> str:
        """How figures should name it: generated traces say so."""
        return f"{self.name} (generated)" if self.generated else self.name
