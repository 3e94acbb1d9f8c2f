"""Routing policies over recorded answers: SDR, LazyStack and their baselines. All fit on a calibration split.

Every policy has one knob (a cost weight, a threshold or a rate) whose ``grid`` it is swept over
for its cost-accuracy curve (``paretolab.plugins.routing.task``), and ``route`` at the trial's
own value for the trial's point.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paretolab.plugins.routing.bed import Bed, Outcome

GRID = 21  # knob values per sweep


def _fit_correctness(features: np.ndarray, target: np.ndarray) -> Any:
    """P(target | features): a standardised, L2-regularised logistic regression (a constant when one class is missing)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if target.min() == target.max():
        return float(target[0])
    return make_pipeline(StandardScaler(), LogisticRegression(C=0.05, max_iter=2000)).fit(features, target)


def _predict(model: Any, features: np.ndarray) -> np.ndarray:
    return np.full(len(features), model) if isinstance(model, float) else model.predict_proba(features)[:, 1]


def _norm_costs(bed: Bed) -> dict[str, float]:
    """Each role's mean cost over the most expensive role's: cost weights are in units of the largest model."""
    means = {role: float(np.mean(bed.cost(role))) for role in bed.roles}
    top = max(means.values()) or 1.0
    return {role: value / top for role, value in means.items()}


def _best_large(bed: Bed) -> str:
    return max(bed.roles[1:], key=lambda r: bed.correct(r).mean())


def _one_model(bed: Bed, role: str, also: tuple[str, ...] = ()) -> Outcome:
    ran = np.zeros((len(bed), len(bed.roles)), dtype=bool)
    for r in (role, *also):
        ran[:, bed.roles.index(r)] = True
    return Outcome(bed.data[role]["pred"].copy(), ran)


@dataclass
class Policy:
    """Base: ``fit`` on calibration, ``route`` at the current ``knob`` value, ``grid`` for the sweep."""

    knob: float = 0.0
    seed: int = 0

    def fit(self, calib: Bed) -> None:
        """Learn from the calibration split (default: nothing)."""

    def route(self, bed: Bed) -> Outcome:
        raise NotImplementedError

    def grid(self) -> list[float]:
        return [self.knob]


@dataclass
class Fixed(Policy):
    """One model answers everything: ``role`` (``best``: the most accurate on calibration). Baselines small-only / large-only / best single."""

    role: str = "small"

    def fit(self, calib: Bed) -> None:
        if self.role == "best":
            self.role = max(calib.roles, key=lambda r: calib.correct(r).mean())
        elif self.role not in calib.roles:
            from paretolab.errors import ConfigError

            raise ConfigError(f"route_fixed.role: {self.role!r} is no role of the pipeline's models ({', '.join(calib.roles)}) nor `best`")

    def route(self, bed: Bed) -> Outcome:
        return _one_model(bed, self.role)


@dataclass
class SDR(Policy):
    """Selective Deferred Routing: the small model answers; a decider on its hidden representation of the query keeps
    the answer or defers once to the large model with the best predicted accuracy net of ``knob`` x its cost.

    The paper's: the small local model always runs; a light decider reads its hidden state of the request and
    either keeps the local answer or defers once to the most suitable remote model; a cost weight trades accuracy for
    cost. Ours (guessed where the abstract says nothing): the decider is one logistic regression per model on the
    small model's mean-pooled final hidden state, predicting whether that model answers correctly; the rule is
    argmax over {keep: p_small, defer to j: p_j - knob * cost_j} with cost_j the model's mean cost over the most
    expensive model's (the small model's own cost is paid either way).
    """

    deciders: dict[str, Any] = field(default_factory=dict)
    costs: dict[str, float] = field(default_factory=dict)

    def fit(self, calib: Bed) -> None:
        features = calib.data[calib.small]["hidden"]
        self.deciders = {role: _fit_correctness(features, calib.correct(role)) for role in calib.roles}
        self.costs = _norm_costs(calib)

    def route(self, bed: Bed) -> Outcome:
        features = bed.data[bed.small]["hidden"]
        utility = np.stack([_predict(self.deciders[r], features) - (self.knob * self.costs[r] if i else 0.0)
                            for i, r in enumerate(bed.roles)], axis=1)
        choice = utility.argmax(1)
        answer = np.asarray([bed.data[bed.roles[c]]["pred"][q] for q, c in enumerate(choice)])
        ran = np.zeros((len(bed), len(bed.roles)), dtype=bool)
        ran[:, 0] = True
        ran[np.arange(len(bed)), choice] = True
        return Outcome(answer, ran)

    def grid(self) -> list[float]:
        return [float(x) for x in np.linspace(0.0, 1.0, GRID)]


