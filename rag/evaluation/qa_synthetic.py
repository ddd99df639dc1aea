"""The synthetic part of the answer-quality set (``rag/data/qa_eval.json``): made-up facts no model can
know beforehand, written from templates with seeded values, never from a model's output.

* ``fact`` items: one fact chunk (an entry about a made-up society, ship, lab, ...) among real
  distractor chunks of the bundled corpus, at chunk position 1, 2, ..., k in turn; the question asks
  for one of the entry's values (a code, a person, a year, a city, ...), the others are near misses.
* ``two_fact`` items: two fact chunks among distractors, the answer needs both: ``both`` asks for the
  same value of two entries (both must appear), ``bridge`` asks for a value of the person another
  entry names (the question names only the first entry).

Distractors are named by corpus topic and chunk index (``[topic, index]``, resolved against the
knowledge base at run time), drawn from a fixed pool so that warming them stays cheap. The file is
this module's output for ``SEED``; a test regenerates it and compares.

Example:
    >>> items = synthetic_items(seed=SEED, facts_per_position=1, chunks=4, two_fact=2)
    >>> [i["kind"] for i in items][:5], items[0]["positions"]
    (['fact', 'fact', 'fact', 'fact', 'two_fact'], [1])
    >>> items[0]["answers"][0][0] in items[0]["facts"][0]["text"]
    True
"""

from __future__ import annotations

import itertools
import json
import random
import re
import sys
from dataclasses import dataclass
from typing import Any

SEED = 2026
FACTS_PER_POSITION = 24
CHUNKS = 4  # chunks per prompt: the pipeline's default top_k
TWO_FACT = 40

ADJECTIVES = ["Silver", "Quiet", "Amber", "Northern", "Crimson", "Hidden", "Copper", "Velvet", "Distant", "Iron",
              "Golden", "Misty", "Scarlet", "Hollow", "Bright", "Frozen", "Wandering", "Emerald"]  # fmt: skip
NOUNS = ["Heron", "Lantern", "Orchard", "Compass", "Harbor", "Falcon", "Meadow", "Anvil", "Willow", "Beacon",
         "Otter", "Thistle", "Quarry", "Kettle", "Sparrow", "Juniper", "Bastion", "Marlin"]  # fmt: skip
FIRST = ["Ada", "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kaori",
         "Lucia", "Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Stefan", "Tamsin"]  # fmt: skip
LAST = ["Brennan", "Okafor", "Lindqvist", "Moreau", "Tanaka", "Varga", "Castillo", "Novak", "Weber", "Sato",
        "Halloran", "Petrov", "Ferreira", "Koenig", "Abernathy", "Mbeki", "Rautio", "Delacroix"]  # fmt: skip
CITIES = ["Lyon", "Porto", "Ghent", "Tartu", "Bergen", "Krakow", "Leipzig", "Graz", "Turku", "Bilbao",
          "Aarhus", "Brno", "Cork", "Split", "Uppsala", "Ljubljana"]  # fmt: skip
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]  # fmt: skip
COLOURS = ["orange", "violet", "turquoise", "maroon", "olive", "teal", "indigo", "saffron"]
WORDS = ["bluefinch", "redkite", "stonefly", "moonwort", "larkspur", "foxglove", "duckweed", "sandpiper"]

# Corpus chunks the distractors are drawn from: [topic, chunk index] of the bundled reference
DISTRACTOR_POOL: list[tuple[str, int]] = [
    ("assignment", 1), ("async", 0), ("attribute-access", 2), ("calls", 1), ("class", 0),
    ("comparisons", 1), ("compound", 3), ("context-managers", 0), ("customization", 4), ("dict", 0),
    ("execmodel", 2), ("exprlists", 0), ("formatstrings", 1), ("function", 1), ("import", 1),
    ("lists", 0), ("naming", 1), ("numeric-types", 1), ("operator-summary", 0), ("slicings", 0),
    ("string-methods", 3), ("try", 1), ("typesseq", 1), ("with", 0),
]  # fmt: skip


@dataclass(frozen=True)
class Template:
    """An entry about one made-up entity: its sentences and a question per value it states."""

    kind: str
    subject: str  # "the {name} Society"
    text: str
    questions: dict[str, str]  # value slot -> question
    both: str  # two-entry question for the "code" slot: "{a}" and "{b}" are subjects


