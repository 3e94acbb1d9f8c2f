"""A Hugging Face cache layer that holds a recurrent state instead of keys and values (linear attention decoding).

:class:`RecurrentStateLayer` replaces one layer of the model's ``DynamicCache`` the first time a
recurrent attention layer sees that cache, so the generation code (``paretolab.decoding``) keeps
working unchanged: the cache tracks how many positions it has seen (``get_seq_length``, the masks),
and ``batch_select_indices`` / ``batch_repeat_interleave`` / ``reorder_cache`` act on the state's
batch rows. ``crop`` (a rollback) restores the state saved after the forward that ended at the
target length; the last ``MAX_SAVED`` such states are kept (a state per decode step costs far
more than a token's keys and values), and a state not kept cannot be recovered and is refused.
``crop_front`` drops leading all-padding positions (padding never changes the state).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from paretolab.errors import ConfigError

State = tuple[torch.Tensor, ...]
MAX_SAVED = 64  # rollback points kept per layer (the most recent forwards)


class RecurrentStateLayer(DynamicLayer):
    """One layer's recurrent state (tensors with the batch first), its length in positions, and the states saved per length."""

    is_croppable = True

    def __init__(self) -> None:
        super().__init__()
        self.state: State | None = None
        self.length = 0
        self.saved: dict[int, State] = {}  # length -> state after the forward that ended there (rollback points)
        self.is_initialized = True
        self.keys = self.values = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        raise ConfigError("a recurrent (linear-attention) cache layer holds a state, not keys and values; this attention cannot use it")

    def advance(self, state: State, positions: int) -> None:
        """Store the state after ``positions`` more positions (padding included)."""
        self.state = state
        self.length += positions
        self.saved[self.length] = state
        if len(self.saved) > MAX_SAVED:
            del self.saved[min(self.saved)]

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ConfigError(f"recurrent cache: crop takes a negative count of positions to remove, got {tokens_to_remove}")
        target = self.length + tokens_to_remove
        if target == self.length:
            return
        if target not in self.saved:
            raise ConfigError(f"recurrent cache: cannot roll back to length {target}; states are kept only at the end of the last "
                              f"{MAX_SAVED} forwards ({min(self.saved, default=0)}..{self.length}); roll back to one of those")
        self.state, self.length = self.saved[target], target
        self.saved = {n: s for n, s in self.saved.items() if n <= target}

    def crop_front(self, positions: int) -> None:
        """Forget ``positions`` leading positions that were padding in every row (the state is unchanged by padding)."""
        self.length -= positions
        self.saved = {n - positions: s for n, s in self.saved.items() if n - positions >= 0}

    def _rows(self, pick: Any) -> None:
        self.state = None if self.state is None else tuple(pick(t) for t in self.state)
        self.saved = {n: tuple(pick(t) for t in s) for n, s in self.saved.items()}

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._rows(lambda t: t[indices.to(t.device)])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._rows(lambda t: t.repeat_interleave(repeats, dim=0))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._rows(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def reset(self) -> None:
        self.state, self.length, self.saved = None, 0, {}


def recurrent_layer(cache: Any, layer_idx: int) -> RecurrentStateLayer:
    """The cache's layer ``layer_idx`` as a recurrent-state layer (put in place of an unused key/value layer on first use)."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise ConfigError(f"linear attention: the cache is a {type(cache).__name__}, not a transformers Cache with .layers")
    while len(layers) <= layer_idx:
        layers.append(RecurrentStateLayer())
    layer = layers[layer_idx]
    if not isinstance(layer, RecurrentStateLayer):
        if layer.get_seq_length() > 0:
            raise ConfigError(f"linear attention: cache layer {layer_idx} already holds keys/values of another attention")
        layer = layers[layer_idx] = RecurrentStateLayer()
    return layer