@dataclass
class QueryOnly(SDR):
    """Baseline: a router that reads only the query text (hashed word uni- and bigrams) and sends it to one model,
    argmax over models of predicted accuracy - ``knob`` x cost; the small model does not run first."""

    def _features(self, bed: Bed) -> np.ndarray:
        from sklearn.feature_extraction.text import HashingVectorizer

        return HashingVectorizer(n_features=2**12, ngram_range=(1, 2), alternate_sign=False, norm="l2").transform(bed.texts).toarray()

    def fit(self, calib: Bed) -> None:
        features = self._features(calib)
        self.deciders = {role: _fit_correctness(features, calib.correct(role)) for role in calib.roles}
        self.costs = _norm_costs(calib)

    def route(self, bed: Bed) -> Outcome:
        features = self._features(bed)
        utility = np.stack([_predict(self.deciders[r], features) - self.knob * self.costs[r] for r in bed.roles], axis=1)
        choice = utility.argmax(1)
        answer = np.asarray([bed.data[bed.roles[c]]["pred"][q] for q, c in enumerate(choice)])
        ran = np.zeros((len(bed), len(bed.roles)), dtype=bool)
        ran[np.arange(len(bed)), choice] = True
        return Outcome(answer, ran)


@dataclass
class Cascade(Policy):
    """Baseline: the small model answers; below ``knob`` confidence (its top choice probability) defer to the large
    model most accurate on calibration."""

    target: str = ""
    confidences: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def fit(self, calib: Bed) -> None:
        self.target = _best_large(calib)
        self.confidences = np.asarray([p.max() for p in calib.data[calib.small]["probs"]])

    def route(self, bed: Bed) -> Outcome:
        confidence = np.asarray([p.max() for p in bed.data[bed.small]["probs"]])
        defer = confidence < self.knob
        keep = _one_model(bed, bed.small)
        large = _one_model(bed, self.target, also=(bed.small,))
        return Outcome(np.where(defer, large.answer, keep.answer), np.where(defer[:, None], large.ran, keep.ran))

    def grid(self) -> list[float]:  # thresholds at the calibration confidences' quantiles: deferral rates 0..1
        return [0.0, *np.quantile(self.confidences, np.linspace(0, 1, GRID - 1)[1:]).tolist(), 1.01]


@dataclass
class Random(Cascade):
    """Baseline: defer a ``knob`` share of the questions, drawn at random (seeded), to the same large model as the
    cascade: random routing at the cost of any deferral rate."""

    def route(self, bed: Bed) -> Outcome:
        defer = np.random.default_rng(self.seed).random(len(bed)) < self.knob
        keep = _one_model(bed, bed.small)
        large = _one_model(bed, self.target, also=(bed.small,))
        return Outcome(np.where(defer, large.answer, keep.answer), np.where(defer[:, None], large.ran, keep.ran))

    def grid(self) -> list[float]:
        return [float(x) for x in np.linspace(0.0, 1.0, GRID)]


def _log_probs(bed: Bed, role: str) -> list[np.ndarray]:
    return [np.log(np.clip(p, 1e-12, None)) for p in bed.data[role]["probs"]]


@dataclass
class Stacker:
    """A meta-learner over a set of models: per choice, features = each model's log-probability of it; a logistic
    regression scores choices (trained on calibration rows "is this the gold choice"), normalised over a question's choices."""

    roles: tuple[str, ...]
    model: Any = None

    def _rows(self, bed: Bed) -> tuple[np.ndarray, np.ndarray]:
        logs = [_log_probs(bed, r) for r in self.roles]
        features = np.concatenate([np.stack([lp[q] for lp in logs], axis=1) for q in range(len(bed))])
        groups = np.concatenate([np.full(len(logs[0][q]), q) for q in range(len(bed))])
        return features, groups

    def fit(self, calib: Bed) -> Stacker:
        from sklearn.linear_model import LogisticRegression

        features, groups = self._rows(calib)
        target = np.concatenate([(np.arange(len(p)) == g).astype(int) for p, g in zip(calib.data[calib.small]["probs"], calib.gold)])
        self.model = LogisticRegression(C=1.0, max_iter=2000).fit(features, target)
        return self

    def predict(self, bed: Bed) -> tuple[np.ndarray, np.ndarray]:
        """Each question's chosen choice and the meta-learner's confidence in it (its normalised probability)."""
        features, groups = self._rows(bed)
        score = self.model.decision_function(features)
        answer, confidence = np.zeros(len(bed), dtype=int), np.zeros(len(bed))
        for q in range(len(bed)):
            s = score[groups == q]
            p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            answer[q], confidence[q] = int(p.argmax()), float(p.max())
        return answer, confidence


