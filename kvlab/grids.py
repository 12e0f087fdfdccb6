"""The value grids the book evaluates: what the static pages' sliders offer, what the
figures sweep, and what the labs' exercises refer to ("the knee on the batch grid")."""

from __future__ import annotations

BATCH_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
CONTEXT_GRID = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
EFFICIENCY_GRID = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)
HIT_GRID = tuple(round(0.05 * i, 2) for i in range(21))
DTYPE_CHOICES = ("fp16", "bf16", "fp8", "int8", "int4")
