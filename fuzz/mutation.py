"""The fast layer of the fuzz campaign: an in-process byte-mutation loop with oracles.

Hypothesis (``fuzz/campaign.py``) is the property layer: structured inputs, shrinking, the
tests' own properties.  It spends most of its time per example on generation and its own
book-keeping, so a codec whose check takes 4 microseconds still runs only a few thousand
inputs per second.  This module runs the same kind of check on *bytes* as fast as Python
can call it:

1. **Seeds.**  A :class:`Mutator` names a hypothesis strategy from ``tests/strategies`` that
   draws whole inputs (``bytes``).  The loop draws ``seed_count`` of them once, with a
   hypothesis seed taken from the campaign seed (so a campaign seed always gives the same
   seeds), and adds the committed regression inputs of ``fuzz/corpus/<target>.<name>/`` and
   the mutator's ``examples``, which are checked first.
2. **Mutation.**  Each input is the previous one with 1-4 byte-level edits (a random walk
   from a seed, restarted from another seed every ``walk`` inputs): flip a bit, set a byte,
   write an "interesting" integer (0, +-1, the int32/uint32/uint64 edges, the mutator's
   ``ints``) in either byte order at a random offset or at one of the mutator's field
   ``offsets``, copy one of the mutator's ``tokens`` (magic values, the valid request) over
   the input, cut or zero-extend it to one of its ``sizes`` or to a random length, insert
   or delete bytes, and splice it with another seed.  Everything comes from one
   ``random.Random`` seeded from the campaign seed: the same seed gives the same inputs in
   the same order (how many run depends on the clock).
3. **Oracle.**  ``check(data)`` runs the real code under test on the input and states the
   outcome independently (from the byte layout), raising on any violation.  Every counted
   input is one call of ``check`` on a new input: inputs up to ``dedupe_below`` bytes are
   kept in a bit filter and an input already checked is skipped, not counted (a filter
   collision can skip a new input, never count a repeat; bigger inputs differ from the
   previous one by construction).
4. **Failure.**  The first exception stops the mutator: the input is written to
   ``fuzz/artifacts/<target>.<name>-<sha256 prefix>.bin`` (``$HAMI_FUZZ_ARTIFACTS``
   overrides the directory), with the command that reproduces it
   (``fuzz/run --replay FILE``); the campaign then exits 1.

A check that needs state across inputs (an open file, a scratch directory) gets it from the
target's ``session`` or from a ``setup`` context manager on the mutator that returns the check.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import re
import struct
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

__all__ = [
    "ARTIFACT_ROOT",
    "Mutator",
    "MutatorResult",
    "artifact_dir",
    "draw_seeds",
    "mutate",
    "parse_artifact_name",
    "replay",
    "reproduce_command",
    "run_mutator",
]

#: Where failing inputs are written (``$HAMI_FUZZ_ARTIFACTS`` overrides it; gitignored).
ARTIFACT_ROOT = Path(__file__).resolve().parent / "artifacts"

_CORPUS_ROOT = Path(__file__).resolve().parent / "corpus"

#: Integers every byte-level fuzzer tries: the edges of the usual C integer types.
INTERESTING = (
    0,
    1,
    2,
    -1,
    7,
    8,
    12,
    16,
    17,
    0x7F,
    0x80,
    0xFF,
    0x100,
    0x7FFF,
    0x8000,
    0xFFFF,
    0x10000,
    2**31 - 1,
    -(2**31),
    2**32 - 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
)
_WIDTHS = (1, 2, 4, 8)
_BYTE_ORDERS = ("<", ">")
_PACKERS = {
    (order, width, signed): struct.Struct(order + code)
    for order in _BYTE_ORDERS
    for width, codes in zip(_WIDTHS, (("B", "b"), ("H", "h"), ("I", "i"), ("Q", "q")), strict=True)
    for signed, code in zip((False, True), codes, strict=True)
}

# Bit filter for de-duplication: 2**27 bits (16 MiB), two probes per input.
_FILTER_BITS = 1 << 27


def artifact_dir() -> Path:
    """The directory failing inputs are written to."""
    override = os.environ.get("HAMI_FUZZ_ARTIFACTS")
    return Path(override) if override else ARTIFACT_ROOT


@dataclass(frozen=True)
class Mutator:
    """One fast-layer fuzzer: seeds from a strategy, byte mutations, an oracle over bytes.

    Attributes:
        name: unique within its target (with the target's name: the corpus and artifact
            names).
        seeds: draws whole inputs; from ``tests/strategies`` (new strategies go there).
        check: the oracle; raises on any violation.  Must not keep a reference to its
            argument (it may be a ``bytearray`` that is mutated after the call).  ``None``
            when ``setup`` gives it.
        examples: regression inputs, checked before anything else and then used as seeds.
        tokens: byte strings copied over the input at random or field offsets.
        offsets: field offsets where integers and tokens are written more often.
        ints: extra interesting integers (magic values, counts, sizes).
        sizes: interesting lengths to cut or zero-extend the input to.
        max_size: inputs never grow beyond this many bytes.
        seed_count: how many seeds to draw from ``seeds``.
        walk: inputs per walk before restarting from another seed.
        dedupe_below: inputs shorter than this are de-duplicated (see the module docstring).
        mutable_input: pass the working ``bytearray`` itself instead of a ``bytes`` copy
            (for inputs of megabytes, where the copy would cost more than the check).
        weight: share of the target's budget, beside its properties' weights.
        setup: instead of ``check``, a context manager that yields the check for one run
            (state across inputs: an open file, a scratch directory).
    """

    name: str
    seeds: st.SearchStrategy[bytes]
    check: Callable[[bytes], None] | None = None
    examples: tuple[bytes, ...] = ()
    tokens: tuple[bytes, ...] = ()
    offsets: tuple[int, ...] = ()
    ints: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    max_size: int = 256
    seed_count: int = 200
    walk: int = 8
    dedupe_below: int = 4096
    mutable_input: bool = False
    resize_percent: int = 10
    weight: float = 1.0
    setup: Callable[[], AbstractContextManager[Callable[[bytes], None]]] | None = None

    def __post_init__(self) -> None:
        if (self.check is None) == (self.setup is None):
            raise ValueError(f"mutator {self.name}: give either check or setup, not both")
        if not 0 <= self.resize_percent <= 100:
            raise ValueError(f"mutator {self.name}: resize_percent must be 0..100")

    def open(self) -> AbstractContextManager[Callable[[bytes], None]]:
        """The check to run, inside whatever its setup needs."""
        if self.setup is not None:
            return self.setup()
        assert self.check is not None
        return _plain(self.check)


@dataclass
class MutatorResult:
    """What one mutator's run produced (the fields :class:`fuzz.campaign.PropertyResult`
    has, so the runner reports both layers the same way)."""

    target: str
    name: str
    inputs: int = 0
    replayed: int = 0
    skipped: int = 0
    seeds: int = 0
    seconds: float = 0.0
    #: CPU time of this process meanwhile (below ``seconds`` when other work competes)
    cpu_seconds: float = 0.0
    failure: str | None = None
    failing_input: str | None = None
    artifact: Path | None = None
    reproduce: str | None = None
    kind: str = "mutation"

    @property
    def ok(self) -> bool:
        return self.failure is None


def draw_seeds(strategy: st.SearchStrategy[bytes], count: int, seed_value: int) -> list[bytes]:
    """``count`` inputs drawn from ``strategy``, the same ones for the same ``seed_value``."""
    drawn: list[bytes] = []

    def collect(value: bytes) -> None:
        drawn.append(bytes(value))

    test = given(strategy)(collect)
    test = settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )(test)
    seed(seed_value)(test)()
    return drawn


def _corpus_inputs(target: str, name: str) -> list[bytes]:
    directory = _CORPUS_ROOT / f"{target}.{name}"
    if not directory.is_dir():
        return []
    return [p.read_bytes() for p in sorted(directory.glob("*")) if p.is_file()]


# ``random.Random.randrange`` and ``choice`` cost about a microsecond each, as much as a codec
# check; ``int(random() * n)`` is a fraction of that and as uniform for these sizes.


def _interesting_int(rnd: Callable[[], float], extra: Sequence[int]) -> int:
    pool = extra if extra and rnd() < 0.5 else INTERESTING
    value = pool[int(rnd() * len(pool))]
    roll = rnd()
    if roll < 0.05:
        value += 1
    elif roll < 0.1:
        value -= 1
    elif roll < 0.15:
        value = int(rnd() * 2**53) << 11
    return value


def _offset(length: int, rnd: Callable[[], float], offsets: Sequence[int]) -> int:
    if offsets and rnd() < 0.6:
        near = offsets[int(rnd() * len(offsets))] + _NUDGES[int(rnd() * len(_NUDGES))]
        if 0 <= near < length:
            return near
    return int(rnd() * length)


_NUDGES = (0, 0, 0, 1, -1, 4, -4)
_INT_CODECS = tuple(_PACKERS[(order, width, False)] for order in _BYTE_ORDERS for width in _WIDTHS)


def mutate(buf: bytearray, rng: random.Random, mutator: Mutator, others: Sequence[bytes]) -> None:
    """Apply one random edit to ``buf`` in place (see the module docstring for the list)."""
    rnd = rng.random
    length = len(buf)
    roll = int(rnd() * 100)
    if length == 0 or roll >= 100 - mutator.resize_percent:
        # resize: cut, zero-extend, insert, delete, splice with another seed
        kind = int(rnd() * 5)
        sizes = mutator.sizes
        if sizes and kind < 2 and rnd() < 0.7:
            target = sizes[int(rnd() * len(sizes))]
        else:
            target = int(rnd() * (mutator.max_size + 1))
        target = min(target, mutator.max_size)
        if kind == 0 or (kind == 1 and target < length):
            del buf[target:]
        elif kind == 1:
            buf.extend(bytes(target - length))
        elif kind == 2 and length < mutator.max_size:
            at = int(rnd() * (length + 1))
            count = min(1 + int(rnd() * 8), mutator.max_size - length)
            buf[at:at] = rng.randbytes(count)
        elif kind == 3 and length:
            at = int(rnd() * length)
            del buf[at : at + 1 + int(rnd() * 8)]
        elif others:
            other = others[int(rnd() * len(others))]
            cut = int(rnd() * (min(length, len(other)) + 1))
            buf[cut:] = other[cut:]
            del buf[mutator.max_size :]
        return
    roll = roll * 90 // max(1, 100 - mutator.resize_percent)
    if roll < 25:
        buf[_offset(length, rnd, mutator.offsets)] ^= 1 << int(rnd() * 8)
    elif roll < 45:
        buf[_offset(length, rnd, mutator.offsets)] = int(rnd() * 256)
    elif roll < 75:
        value = _interesting_int(rnd, mutator.ints)
        codec = _INT_CODECS[int(rnd() * len(_INT_CODECS))]
        at = _offset(length, rnd, mutator.offsets)
        if at + codec.size <= length:
            codec.pack_into(buf, at, value & ((1 << (8 * codec.size)) - 1))
    elif roll < 85 and mutator.tokens:
        tokens = mutator.tokens
        token = tokens[int(rnd() * len(tokens))]
        at = _offset(length, rnd, mutator.offsets) if rnd() < 0.7 else 0
        buf[at : at + len(token)] = token
        del buf[mutator.max_size :]
    else:
        # a short run of random bytes
        at = int(rnd() * length)
        count = min(1 + int(rnd() * 8), length - at)
        buf[at : at + count] = rng.randbytes(count)


class _SeenFilter:
    """A two-probe bit filter over ``hash(bytes)``: remembers which small inputs ran."""

    __slots__ = ("_bits",)

    def __init__(self) -> None:
        self._bits = bytearray(_FILTER_BITS // 8)

    def add(self, data: bytes) -> bool:
        """Record ``data``; False if it (probably) was recorded before."""
        h = hash(data)
        a = h & (_FILTER_BITS - 1)
        b = (h >> 32) & (_FILTER_BITS - 1)
        bits = self._bits
        ma, mb = 1 << (a & 7), 1 << (b & 7)
        if bits[a >> 3] & ma and bits[b >> 3] & mb:
            return False
        bits[a >> 3] |= ma
        bits[b >> 3] |= mb
        return True


def _save_artifact(target: str, name: str, data: bytes) -> Path:
    directory = artifact_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{target}.{name}-{hashlib.sha256(data).hexdigest()[:16]}.bin"
    path.write_bytes(data)
    return path


_ARTIFACT_NAME = re.compile(r"(?P<target>\w+)\.(?P<name>\w+)-[0-9a-f]{16}\.bin")
_CORPUS_DIR = re.compile(r"(?P<target>\w+)\.(?P<name>\w+)")


def parse_artifact_name(path: Path) -> tuple[str, str]:
    """``(target, mutator)`` from an artifact's or corpus file's name or directory.

    Accepts ``<target>.<name>-<sha>.bin`` (an artifact) and
    ``.../<target>.<name>/<anything>`` (a corpus file).

    Raises:
        ValueError: the name has neither form.
    """
    artifact = _ARTIFACT_NAME.fullmatch(path.name)
    if artifact is not None:
        return artifact["target"], artifact["name"]
    corpus = _CORPUS_DIR.fullmatch(path.parent.name)
    if corpus is not None:
        return corpus["target"], corpus["name"]
    raise ValueError(f"{path}: not named <target>.<mutator>-<sha>.bin or in <target>.<mutator>/")


def reproduce_command(path: Path) -> str:
    """The command line that replays one saved input."""
    return f".venv/bin/python fuzz/run --replay {path}"


@contextlib.contextmanager
def _plain(check: Callable[[bytes], None]) -> Iterator[Callable[[bytes], None]]:
    yield check


def run_mutator(  # noqa: C901 - like run_property; not split yet
    target: str,
    mutator: Mutator,
    *,
    seconds: float,
    max_inputs: int | None,
    rng: random.Random,
    save_failures: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> MutatorResult:
    """Check the regression inputs, then mutated inputs until the budget is spent.

    Args:
        target: the target's name (corpus and artifact names).
        mutator: the fuzzer.
        seconds: time budget, seed drawing included (regression inputs are not cut short).
        max_inputs: stop after this many checked inputs (``None``: only the time counts).
        rng: source of this run's seeds (from the campaign seed).
        save_failures: write a failing input to :func:`artifact_dir`.
        clock: monotonic seconds (injectable for tests).

    Returns:
        The counts and, if the oracle failed, the traceback, the input and its artifact.
    """
    result = MutatorResult(target, mutator.name)
    start = clock()
    cpu_start = time.process_time()
    stop_at = start + seconds
    seed_value = rng.getrandbits(64)
    walk_rng = random.Random(rng.getrandbits(64))
    current: bytes | bytearray = b""

    def fail(data: bytes | bytearray) -> None:
        frozen = bytes(data)
        result.failure = traceback.format_exc()
        shown = frozen if len(frozen) <= 64 else frozen[:64]
        suffix = "" if len(frozen) <= 64 else f"... ({len(frozen)} bytes)"
        result.failing_input = f"{shown!r}{suffix}"
        if save_failures:
            result.artifact = _save_artifact(target, mutator.name, frozen)
            result.reproduce = reproduce_command(result.artifact)

    with mutator.open() as check:
        regression = [*mutator.examples, *_corpus_inputs(target, mutator.name)]
        for data in regression:
            result.inputs += 1
            result.replayed += 1
            try:
                check(data)
            except Exception:
                fail(data)
                result.seconds = clock() - start
                result.cpu_seconds = time.process_time() - cpu_start
                return result
        seeds = [*regression, *draw_seeds(mutator.seeds, mutator.seed_count, seed_value)]
        seeds = [s[: mutator.max_size] for s in seeds] or [b""]
        result.seeds = len(seeds)
        dedupe_below = mutator.dedupe_below
        seen = _SeenFilter() if dedupe_below > 0 else None
        if seen is not None:
            for data in regression:
                if len(data) < dedupe_below:
                    seen.add(bytes(data))
        pass_mutable = mutator.mutable_input
        walk = max(1, mutator.walk)
        buf = bytearray()
        step = walk
        tries, next_check, last_check = 0, 0, clock()
        try:
            while True:
                if max_inputs is not None and result.inputs >= max_inputs:
                    break
                tries += 1
                if tries >= next_check:
                    # every 64 tries while they are fast, every one once they are slow; tries,
                    # not inputs: a small input space can run out of new inputs
                    now = clock()
                    if now > stop_at:
                        break
                    next_check = tries + (64 if now - last_check < 0.005 else 1)
                    last_check = now
                if step >= walk:
                    buf = bytearray(seeds[int(walk_rng.random() * len(seeds))])
                    step = 0
                step += 1
                mutate(buf, walk_rng, mutator, seeds)
                if walk_rng.getrandbits(1):
                    for _ in range(walk_rng.getrandbits(2)):
                        mutate(buf, walk_rng, mutator, seeds)
                if len(buf) < dedupe_below:
                    current = bytes(buf)
                    if seen is not None and not seen.add(current):
                        result.skipped += 1
                        # a walk stuck on inputs that already ran: restart it
                        if result.skipped % 16 == 0:
                            step = walk
                        continue
                else:
                    current = buf if pass_mutable else bytes(buf)
                result.inputs += 1
                check(current)
        except Exception:
            fail(current)
    result.seconds = clock() - start
    result.cpu_seconds = time.process_time() - cpu_start
    return result


def replay(
    target: str,
    mutator: Mutator,
    data: bytes,
) -> MutatorResult:
    """Check one saved input (``fuzz/run --replay``)."""
    result = MutatorResult(target, mutator.name, kind="replay")
    start = time.monotonic()
    with mutator.open() as check:
        result.inputs = result.replayed = 1
        try:
            check(data)
        except Exception:
            result.failure = traceback.format_exc()
            result.failing_input = repr(data[:64])
    result.seconds = time.monotonic() - start
    return result
