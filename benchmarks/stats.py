"""Ratios of paired rounds with their 95% intervals, and verdicts against a bar.

A benchmark pairs each run of one arm with what another arm took at the same time
(:mod:`rig`); each pair is a *round*, and its ratio is new over old. The ratio of the two
arms is the **trimmed mean of the rounds' ratios**: the mean of the middle 60% of them,
as steady as the mean on well-behaved rounds and, like the median, deaf to the odd round
a neighbour's load spoiled. Its interval is a **percentile bootstrap over rounds**: the
rounds are drawn again with replacement, many times, and the trimmed mean taken each time;
the interval holds the middle 95% of those. Rounds are drawn in runs of ``CHUNK`` neighbours
(a circular block bootstrap), since neighbouring rounds are not independent: a run of the
reference arm overlaps two runs of the measured one, and is in both their rounds.

A ratio is judged against its bar by where its interval lies: ``yes`` when the whole
interval is at or under the bar, ``no`` when the whole interval is above it, ``unresolved``
when the bar falls inside. An unresolved ratio's interval narrows about as one over the
square root of the rounds, which :func:`rounds_to_resolve` uses to say how many rounds
would separate it from the bar. An A/A ratio (an arm against its twin) is judged against
its target instead: ``yes`` when the whole interval lies within 1 ± the target.

>>> r = paired([1.10, 1.12, 1.08, 1.11, 1.09] * 4, [1.0] * 20)
>>> round(r.ratio, 3), r.lo <= r.ratio <= r.hi, verdict(r, bar=1.25)
(1.1, True, 'yes')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
RESAMPLES = 10_000
TRIM = 0.2  # the share of rounds left out at each end
CHUNK = 2  # neighbouring rounds drawn together


@dataclass(frozen=True)
class Ratio:
    """A paired ratio with its interval, over ``rounds`` rounds; ``spread`` is the standard
    deviation of the rounds' ratios within a block (the root mean square over blocks), and
    ``blocks`` each block's own ratio."""

    ratio: float
    lo: float
    hi: float
    rounds: int
    spread: float = math.nan
    blocks: tuple[float, ...] = ()


def trimmed_mean(values: np.ndarray) -> np.ndarray:
    """The mean of the middle values along the last axis, ``TRIM`` of them cut at each end."""
    ordered = np.sort(values, axis=-1)
    cut = int(ordered.shape[-1] * TRIM)
    return ordered[..., cut:ordered.shape[-1] - cut].mean(axis=-1)


def paired(new: Sequence[float], old: Sequence[float], *, seed: int = 0) -> Ratio:
    """The trimmed mean of ``new[i] / old[i]`` over rounds, with its bootstrap interval."""
    return paired_blocks([(new, old)], seed=seed)


def paired_blocks(blocks: Sequence[tuple[Sequence[float], Sequence[float]]], *, seed: int = 0) -> Ratio:
    """:func:`paired` over rounds that came in blocks, each from processes of its own.

    Two processes of one program can differ in speed by a percent or two for good (where
    their memory landed), so rounds of one block are not independent of each other. The
    bootstrap draws blocks with replacement, then rounds within each drawn block (in
    ``CHUNK``s of neighbours, the block's rounds taken as a circle), so that the interval
    widens by however much the blocks disagree.
    """
    ratios = []
    for new, old in blocks:
        if len(new) != len(old):
            raise ValueError(f"paired rounds differ in number: {len(new)} against {len(old)}")
        ratios.append(np.asarray(new, dtype=float) / np.asarray(old, dtype=float))
    point, lo, hi = _bootstrap(ratios, seed=seed)
    pooled = np.concatenate(ratios)
    within = [float(np.var(r, ddof=1)) for r in ratios if len(r) > 1]
    spread = math.sqrt(sum(within) / len(within)) if within else math.nan
    return Ratio(point, lo, hi, len(pooled), spread, tuple(float(trimmed_mean(r)) for r in ratios))


