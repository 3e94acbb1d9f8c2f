"""The method interface: what every efficiency technique implements to join a study."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

    from paretolab.plugin_api.context import TrialContext
    from paretolab.plugin_api.subject import Subject

KINDS = ("weights", "decoding", "tokenizer", "training", "architecture", "routing", "coding", "tabular", "sequence", "paired_retrieval")
COST_KINDS = ("real", "simulated")


@dataclass(frozen=True)
class Paper:
    """Where a method comes from."""

    title: str
    venue: str = ""
    url: str = ""

    def __str__(self) -> str:
        parts = [self.title, self.venue, self.url]
        return " — ".join(p for p in parts if p)


class Method:
    """Base class for a method plugin.

    Subclasses set the class attributes and implement ``transform``. ``transform`` gets its
    own copy of the subject (the worker copies the base model per trial), may change it in
    place, and returns it; the tokenizer alone is shared between trials, so a method replaces it
    (with a changed copy) instead of changing it. ``params`` holds this method's parameters without prefixes.

    ``cost_is`` says whether the cost saving is ``real`` (a stored format or a kernel that
    actually runs) or ``simulated`` (fake quantization, masks on dense weights); the
    dashboard and the CLI show it so nobody mistakes one for the other.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "weights"
    paper: ClassVar[Paper | str | None] = None
    cost_is: ClassVar[str] = "simulated"
    requires: ClassVar[tuple[str, ...]] = ()  # importable modules this method needs
    # Metrics this method adds to a trial (from evaluate, measure or its generator's stats):
    # a pipeline may only take an objective that its task, measures or methods declare.
    metrics: ClassVar[tuple[str, ...]] = ()
    # Which modules its transform changes ("linear": the model's nn.Linear layers), and which it swaps for modules of its
    # own (MACKO's sparse format): a pipeline that runs a method after one that replaced what it works on is refused.
    works_on: ClassVar[tuple[str, ...]] = ()
    replaces: ClassVar[tuple[str, ...]] = ()
    # True for a method whose saving leaves the output exactly the base model's (a lossless format); the contract suite
    # then checks that equality, and otherwise that a method reporting a saving changes what the model computes.
    lossless: ClassVar[bool] = False
    # The parameters at which this method leaves the output the base model's (RTN at ``{"bits": 16}``, pruning at
    # ``{"sparsity": 0.0}``; empty: no such setting). The contract suite applies them over its parameters and checks
    # that the logits stay within a tight tolerance of the base model's.
    lossless_setting: ClassVar[dict[str, Any]] = {}
    # True for a method that changes nothing a trial can observe in its subject: the identity, or one that computes
    # the same function on another schedule (UPipe's attention a chunk of heads at a time). The contract suite then
    # checks that its transform leaves the output, modules, config, size and generator as they were.
    preserves_output: ClassVar[bool] = False
    # Parameters of the search space whose two far-apart values may give the same model on a small one, each with the
    # reason (a seed, a knob that only acts on long inputs): the contract's check that every parameter changes the
    # result skips them. Every other parameter must change the weights or the outputs when it changes.
    inert_params: ClassVar[dict[str, str]] = {}
    # True for a method whose size is what another library's artefact stores (``subject.info["<name>_artifact"]``: a
    # compressed-tensors checkpoint, a GGUF) while the model holds that library's decompressed weights to evaluate
    # (:mod:`paretolab.plugin_api.external`): the contract then checks the artefact, not the bytes the model holds.
    sized_by_artifact: ClassVar[bool] = False
    # False only for a method whose output at a position reads later tokens by design (a prefill that selects tokens
    # by the prompt's last queries): the contract's causality check is then skipped, and says so.
    causal: ClassVar[bool] = True
    # True for a method whose transform changes only the modules in ``subject.scope`` when it is set (``linear_weights(...,
    # scope=subject.scope)``): a pipeline may then give its parameters per layer group (``layers:``), and
    # ``paretolab sensitivity`` may apply it to one group at a time. ``layer_modules`` lists what it would change.
    layerwise: ClassVar[bool] = False

    def search_space(self) -> dict[str, BaseDistribution]:
        """The method's own parameters as Optuna distributions (used where a pipeline is silent)."""
        return {}

    def defaults(self) -> dict[str, Any]:
        """Values used for parameters that neither the pipeline nor the search space set."""
        return {}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        """Apply the method to ``subject`` (a private copy) and return it."""
        raise NotImplementedError(f"method {self.name!r} does not implement transform()")

    def evaluate(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        """Extra quality metrics, after the pipeline's task ran. Default: none."""
        return {}

    def measure(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        """Extra cost metrics, after the standard measures ran. Default: none."""
        return {}

    def layer_modules(self, subject: Subject) -> list[str]:
        """The modules a per-layer stage divides into groups (default: the Linear layers but the LM head)."""
        from paretolab.plugin_api.layers import linear_modules

        return [name for name, _ in linear_modules(subject.model)]

    def cost_of(self, params: dict[str, Any], subject: Subject) -> str:
        """Whether this trial's saving is ``real`` or ``simulated``, after ``transform`` ran with ``params`` (default: ``cost_is``).

        Override it where the answer depends on the setting: a format stored for some parameters and only
        simulated for others, or a kernel that runs on one machine and is emulated on another.
        """
        return self.cost_is

    def library(self) -> str:
        """The library that runs this method and its version, where another library does (an incumbent run through its own
        code, :mod:`paretolab.plugin_api.external`): ``"llmcompressor 0.14.0.1 (own environment incumbents, make incumbents)"``;
        "" for a method paretolab implements."""
        return ""

    def describe(self) -> dict[str, Any]:
        """A plain-data description for `paretolab plugins` and the dashboard."""
        return {
            "name": self.name,
            "kind": self.kind,
            "paper": str(self.paper) if self.paper else "",
            "cost_is": self.cost_is,
            **({"library": self.library()} if self.library() else {}),
            **({"layerwise": True} if self.layerwise else {}),
            "metrics": list(self.metrics),
            **({"works_on": list(self.works_on)} if self.works_on else {}),
            **({"replaces": list(self.replaces)} if self.replaces else {}),
            **({"lossless": True} if self.lossless else {}),
            **({"lossless_setting": dict(self.lossless_setting)} if self.lossless_setting else {}),
            **({"preserves_output": True} if self.preserves_output else {}),
            **({"inert_params": dict(self.inert_params)} if self.inert_params else {}),
            "search_space": {k: _describe_distribution(d) for k, d in self.search_space().items()},
        }


class NoMethod(Method):
    """The identity: keeps the model as it is (the reference point of every frontier)."""

    name = "none"
    kind = "weights"
    cost_is = "real"
    preserves_output = True  # the identity

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        return subject


def validate_method(method: object, owner: str) -> None:
    """Refuse a method object that breaks the interface, naming the plugin and the field."""
    from paretolab.errors import PluginError

    where = f"method {getattr(method, 'name', '?')!r} from plugin {owner!r}"
    if not isinstance(method, Method):
        raise PluginError(f"{where}: register() needs a paretolab.Method instance, got {type(method).__name__}")
    if method.kind not in KINDS:
        raise PluginError(f"{where}: kind must be one of {', '.join(KINDS)}; got {method.kind!r}")
    if method.cost_is not in COST_KINDS:
        raise PluginError(f"{where}: cost_is must be 'real' or 'simulated'; got {method.cost_is!r}")
    try:
        space = method.search_space()
    except Exception as exc:
        raise PluginError(f"{where}: search_space() raised {exc!r}") from exc
    from optuna.distributions import BaseDistribution

    for key, dist in space.items():
        if not isinstance(dist, BaseDistribution):
            raise PluginError(f"{where}: search_space()[{key!r}] must be an optuna distribution, got {dist!r}")
    if not isinstance(method.lossless_setting, dict):
        raise PluginError(f"{where}: lossless_setting must be a dict of parameters, got {method.lossless_setting!r}")
    for key, reason in dict(method.inert_params).items():
        if key not in space:
            raise PluginError(f"{where}: inert_params names {key!r}, which is not in search_space()")
        if not isinstance(reason, str) or not reason.strip():
            raise PluginError(f"{where}: inert_params[{key!r}] must say why the parameter may change nothing on a small model")


def _describe_distribution(dist: Any) -> str:
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    if isinstance(dist, CategoricalDistribution):
        numeric = all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in dist.choices)
        # numeric choices are the searched values, not a validity range: a pipeline may fix another number the method accepts
        return ("searched over " if numeric else "one of ") + ", ".join(_bound(c) for c in dist.choices) + (" (other numbers allowed)" if numeric else "")
    if isinstance(dist, (FloatDistribution, IntDistribution)):
        text = f"{_bound(dist.low)}..{_bound(dist.high)}"
        if dist.log:
            text += " (log)"
        if dist.step not in (None, 1) or isinstance(dist, FloatDistribution) and dist.step:
            text += f" step {_bound(dist.step)}"
        return text
    return repr(dist)


def _bound(value: Any) -> str:
    """A search space's value as written in the pipeline (``0.0001``, ``1.0``, ``'row'``), never in e-notation: ``1e-05`` ->
    ``0.00001``, every digit kept (Python's shortest repr, written out in decimal)."""
    from decimal import Decimal

    text = repr(value)
    return format(Decimal(text), "f") if isinstance(value, float) and "e" in text else text
