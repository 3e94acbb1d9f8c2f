"""Layer groups: which of a model's modules a per-layer setting names, and the assignment of modules to groups.

A group is written as a *selector* of up to three words (a pipeline's ``layers:`` keys, ``paretolab sensitivity --by``)::

    attention            every attention projection of every decoder layer (q/k/v/o_proj)
    mlp                  every MLP projection (gate/up/down_proj)
    down_proj            one kind of projection by its module name
    0-9                  every Linear of decoder layers 0 to 9 (inclusive)
    12                   every Linear of decoder layer 12
    0-3 27-29            every Linear of layers 0 to 3 and 27 to 29 (``0-3,27-29`` reads the same; the name keeps spaces)
    0-9 mlp              the MLP projections of layers 0 to 9
    each 0-29            one group per decoder layer (0, 1, ..., 29), each with its own setting
    each 0-29 attention  one group per layer's attention (0 attention, 1 attention, ...)

A module belongs to a group when its layer index (the number after ``layers.``, ``h.`` or
``blocks.`` in its name) is in the range and its kind matches; ``rest`` is every module of the
method's that no group names. Two groups claiming one module are refused: every module has one setting.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from paretolab.errors import ConfigError

REST = "rest"
KINDS = {
    "attention": ("self_attn", "attn", "attention", "self_attention"),
    "mlp": ("mlp", "feed_forward", "ffn", "block_sparse_moe"),
}
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)(?:\.|$)")
_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_SPAN = re.compile(r"^\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*$")
MAX_LAYERS = 512  # decoder layers a selector may name (indices 0-511): far past any model's, and bounded work for any text
HELP = ("a selector like 'attention', 'mlp', 'down_proj', '0-9', '12', '0-3 27-29', '0-9 mlp' or 'each 0-29' "
        "(one group per layer); see the pipeline reference, `layers:`")


@dataclass(frozen=True)
class Selector:
    """One group: a set of decoder layers (None: all layers) and a module kind (None: every kind)."""

    layers: frozenset[int] | None = None
    kind: str | None = None

    @property
    def name(self) -> str:
        """The canonical text: what Optuna parameter names and records carry (``0-9 mlp``, ``0-3 27-29``)."""
        span = "" if self.layers is None else spans(self.layers)
        return " ".join(p for p in (span, self.kind or "") if p)

    def matches(self, module: str) -> bool:
        if self.layers is not None and layer_index(module) not in self.layers:
            return False
        return self.kind is None or self.kind in module_kinds(module)

    def overlaps(self, other: Selector) -> bool:
        """Whether some module could be in both (judged from the text alone; resolution checks the real modules)."""
        if self.layers is not None and other.layers is not None and not self.layers & other.layers:
            return False
        if self.kind is None or other.kind is None or self.kind == other.kind:
            return True
        a, b = sorted((self.kind, other.kind), key=lambda k: k not in KINDS)
        return a in KINDS and b not in KINDS and _kind_holds(a, b)


def spans(layers: Iterable[int]) -> str:
    """``{0, 1, 2, 3, 7, 27, 28, 29}`` -> ``0-3 7 27-29`` (spaces: MLflow takes no comma in a parameter's name)."""
    out: list[str] = []
    for i in sorted(layers):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == i - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        elif out and "-" not in out[-1] and int(out[-1]) == i - 1:
            out[-1] = f"{out[-1]}-{i}"
        else:
            out.append(str(i))
    return " ".join(out)


def _kind_holds(kind: str, leaf: str) -> bool:
    """Whether a projection named ``leaf`` is (by the usual naming) part of ``kind``: q_proj of attention, down_proj of mlp."""
    usual = {"attention": ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "c_attn"),
             "mlp": ("gate_proj", "up_proj", "down_proj", "fc1", "fc2", "c_fc", "w1", "w2", "w3")}
    return leaf in usual.get(kind, ()) or leaf not in {x for names in usual.values() for x in names}