TEMPLATES = [
    Template(
        "society",
        "the {name} Society",
        "Registry of societies, entry {n}. The {name} Society was founded in {year} in {city}. Its "
        "president is {person}. The membership code of the {name} Society is {code}. Members meet "
        "in the month of {month} to discuss old maps.",
        {
            "code": "What is the membership code of the {name} Society?",
            "person": "Who is the president of the {name} Society?",
            "year": "In which year was the {name} Society founded?",
            "city": "In which city was the {name} Society founded?",
        },
        "What are the membership codes of {a} and {b}?",
    ),
    Template(
        "ship",
        "the research ship {name}",
        "Harbour log, entry {n}. The research ship {name} was launched in {year} and sails from its "
        "home port of {city}. Its captain is {person}. The radio call sign of the {name} is {code}, "
        "and its hull is painted {colour}.",
        {
            "code": "What is the radio call sign of the research ship {name}?",
            "person": "Who is the captain of the research ship {name}?",
            "city": "What is the home port of the research ship {name}?",
            "colour": "What colour is the hull of the research ship {name}?",
        },
        "What are the radio call signs of {a} and {b}?",
    ),
    Template(
        "lab",
        "the {name} Laboratory",
        "Campus notes, entry {n}. The {name} Laboratory opened in {year} on the campus in {city}. Its "
        "director is {person}. The door code of the {name} Laboratory is {code}, and its wifi "
        "password is {word}.",
        {
            "code": "What is the door code of the {name} Laboratory?",
            "word": "What is the wifi password of the {name} Laboratory?",
            "person": "Who is the director of the {name} Laboratory?",
            "year": "In which year did the {name} Laboratory open?",
        },
        "What are the door codes of {a} and {b}?",
    ),
    Template(
        "festival",
        "the {name} Festival",
        "Events calendar, entry {n}. The {name} Festival takes place every {month} in {city}. It was "
        "first held in {year} and is directed by {person}. The ticket number printed on this year's "
        "pass for the {name} Festival is {code}.",
        {
            "code": "What ticket number is printed on this year's pass for the {name} Festival?",
            "month": "In which month does the {name} Festival take place?",
            "city": "In which city does the {name} Festival take place?",
            "person": "Who directs the {name} Festival?",
        },
        "What ticket numbers are printed on this year's passes for {a} and {b}?",
    ),
    Template(
        "hut",
        "the {name} mountain hut",
        "Alpine club guide, entry {n}. The {name} mountain hut was built in {year} above the valley of "
        "{city}. Its warden is {person}. The emergency radio channel of the {name} hut is {code}, and "
        "its shutters are painted {colour}.",
        {
            "code": "What is the emergency radio channel of the {name} mountain hut?",
            "person": "Who is the warden of the {name} mountain hut?",
            "year": "In which year was the {name} mountain hut built?",
            "colour": "What colour are the shutters of the {name} mountain hut?",
        },
        "What are the emergency radio channels of {a} and {b}?",
    ),
    Template(
        "project",
        "Project {name}",
        "Engineering archive, entry {n}. Project {name} started in {year} at the office in {city}. Its "
        "lead engineer is {person}. The budget code of Project {name} is {code}, and its release is "
        "planned for {month}.",
        {
            "code": "What is the budget code of Project {name}?",
            "person": "Who is the lead engineer of Project {name}?",
            "city": "At the office in which city did Project {name} start?",
            "month": "In which month is the release of Project {name} planned?",
        },
        "What are the budget codes of {a} and {b}?",
    ),
]

BRIDGE_TEXT = (
    "Staff directory, entry {n}. {person} has an office in room {room} of the {colour} building and "
    "has worked there since {year}. Visitors can reach {person} on telephone extension {ext}."
)
BRIDGE_QUESTION = "In which room does {role} of {subject} have an office?"
ROLES = {
    "society": "the president",
    "ship": "the captain",
    "lab": "the director",
    "festival": "the director",
    "hut": "the warden",
    "project": "the lead engineer",
}


