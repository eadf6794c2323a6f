"""Model-based search: a cost model ranks a candidate pool; the best-ranked are measured.

Each round: refit the cost model (``cost_model.CostModel``: an ensemble of gradient-boosting
models, the first on all data and the others on bootstrap resamples, with a ranking target
over knob + domain features; a candidate's score is the optimistic bound mean - kappa * std
of the members' predictions) on everything measured, plus records of other
workloads when a ``prior`` is given (transfer); build a pool (every unseen valid config when
the space is small enough, else random unseen configs plus the neighbours of the best few
measured ones); predict; take the best-ranked configs while keeping the batch diverse (a
pick must differ from every earlier pick in at least ``min_distance`` knobs); once the
search stalls (``stall`` trials without a new best), each slot is instead a random config
with probability ``epsilon`` (epsilon-greedy exploration). Without a prior, the
first ``warmup`` successes come from random sampling; with one, the first batch is already
the model's pick.

Compile once, measure many: with ``runtime_knobs`` (the template's knobs passed to the kernel
as arguments), configs that differ only in them share one compiled module (a *variant*). At
most ``max_new_variants`` of a model batch's picks are of a variant not measured yet; the
other slots go down the ranking to the best configs of variants already compiled (their
cache blocks, mostly: the pool holds the neighbours of the best configs), which cost a run
but no compile; ``max_variants`` bounds the variants of the whole run (the tuner loop
derives it from its trial budget). Random picks (warm-up, epsilon, filling a short batch)
share the same budget: past it, a random pick keeps its random runtime knobs on a variant already proposed
(the seeded default's included; of the measured ones, the faster half), so the warm-up batch
measures a few variants at several cache blocks instead of compiling one module per random
config.
"""
from __future__ import annotations

from search_spaces.space import Config
from tuner.search.strategy import Strategy
from tuner.search.cost_model import CostModel, Featurizer


def _distance(a: Config, b: Config) -> int:
    return sum(1 for k in a if a[k] != b[k])


class _CachedFeatures:
    """Domain features per config, computed once (pools are re-ranked every round)."""

    def __init__(self, fn):
        self.fn = fn
        self.cache: dict[Config, dict] = {}

    def __call__(self, cfg):
        out = self.cache.get(cfg)
        if out is None:
            out = self.cache[cfg] = self.fn(cfg)
        return out