@dataclass
class Stack(Policy):
    """Baseline: the full stacking ensemble, every model runs, one meta-learner over all of them."""

    stacker: Stacker | None = None

    def fit(self, calib: Bed) -> None:
        self.stacker = Stacker(tuple(calib.roles)).fit(calib)

    def route(self, bed: Bed) -> Outcome:
        answer, _ = self.stacker.predict(bed)
        return Outcome(answer, np.ones((len(bed), len(bed.roles)), dtype=bool))


@dataclass
class LazyStack(Policy):
    """LazyStack: run the models in an order; after each, the meta-learner of the models run so far answers and the
    cascade stops when its confidence reaches ``knob``.

    The paper's: per-trajectory aggregators (meta-learners) for the few common execution paths; the routing policy
    (which model next, when to exit) from value iteration over an MDP of those paths. Ours: with three models every
    subset gets its meta-learner (7 of them, :class:`Stacker`); instead of value iteration we search every fixed order
    exhaustively (3! = 6) on the calibration split and keep the one maximising accuracy - ``cost_weight`` x cost (over
    the full ensemble's). That is the optimal policy among fixed-order, fixed-threshold cascades, not a state-dependent
    one: value iteration could pick the next model by the confidence reached so far. ``order`` "cheapest" fixes the
    cheapest-first order (the baseline).
    """

    cost_weight: float = 0.5
    order: str = "learned"
    stackers: dict[frozenset[str], Stacker] = field(default_factory=dict)
    chosen: tuple[str, ...] = ()
    _memo: dict[tuple[int, frozenset[str]], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    def _predict(self, bed: Bed, models: frozenset[str]) -> tuple[np.ndarray, np.ndarray]:
        key = (id(bed), models)  # a sweep asks the same meta-learner about the same bed many times
        if key not in self._memo:
            self._memo[key] = self.stackers[models].predict(bed)
        return self._memo[key]

    def fit(self, calib: Bed) -> None:
        roles = calib.roles
        self.stackers = {frozenset(s): Stacker(tuple(r for r in roles if r in s)).fit(calib)
                         for k in range(1, len(roles) + 1) for s in itertools.combinations(roles, k)}
        if self.order == "cheapest":
            self.chosen = tuple(sorted(roles, key=lambda r: float(np.mean(calib.cost(r)))))
        else:
            self.chosen = self.best_order(calib, self.knob)

    def best_order(self, calib: Bed, threshold: float) -> tuple[str, ...]:
        full = float(sum(np.mean(calib.cost(r)) for r in calib.roles)) or 1.0
        def value(order: tuple[str, ...]) -> float:
            out = self.cascade(calib, order, threshold)
            return out.acc(calib) - self.cost_weight * out.cost(calib) / full
        return max(itertools.permutations(calib.roles), key=value)

    def cascade(self, bed: Bed, order: tuple[str, ...], threshold: float) -> Outcome:
        answer = np.zeros(len(bed), dtype=int)
        ran = np.zeros((len(bed), len(bed.roles)), dtype=bool)
        open_ = np.ones(len(bed), dtype=bool)
        for k in range(1, len(order) + 1):
            ran[open_, bed.roles.index(order[k - 1])] = True
            pick, confidence = self._predict(bed, frozenset(order[:k]))
            stop = open_ & ((confidence >= threshold) | (k == len(order)))
            answer[stop] = pick[stop]
            open_ &= ~stop
        return Outcome(answer, ran)

    def route(self, bed: Bed) -> Outcome:
        return self.cascade(bed, self.chosen, self.knob)

    def at_retention(self, calib: Bed, retention: float, reference: float) -> tuple[tuple[str, ...], float]:
        """The (order, threshold) of least calibration cost whose calibration accuracy is >= ``retention`` x ``reference``."""
        orders = [self.chosen] if self.order == "cheapest" else list(itertools.permutations(calib.roles))
        best: tuple[float, tuple[str, ...], float] = (math.inf, tuple(calib.roles), 1.01)
        for order in orders:
            for threshold in self.grid():
                out = self.cascade(calib, order, threshold)
                if out.acc(calib) >= retention * reference and out.cost(calib) < best[0]:
                    best = (out.cost(calib), order, threshold)
        return best[1], best[2]

    def grid(self) -> list[float]:
        return [float(x) for x in np.linspace(0.3, 1.0, GRID - 1)] + [1.01]
