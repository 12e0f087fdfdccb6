"""How many prompt tokens a prefix-cache hit serves: the one rule every part of kvlab uses.

A prefix cache can hold a whole prompt, but the engine still computes the prompt's last
token: its logits give the first output token. So a hit of `hit_tokens` matched tokens
serves `min(hit_tokens, prompt_tokens - 1)` of them (never fewer than 0), and prefill
always computes at least one token. Replay, the simulator, trace statistics, figures and
labs all count saved prefill with this function, so their hit ratios agree on one trace.
"""

from __future__ import annotations

import numpy as np

_SCALARS = (int, np.integer)


def served_tokens(hit_tokens, prompt_tokens):
    """Prompt tokens a hit of `hit_tokens` matched tokens takes from the cache (vectorised:
    numpy arrays broadcast; integers give a Python int)."""
    if isinstance(hit_tokens, _SCALARS) and isinstance(prompt_tokens, _SCALARS):
        return max(0, min(int(hit_tokens), int(prompt_tokens) - 1))
    return np.maximum(np.minimum(np.asarray(hit_tokens), np.asarray(prompt_tokens) - 1), 0)


def served_from_blocks(hit_blocks, block_tokens: int, prompt_tokens):
    """The same for a block-granular cache: `hit_blocks` leading blocks of `block_tokens`
    tokens each matched (the last block of a prompt may be partial)."""
    if isinstance(hit_blocks, _SCALARS):
        return served_tokens(int(hit_blocks) * block_tokens, prompt_tokens)
    return served_tokens(np.asarray(hit_blocks) * block_tokens, prompt_tokens)