@dataclass(frozen=True)
class Difference:
    """A paired difference (new minus old, in the rounds' unit) with its interval."""

    value: float
    lo: float
    hi: float
    rounds: int


def paired_difference(new: Sequence[float], old: Sequence[float], *, seed: int = 0) -> Difference:
    """The trimmed mean of ``new[i] - old[i]`` over rounds, with its bootstrap interval: for a
    cost that is a fixed amount (seconds a process start), not a share.

    >>> d = paired_difference([1.2, 1.3, 1.25, 1.22] * 3, [1.0, 1.1, 1.05, 1.0] * 3)
    >>> round(d.value, 3), d.lo <= d.value <= d.hi, verdict(d, bar=0.5)
    (0.202, True, 'yes')
    """
    if len(new) != len(old):
        raise ValueError(f"paired rounds differ in number: {len(new)} against {len(old)}")
    differences = np.asarray(new, dtype=float) - np.asarray(old, dtype=float)
    point, lo, hi = _bootstrap([differences], seed=seed)
    return Difference(point, lo, hi, len(differences))


def _bootstrap(values: list[np.ndarray], *, seed: int) -> tuple[float, float, float]:
    """The trimmed mean of the rounds' ``values`` (a list per block) and its 95% interval:
    blocks drawn with replacement, then rounds within each in ``CHUNK``s of neighbours."""
    if sum(len(v) for v in values) < 2 or not all(len(v) for v in values):
        raise ValueError("an interval needs at least 2 rounds, and every block one")
    rng = np.random.default_rng(seed)
    drawn = []
    for blocks_drawn in rng.integers(0, len(values), size=(RESAMPLES, len(values))):
        picked = [values[0]] if len(values) == 1 else [values[b] for b in blocks_drawn]
        drawn.append(trimmed_mean(np.concatenate([v[_chunked(len(v), rng)] for v in picked])))
    tail = (1 - LEVEL) / 2 * 100
    lo, hi = np.percentile(drawn, [tail, 100 - tail])
    return float(trimmed_mean(np.concatenate(values))), float(lo), float(hi)


def _chunked(n: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``n`` rounds drawn again in runs of ``CHUNK`` neighbours, wrapping at the end
    (one by one where a single run would hold all of them)."""
    chunk = CHUNK if n > CHUNK else 1
    starts = rng.integers(0, n, size=-(-n // chunk))
    return ((starts[:, None] + np.arange(chunk)) % n).ravel()[:n]


def verdict(ratio: Ratio | Difference, *, bar: float) -> str:
    """``yes``, ``no`` or ``unresolved``: where the interval lies against ``bar``."""
    if ratio.hi <= bar:
        return "yes"
    if ratio.lo > bar:
        return "no"
    return "unresolved"


def floor_verdict(ratio: Ratio, *, floor: float) -> str:
    """An A/A ratio's verdict: ``yes`` when its whole interval lies within ``1 ± floor``,
    so the trial tells the two sides apart to within ``floor``; ``no`` otherwise, whether
    the interval is too wide or sits off 1 (the two sides' processes not alike)."""
    return "yes" if 1 - floor <= ratio.lo and ratio.hi <= 1 + floor else "no"


def rounds_to_resolve(ratio: Ratio, *, bar: float) -> int | None:
    """More rounds that would likely resolve an unresolved ratio; None if it sits on the bar.

    The side of the interval that reaches across the bar has to shrink to the ratio's
    distance from the bar; widths shrink as ``1/sqrt(rounds)``.
    """
    distance = abs(ratio.ratio - bar)
    reach = ratio.hi - ratio.ratio if ratio.ratio < bar else ratio.ratio - ratio.lo
    if distance <= 1e-9 * bar:
        return None
    needed = math.ceil(ratio.rounds * (reach / distance) ** 2)
    return max(needed - ratio.rounds, 1)
