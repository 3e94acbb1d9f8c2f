"""How a subject generates text: batched decoding with a KV cache, and the generation policy tasks call.

- :mod:`paretolab.generation.decoding` — the token chooser (greedy or seeded sampling), one forward with a cache, the batch decoder.
- :mod:`paretolab.generation.generate` — ``generate`` (through the subject's policy, which a decoding method may replace) and ``greedy_decode``.
"""

from paretolab.generation.decoding import (
    BatchDecoder,
    Sampling,
    TokenChooser,
    forward_with_cache,
)
from paretolab.generation.generate import (
    BatchedGenerator,
    Generation,
    Generator,
    GreedyGenerator,
    decode_batch,
    generate,
    greedy_decode,
)

__all__ = [
    "BatchDecoder",
    "BatchedGenerator",
    "Generation",
    "Generator",
    "GreedyGenerator",
    "Sampling",
    "TokenChooser",
    "decode_batch",
    "forward_with_cache",
    "generate",
    "greedy_decode",
]
