"""How much other work a timed study tolerates: the one threshold of `results run` (waiting for a quiet machine),
`results status` (a bundle timed on a busy machine) and the documents' engine load line. Torch-free and importing
nothing, so every reader of results can use it."""

MAX_LOAD = 1.0  # 1-min load average of other work a timed study tolerates: before it starts, and beside its own CPUs while it runs