class ModelStrategy(Strategy):
    name = "model"

    def __init__(self, space, seed=0, pool_size: int = 2000, epsilon: float = 0.25,
                 stall: int = 16,
                 min_distance: int = 2, warmup: int = 8, features=None, prior=None,
                 prior_weight: float = 0.5, target: str = "rank", n_estimators: int = 60,
                 max_depth: int = 4, ensemble: int = 4, kappa: float = 1.0,
                 runtime_knobs: tuple[str, ...] = (), max_new_variants: int | None = None,
                 max_variants: int | None = None, **options):
        super().__init__(space, seed, **options)
        self.runtime_knobs = tuple(runtime_knobs)
        self.max_new_variants = max_new_variants if self.runtime_knobs else None
        # distinct variants proposed in all (seeded and told ones included), None: no limit
        self.max_variants = max_variants if self.runtime_knobs else None
        self.pool_size = pool_size
        self.epsilon = epsilon
        self.stall = stall
        self.min_distance = min_distance
        self.warmup = warmup
        extra = _CachedFeatures(features) if features is not None else None
        self.model = CostModel(Featurizer(space, extra), seed=seed, target=target,
                               prior=prior or (), prior_weight=prior_weight,
                               n_estimators=n_estimators, max_depth=max_depth,
                               ensemble=ensemble, kappa=kappa)
        self._dirty = True
        self._own: set[Config] = set()

    def _update(self, configs, results):
        self._dirty = True

    def ask(self, n):
        out = super().ask(n)
        self._own.update(out)    # proposed by the search (not seeded by the tuner)
        return out

    def variant(self, cfg: Config) -> tuple:
        """The config without its runtime knobs: configs with one variant share a kernel."""
        return tuple((k, v) for k, v in sorted(cfg.items()) if k not in self.runtime_knobs)

    def _pool(self) -> list[Config]:
        if self.space.size <= self.pool_size:  # small (e.g. replayed) space: rank all of it
            return [c for c in self.space if c not in self.seen]
        measured = sorted((c for c in self.history if c[1] is not None), key=lambda p: p[1])
        pool: dict[Config, None] = {}
        for cfg, _ in measured[:5]:
            for nb in self.space.neighbours(cfg):
                if nb not in self.seen:
                    pool[nb] = None
        for cfg in self.sample_unseen(self.pool_size, max_tries=20):
            pool[cfg] = None
        return list(pool)

    def _epsilon_now(self) -> float:
        """Epsilon-greedy only once the search stalls: ``stall`` trials without a new best
        (``stall=0``: always). Early batches follow the model (its optimistic bound already
        explores); replay showed random picks there only cost trials."""
        costs = [c for _, c in self.history]
        best, since = None, 0
        for c in costs:
            if c is not None and (best is None or c < best):
                best, since = c, 0
            else:
                since += 1
        return self.epsilon if since >= self.stall else 0.0

    def _new_budget(self, compiled: set) -> int | None:
        """New variants this batch may hold (seeded ones included): ``max_new_variants``,
        and no more than ``max_variants`` in all with ``compiled`` (None: no limit)."""
        caps = [c for c in (self.max_new_variants,
                            None if self.max_variants is None
                            else max(0, self.max_variants - len(compiled))) if c is not None]
        return min(caps) if caps else None

    def _promising(self, variants: set) -> list[tuple]:
        """The variants a random pick past the budget may be moved onto: those not measured
        yet and the faster half of the measured ones (by their best result), so exploration
        does not spend its cache-block draws on a variant already seen to be slow."""
        best: dict[tuple, float] = {}
        measured: set[tuple] = set()
        for cfg, cost in self.history:
            v = self.variant(cfg)
            measured.add(v)
            if v in variants and cost is not None:
                best[v] = min(cost, best.get(v, cost))
        ranked = sorted(best, key=lambda v: (best[v], v))
        keep = set(ranked[:max(1, (len(ranked) + 1) // 2)])
        return sorted(v for v in variants if v in keep or v not in measured)

    def _sample_capped(self, n: int, compiled: set, new: set, taken=()) -> list[Config]:
        """Up to ``n`` random unseen configs (not in ``taken``) of which at most the
        batch's budget (``_new_budget``, less ``len(new)``) are of variants outside
        ``compiled``; a random config past that budget is moved onto a random known variant
        (its runtime knobs kept; ``_promising``). Updates ``new``."""
        budget = self._new_budget(compiled)
        if budget is None:   # no cap: exactly the uncapped draws (replays stay reproducible)
            return [c for c in self.sample_unseen(n) if c not in taken]
        out: list[Config] = []
        known = self._promising(compiled | new)
        for cfg in self.sample_unseen(4 * n + 8):
            if len(out) >= n:
                break
            v = self.variant(cfg)
            if v not in compiled and v not in new and len(new) >= budget:
                if not known:
                    continue
                cfg = Config({**dict(self.rng.choice(known)),
                              **{k: cfg[k] for k in self.runtime_knobs}})
                if not self.space.is_valid(cfg):
                    continue
            if cfg in self.seen or cfg in out or cfg in taken:
                continue
            if self.variant(cfg) not in compiled:
                new.add(self.variant(cfg))
            out.append(cfg)
        return out

    def _propose(self, n):
        n_ok = sum(1 for _, c in self.history if c is not None)
        # variants compiled (measured or told) or on their way (proposed earlier), and the
        # variants of configs the tuner seeded into this batch (the template default):
        # those count against this batch's budget of new ones
        told = {c for c, _ in self.history}
        compiled = {self.variant(c) for c in self.seen if c in told or c in self._own}
        seeded = {self.variant(c) for c in self.seen - told - self._own} - compiled
        if n_ok < self.warmup and not self.model.has_prior:
            return self._sample_capped(n, compiled, set(seeded))
        if self._dirty:
            self.model.fit([c for c, _ in self.history], [v for _, v in self.history],
                           min_ok=self.warmup)
            self._dirty = False
        if not self.model.fitted:
            return self._sample_capped(n, compiled, set(seeded))
        pool = self._pool()
        if not pool:
            return []
        preds = self.model.predict(pool)
        ranked = [pool[i] for i in preds.argsort(kind="stable")]
        n_explore = sum(1 for _ in range(n) if self.rng.random() < self._epsilon_now())
        picks: list[Config] = []
        new: set[tuple] = set(seeded)
        budget = self._new_budget(compiled)

        def affordable(cfg) -> bool:
            """A pick of a new variant while the batch's compile budget lasts, or any other."""
            v = self.variant(cfg)
            if budget is None or v in compiled or v in new:
                return True
            return len(new) < budget

        def take(cfg) -> None:
            picks.append(cfg)
            if self.variant(cfg) not in compiled:
                new.add(self.variant(cfg))

        for cfg in ranked:
            if len(picks) >= n - n_explore:
                break
            if affordable(cfg) and all(_distance(cfg, p) >= self.min_distance for p in picks):
                take(cfg)
        for cfg in ranked:  # diversity left the batch short: fill with the next best
            if len(picks) >= n - n_explore:
                break
            if cfg not in picks and affordable(cfg):
                take(cfg)
        picks += self._sample_capped(n - len(picks), compiled, new, taken=picks)
        return picks[:n]


def strategy_options(strategy: str, workload, template, store, target, threads: int,
                     transfer: bool = True, optuna_storage: str | None = "db") -> dict:
    """Options the tuner loop passes to a strategy that can use its context.

    ``model``: the template's domain features for this workload and, with ``transfer``, a
    prior from the records of *other* workloads of the same template (and version) on this
    target and thread budget. ``tpe``: the Optuna study lives in the records database
    (``optuna_storage="db"``), in another URL, or in memory (None).
    """
    if strategy == "model":
        from search_spaces.templates.features import bind
        from tuner.search.cost_model import prior_from_rows

        opts: dict = {"features": bind(template.name, workload.params(), target.caches),
                      "runtime_knobs": tuple(getattr(template, "runtime_knobs", ()))}
        if transfer:
            rows = store.trials(target_key=target.key, template=template.name,
                                template_version=template.version, threads=threads)
            prior = prior_from_rows(rows, workload.key, template.name, target.caches)
            if prior:
                opts["prior"] = prior
        return opts
    if strategy == "tpe" and optuna_storage:
        from tuner.search.tpe import study_name_for

        url = store.url if optuna_storage == "db" else optuna_storage
        return {"storage": url, "study_name": study_name_for(
            workload.key, target.key, template.name, template.version, threads)}
    return {}


def _param_distance(a: dict, b: dict) -> float | None:
    """Shape distance of two workloads of one kind: sum of |log2| ratios of numeric params;
    None when a non-numeric parameter (dtype, layout ...) differs, or when one numeric
    parameter differs by more than SIMILAR_FACTOR (a 1x1024x4096 GEMV is not "similar" to
    1024^3, whatever the sum: its tuned config ran it at 0.14x NumPy, its own default 0.8x)."""
    import math

    d = 0.0
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x > 0 and y > 0:
            step = abs(math.log2(x / y))
            if step > math.log2(SIMILAR_FACTOR):
                return None
            d += step
        elif x != y:
            return None
    return d


def _project(space, config) -> Config | None:
    """``config`` moved onto ``space``: each ordinal knob to its nearest value (log scale for
    positive ints), other knobs kept; None when the result is not a valid point."""
    import math

    values = {}
    for k in space.knobs:
        v = config.get(k.name, k.values[0])
        if v not in k.values:
            if not (k.ordinal and isinstance(v, int) and v > 0
                    and all(isinstance(x, int) and x > 0 for x in k.values)):
                return None
            v = min(k.values, key=lambda x: (abs(math.log2(x / v)), x))
        values[k.name] = v
    cfg = Config(values)
    return cfg if space.is_valid(cfg) else None


SIMILAR_FACTOR = 2.0   # a similar workload's numeric params are each within this factor


def transfer_fallback(workload, template, store, target, threads: int,
                      pool: int = 300, seed: int = 0) -> tuple[Config, str] | None:
    """A better fallback than the template default for a workload with no record.

    The best config of the most similar tuned workload of the same kind (same target, thread
    budget and template version; every shape parameter within SIMILAR_FACTOR), moved onto
    this workload's space, unless the template names a hazard in applying it to this exact
    shape; if similar workloads exist but none fits, the cost model's pick, trained on all
    those records, among ``pool`` random configs and the template default. Returns (config,
    how it was chosen) or None (use the template default).
    """
    import random

    others = [b for b in store.best_many(None, target.key, threads, template.name, template.version)
              if b.workload_key != workload.key and b.workload_key.split(":", 1)[0] == workload.kind]
    if not others:
        return None
    import json

    params = workload.params()
    ranked = []
    for b in others:
        d = _param_distance(params, json.loads(b.workload_key.split(":", 1)[1]))
        if d is not None:
            ranked.append((d, b.workload_key, b))
    if not ranked:
        return None
    space = template.space(workload, threads)
    for d, key, b in sorted(ranked, key=lambda t: (t[0], t[1])):
        cfg = _project(space, b.config)
        if cfg is not None and template.transfer_hazard(workload, cfg) is None:
            return cfg, f"the best config of the most similar tuned workload {key}"
    opts = strategy_options("model", workload, template, store, target, threads, transfer=True)
    if "prior" not in opts:
        return None
    from tuner.search.cost_model import CostModel, Featurizer

    model = CostModel(Featurizer(space, opts["features"]), seed=seed, prior=opts["prior"])
    model.fit([], [])
    if not model.fitted:
        return None
    rng = random.Random(seed)
    cands = list(dict.fromkeys([template.default_config(workload, threads)]
                               + [c for c in (space.sample(rng) for _ in range(pool))
                                  if template.transfer_hazard(workload, c) is None]))
    best = cands[int(model.predict(cands).argmin())]
    return best, f"the cost model's pick (trained on {len(opts['prior'])} records of other workloads)"
