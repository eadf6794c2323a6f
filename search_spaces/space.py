"""The space vocabulary: knobs, configurations and the space they span.

A ``ConfigSpace`` is an ordered list of ``Knob``s (each a finite list of values) plus named
constraints between knobs. Every point of the Cartesian product has an integer index (mixed
radix, first knob most significant), so a space can be indexed, sampled and enumerated; a
constraint rejects a point before anything is compiled (status INVALID, with its reason).

A ``Config`` is an immutable mapping knob -> value. Its canonical JSON (sorted keys, no
spaces) round-trips exactly and its ``hash`` (sha1 of that JSON) is stable across runs and
machines, so it identifies a candidate in the records database.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from workloads.errors import InstantiationError, UsageError

Value = Any  # int | str | bool


@dataclass(frozen=True)
class Knob:
    """One tunable decision with a finite, ordered list of values.

    ``ordinal`` says that the order of values means something (tile sizes): search strategies
    and the cost model may treat it as a number rather than a category.
    """

    name: str
    values: tuple
    ordinal: bool = False
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"knob {self.name!r} has no values")
        if len(set(self.values)) != len(self.values):
            raise ValueError(f"knob {self.name!r} has repeated values {self.values}")

    def index(self, value: Value) -> int:
        try:
            return self.values.index(value)
        except ValueError:
            raise InstantiationError(
                f"knob {self.name!r} has no value {value!r}; choices: {list(self.values)}"
            ) from None


@dataclass(frozen=True)
class Constraint:
    """A named predicate over a config; ``check`` returns None when satisfied, else a reason."""

    name: str
    check: Callable[[Mapping[str, Value]], str | None]


class Config(Mapping[str, Value]):
    """An immutable knob -> value mapping with canonical JSON and a stable hash."""

    __slots__ = ("_items", "_json")

    def __init__(self, values: Mapping[str, Value]):
        items = dict(sorted(values.items()))
        for k, v in items.items():
            if not isinstance(v, (int, str, bool)) or isinstance(v, float):
                raise UsageError(f"config value for {k!r} must be int, str or bool, got {v!r}")
        self._items = items
        self._json = json.dumps(items, sort_keys=True, separators=(",", ":"))

    # Mapping protocol
    def __getitem__(self, key: str) -> Value:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._json)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Config):
            return self._json == other._json
        return NotImplemented

    def __repr__(self) -> str:
        return f"Config({self._json})"

    def to_json(self) -> str:
        return self._json

    @property
    def hash(self) -> str:
        return hashlib.sha1(self._json.encode()).hexdigest()[:16]

    def replace(self, **changes: Value) -> "Config":
        return Config({**self._items, **changes})

    @classmethod
    def from_json(cls, text: str) -> "Config":
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, TypeError) as exc:
            raise UsageError(f"config is not valid JSON ({exc}): {text!r:.120}") from None
        if not isinstance(data, dict):
            raise UsageError(f"config JSON must be an object, got {type(data).__name__}")
        return cls(data)


@dataclass
class ConfigSpace:
    """Knobs (ordered) and constraints; indexable over the full Cartesian product."""

    knobs: list[Knob]
    constraints: list[Constraint] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_name = {k.name: k for k in self.knobs}
        if len(self._by_name) != len(self.knobs):
            raise ValueError("duplicate knob names")

    # -- size and indexing -------------------------------------------------------------
    @property
    def size(self) -> int:
        """Number of points in the Cartesian product (valid or not)."""
        return math.prod(len(k.values) for k in self.knobs)

    def __len__(self) -> int:
        return self.size

    def knob(self, name: str) -> Knob:
        return self._by_name[name]

    def get(self, index: int) -> Config:
        if not 0 <= index < self.size:
            raise IndexError(index)
        values = {}
        for knob in reversed(self.knobs):
            index, r = divmod(index, len(knob.values))
            values[knob.name] = knob.values[r]
        return Config(values)

    def index_of(self, config: Mapping[str, Value]) -> int:
        index = 0
        for knob in self.knobs:
            index = index * len(knob.values) + knob.index(config[knob.name])
        return index

    # -- validity ----------------------------------------------------------------------
    def violation(self, config: Mapping[str, Value]) -> str | None:
        """None when ``config`` is a valid point of this space, else the reason."""
        missing = [k.name for k in self.knobs if k.name not in config]
        if missing:
            return f"missing knobs {missing}"
        extra = sorted(set(config) - set(self._by_name))
        if extra:
            return f"unknown knobs {extra}; knobs are {[k.name for k in self.knobs]}"
        for knob in self.knobs:
            if config[knob.name] not in knob.values:
                return f"{knob.name}={config[knob.name]!r} not in {list(knob.values)}"
        for c in self.constraints:
            reason = c.check(config)
            if reason:
                return f"{c.name}: {reason}"
        return None

    def validate(self, config: Mapping[str, Value]) -> Config:
        reason = self.violation(config)
        if reason:
            raise InstantiationError(reason)
        return config if isinstance(config, Config) else Config(config)

    def is_valid(self, config: Mapping[str, Value]) -> bool:
        return self.violation(config) is None

    # -- enumeration -------------------------------------------------------------------
    def __iter__(self) -> Iterator[Config]:
        """All valid configs in index order."""
        for i in range(self.size):
            cfg = self.get(i)
            if self.is_valid(cfg):
                yield cfg

    def sample(self, rng: random.Random, max_tries: int = 100_000) -> Config:
        """One uniformly random valid config (rejection sampling)."""
        for _ in range(max_tries):
            values = {k.name: rng.choice(k.values) for k in self.knobs}
            if self.is_valid(values):   # a Config (canonical JSON) only for a valid draw
                return Config(values)
        raise InstantiationError("no valid config found by sampling; constraints too tight?")

    def count_valid(self, limit: int = 50_000) -> int | None:
        """Number of valid configs, or None when the product is larger than ``limit``
        (enumerating checks every point: ~20 us each, so 1M points took 20 s of every
        ``tune``; ``estimate_valid`` answers for a large space)."""
        if self.size > limit:
            return None
        return sum(1 for _ in self)

    def estimate_valid(self, samples: int = 2000, seed: int = 0) -> int:
        """Valid configs in the space, estimated from ``samples`` points drawn uniformly
        from the product (seeded: the same answer every time). Exact below ``samples``
        points."""
        if self.size <= samples:
            return sum(1 for _ in self)
        rng = random.Random(seed)
        hits = sum(self.is_valid(self.get(rng.randrange(self.size))) for _ in range(samples))
        return round(self.size * hits / samples)

    def valid_text(self, samples: int = 2000) -> str:
        """The valid-config count as ``tune`` and ``show --space`` print it: exact, or
        ``~N (estimated from S samples)`` past ``count_valid``'s limit."""
        n = self.count_valid()
        if n is not None:
            return str(n)
        return f"~{self.estimate_valid(samples)} (estimated from {samples} samples)"

    def neighbours(self, config: Config) -> list[Config]:
        """Valid configs differing in one knob by one step (ordinal) or any value (categorical)."""
        out = []
        for knob in self.knobs:
            i = knob.index(config[knob.name])
            if knob.ordinal:
                choices = [knob.values[j] for j in (i - 1, i + 1) if 0 <= j < len(knob.values)]
            else:
                choices = [v for v in knob.values if v != config[knob.name]]
            for v in choices:
                cand = config.replace(**{knob.name: v})
                if self.is_valid(cand):
                    out.append(cand)
        return out

    def describe(self) -> list[tuple[str, Sequence[Value]]]:
        return [(k.name, k.values) for k in self.knobs]