class _Values:
    """Unique made-up values, drawn without replacement where they identify an answer."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.names = _shuffled(rng, [f"{a} {b}" for a, b in itertools.product(ADJECTIVES, NOUNS)])
        self.people = _shuffled(rng, [f"{a} {b}" for a, b in itertools.product(FIRST, LAST)])
        self.codes = _unused(rng, range(5000, 9000))
        self.years = _unused(rng, range(1852, 1989))
        self.rooms = _unused(rng, range(110, 990))
        self.exts = _unused(rng, range(30000, 60000, 7))

    def slots(self, n: int) -> dict[str, str]:
        rng = self.rng
        return {
            "n": str(n),
            "name": self.names.pop(),
            "person": self.people.pop(),
            "code": self.codes.pop(),
            "year": rng.choice(self.years),  # asked only where one entry is in the prompt
            "city": rng.choice(CITIES),
            "month": rng.choice(MONTHS),
            "colour": rng.choice(COLOURS),
            "word": f"{rng.choice(WORDS)}{rng.randint(10, 99)}",
        }


def synthetic_items(
    seed: int = SEED,
    facts_per_position: int = FACTS_PER_POSITION,
    chunks: int = CHUNKS,
    two_fact: int = TWO_FACT,
) -> list[dict[str, Any]]:
    """The ``fact`` items (the fact at positions 1..chunks in turn) then the ``two_fact`` items."""
    rng = random.Random(f"qa-synthetic-{seed}")
    values = _Values(rng)
    entry = itertools.count(1)
    items: list[dict[str, Any]] = []
    for i in range(facts_per_position * chunks):
        template = TEMPLATES[i % len(TEMPLATES)]
        slot = list(template.questions)[(i // len(TEMPLATES)) % len(template.questions)]
        fact = values.slots(next(entry))
        items.append(
            _item(
                f"s{i + 1:03d}",
                "fact",
                template.kind,
                template.questions[slot].format(**fact),
                [[fact[slot]]],
                [_chunk(template, fact)],
                [i % chunks + 1],
                _distractors(rng, chunks - 1),
            )
        )
    pairs = list(itertools.combinations(range(1, chunks + 1), 2))
    for j in range(two_fact):
        template = TEMPLATES[j % len(TEMPLATES)]
        first, second = values.slots(next(entry)), values.slots(next(entry))
        positions = list(pairs[j % len(pairs)])
        if j % 2 == 0:  # both: the same value of two entries
            subjects = [template.subject.format(**first), template.subject.format(**second)]
            question = template.both.format(a=subjects[0], b=subjects[1])
            answers = [[first["code"]], [second["code"]]]
            facts = [_chunk(template, first), _chunk(template, second)]
            sub = "both"
        else:  # bridge: the room of the person the first entry names
            room = values.rooms.pop()
            person = {"n": second["n"], "person": first["person"], "room": room, "colour": second["colour"],
                      "year": second["year"], "ext": values.exts.pop()}  # fmt: skip
            subject = template.subject.format(**first)
            question = BRIDGE_QUESTION.format(role=ROLES[template.kind], subject=subject)
            answers = [[room]]
            directory = {"doc_id": f"staff-{second['n']}", "text": BRIDGE_TEXT.format(**person)}
            facts = [_chunk(template, first), directory]
            sub = "bridge"
        distractors = _distractors(rng, chunks - 2)
        items.append(
            _item(f"t{j + 1:03d}", "two_fact", sub, question, answers, facts, positions, distractors)
        )
    return items


def _item(
    item_id: str,
    kind: str,
    sub: str,
    question: str,
    answers: list[list[str]],
    facts: list[dict[str, str]],
    positions: list[int],
    distractors: list[list[Any]],
) -> dict[str, Any]:
    return {
        "id": item_id,
        "kind": kind,
        "subkind": sub,
        "question": question,
        "answers": answers,
        "facts": facts,
        "positions": positions,
        "distractors": distractors,
    }


def _chunk(template: Template, values: dict[str, str]) -> dict[str, str]:
    return {"doc_id": f"{template.kind}-{values['n']}", "text": template.text.format(**values)}


def _distractors(rng: random.Random, k: int) -> list[list[Any]]:
    return [[topic, index] for topic, index in rng.sample(DISTRACTOR_POOL, k)]


def _shuffled(rng: random.Random, values: list[str]) -> list[str]:
    rng.shuffle(values)
    return values


def _unused(rng: random.Random, numbers: range) -> list[str]:
    """The numbers that appear nowhere in the bundled corpus as a word, shuffled (an answer a
    distractor chunk holds would score a copied distractor as correct)."""
    from pydoc_data.topics import topics

    seen = {w for text in topics.values() for w in re.findall(r"\d+", text)}
    return _shuffled(rng, [str(n) for n in numbers if str(n) not in seen])


if __name__ == "__main__":  # prints the synthetic items as the data file holds them
    json.dump(synthetic_items(), sys.stdout, indent=1, ensure_ascii=False)
