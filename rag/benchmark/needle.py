"""The needle workload: one synthetic fact in one chunk among real distractor chunks, at varied positions.

Each needle is a short registry entry about a made-up society (founding year, city, president, a
membership code, a meeting day), seeded, so no model knows it beforehand; the question asks for the
code. The needle chunk stands at position 2, ..., k + 1, 1 in turn among ``k`` distractors drawn from
the corpus, so chunks mode has to carry the fact through a stitched chunk at every position but the
first (which is exact). Only the needles full prefill answers correctly count: accuracy is relative to it.

Example:
    >>> needles = make_needles(3, seed=0)
    >>> needles[0].answer in needles[0].chunk.text, needles[0].answer in needles[0].question
    (True, False)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rag.prompt.assembler import Prompt
from rag.types import ScoredChunk

ADJECTIVES = [
    "Silver",
    "Quiet",
    "Amber",
    "Northern",
    "Crimson",
    "Hidden",
    "Copper",
    "Velvet",
    "Distant",
    "Iron",
]
NOUNS = ["Heron", "Lantern", "Orchard", "Compass", "Harbor", "Falcon", "Meadow", "Anvil", "Willow", "Beacon"]
CITIES = ["Lyon", "Porto", "Ghent", "Tartu", "Bergen", "Kraków", "Leipzig", "Graz", "Turku", "Bilbao"]
FIRST = ["Ada", "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas"]
LAST = ["Brennan", "Okafor", "Lindqvist", "Moreau", "Tanaka", "Varga", "Castillo", "Novak", "Weber", "Sato"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
TOPICS = ["old maps", "river birds", "printing presses", "clock repair", "folk songs", "sea charts"]


@dataclass(frozen=True)
class Needle:
    """A synthetic chunk, the question it answers, and the text a correct answer contains."""

    chunk: ScoredChunk
    question: str
    answer: str


def make_needles(n: int, seed: int = 0) -> list[Needle]:
    """``n`` needles with distinct society names and codes (deterministic for a seed)."""
    rng = random.Random(f"needle-{seed}")
    names = rng.sample([f"{a} {b}" for a in ADJECTIVES for b in NOUNS], n)
    codes = rng.sample(range(1000, 10000), n)
    return [_needle(i, name, str(code), rng) for i, (name, code) in enumerate(zip(names, codes, strict=True))]


def needle_layouts(
    needles: Sequence[Needle], distractors: Sequence[ScoredChunk], k: int, seed: int = 0
) -> list[tuple[Needle, list[ScoredChunk], int]]:
    """For each needle: its chunks in prompt order (``k`` distractors, the needle at positions
    2, 3, ..., k + 1, 1 in turn: the stitched positions first) and that 1-based position."""
    if len(distractors) < k:
        raise ValueError(f"{k} distractors per prompt need at least {k} chunks, got {len(distractors)}")
    rng = random.Random(f"needle-layout-{seed}")
    out = []
    for i, needle in enumerate(needles):
        chosen = rng.sample(list(distractors), k)
        position = (i + 1) % (k + 1)
        chosen.insert(position, needle.chunk)
        out.append((needle, chosen, position + 1))
    return out


def needle_prompts(
    layouts: Sequence[tuple[Needle, list[ScoredChunk], int]],
    assemble: Callable[[str, Sequence[ScoredChunk]], Prompt],
) -> list[tuple[Needle, Prompt, int]]:
    """Assemble each layout (``assemble`` must keep the given chunk order: ``relevance``)."""
    prompts = []
    for needle, chunks, position in layouts:
        prompt = assemble(needle.question, chunks)
        if [c.chunk_id for c in prompt.chunks] != [c.chunk_id for c in chunks]:
            raise ValueError("the needle prompts need an assembler that keeps the given chunk order")
        prompts.append((needle, prompt, position))
    return prompts


def _needle(i: int, name: str, code: str, rng: random.Random) -> Needle:
    year, city = rng.randint(1850, 1990), rng.choice(CITIES)
    president = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    day, topic, fee = rng.choice(DAYS), rng.choice(TOPICS), rng.randint(20, 90)
    text = (
        f"Registry of societies, entry {i + 1}. The {name} Society was founded in {year} in {city}. "
        f"Its president is {president}. The membership code of the {name} Society is {code}. "
        f"Members meet on the first {day} of every month to discuss {topic}, and new members pay "
        f"an annual fee of {fee} euros and receive a printed handbook."
    )
    chunk = ScoredChunk(doc_id=f"registry-{i + 1}", chunk_id=f"needle-{i + 1}", score=1.0, text=text)
    question = f"What is the membership code of the {name} Society?"
    return Needle(chunk, question, code)