def parse_selector(text: object, where: str) -> list[Selector]:
    """The group(s) ``text`` names: one, or one per layer for ``each A-B [kind]``."""
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str) or not text.split():
        raise ConfigError(f"{where}: {text!r} is not a layer group; give {HELP}")
    words = text.split()
    each = words[0] == "each"
    if each:
        words = words[1:]
    parts = []
    while words and _SPAN.match(words[0]):
        parts.append(words.pop(0))
    span = ",".join(parts) or None
    kind = words.pop(0) if words else None
    if words or (kind is not None and not _WORD.match(kind)) or (span is None and kind is None):
        raise ConfigError(f"{where}: {text!r} is not a layer group; give {HELP}")
    if kind in ("each", REST):
        raise ConfigError(f"{where}: {text!r}: '{kind}' goes alone ('rest') or first ('each 0-29'); give {HELP}")
    layers: set[int] | None = None
    if span is not None:
        layers = set()
        for part in span.split(","):
            low, high = _RANGE.match(part).groups()
            for number in (low, high):  # judged before int() or range(): `each 0-99999999999999999999` is refused, not built
                if number is not None and (len(number) > 12 or int(number) >= MAX_LAYERS):
                    shown = number if len(number) <= 40 else f"{number[:20]}...({len(number)} digits)"
                    raise ConfigError(f"{where}: {shown} is past the last layer a selector may name ({MAX_LAYERS - 1}); "
                                      f"give layer numbers of the model (from 0), e.g. 'each 0-29'")
            first, last = int(low), int(high if high is not None else low)
            if first > last:
                raise ConfigError(f"{where}: {text!r}: the range {part} runs backwards; write {last}-{first}")
            layers.update(range(first, last + 1))
    if each:
        if layers is None:
            raise ConfigError(f"{where}: {text!r}: 'each' needs a range of layers, e.g. 'each 0-29' or 'each 0-29 mlp'")
        return [Selector(frozenset({i}), kind) for i in sorted(layers)]
    return [Selector(None if layers is None else frozenset(layers), kind)]


def layer_index(module: str) -> int | None:
    """The decoder layer a module sits in (``model.layers.3.mlp.up_proj`` -> 3); None outside the layer stack."""
    found = _LAYER.search(module)
    return int(found.group(1)) if found else None


def module_kinds(module: str) -> set[str]:
    """The kinds a module answers to: its own name (``up_proj``) and ``attention`` / ``mlp`` by its parents."""
    parts = module.split(".")
    kinds = {parts[-1]}
    for kind, parents in KINDS.items():
        if any(p in parents for p in parts[:-1]):
            kinds.add(kind)
    return kinds


def check_disjoint(selectors: Iterable[Selector], where: str) -> None:
    """Refuse two groups that could share a module (each module has one setting)."""
    seen: list[Selector] = []
    for sel in selectors:
        for earlier in seen:
            if sel.overlaps(earlier):
                raise ConfigError(f"{where}: groups {earlier.name!r} and {sel.name!r} can both hold a module; "
                                  "give each module one group (e.g. '0-9 mlp' and '10-29 mlp', or 'attention' and 'mlp')")
        seen.append(sel)


def assign(modules: Iterable[str], selectors: Iterable[Selector], where: str) -> dict[str, str]:
    """module -> the name of its group (``rest`` for the modules no group names), in the order of ``modules``.

    Refuses a group that holds no module (a typo, a range past the last layer) and a module two groups hold."""
    modules = list(modules)
    selectors = list(selectors)
    out: dict[str, str] = {}
    for module in modules:
        owners = [s.name for s in selectors if s.matches(module)]
        if len(owners) > 1:
            raise ConfigError(f"{where}: module {module!r} is in groups {owners[0]!r} and {owners[1]!r}; give it one group")
        out[module] = owners[0] if owners else REST
    empty = [s.name for s in selectors if s.name not in out.values()]
    if empty:
        layers = sorted({i for m in modules if (i := layer_index(m)) is not None})
        span = f"layers {layers[0]}-{layers[-1]}" if layers else "no numbered layers"
        kinds = sorted({k for m in modules for k in module_kinds(m)})
        raise ConfigError(f"{where}: group {empty[0]!r} holds none of the {len(modules)} modules this method changes "
                          f"(they have {span}; kinds {', '.join(kinds)}); fix the range or the kind")
    return out


def groups_of(assignment: dict[str, str]) -> dict[str, list[str]]:
    """group -> its modules, groups in first-seen order."""
    out: dict[str, list[str]] = {}
    for module, group in assignment.items():
        out.setdefault(group, []).append(module)
    return out


def linear_modules(model: object, *, skip_lm_head: bool = True, scope: frozenset[str] | None = None) -> Iterator[tuple[str, object]]:
    """The Linear layers a weights method touches (the LM head and tied embeddings are left alone), within ``scope`` if given.

    ``scope`` is :attr:`Subject.scope`: the modules of the group a per-layer stage is applying now (None: all)."""
    import torch

    for name, module in model.named_modules():  # type: ignore[attr-defined]
        if isinstance(module, torch.nn.Linear):
            if skip_lm_head and name.split(".")[-1] in ("lm_head", "embed_out", "output"):
                continue
            if scope is not None and name not in scope:
                continue
            yield name, module
