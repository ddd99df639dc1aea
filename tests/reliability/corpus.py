"""A small corpus, questions and chat prompts shared by the reliability tests.

Each question has exactly one clearly right document (a made-up fact nothing else mentions), so
retrieval picks the same chunk whatever unrelated notes are added while the tests run.
"""

from __future__ import annotations

DOCUMENTS = [
    {
        "id": "zorblax.md",
        "text": "# Zorblax\n\nThe Zorblax project started in 2019 in Lyon. Its secret launch code is 4417 "
        "and its mascot is a purple heron called Pim.",
    },
    {
        "id": "quillon.md",
        "text": "# Quillon bridge\n\nThe Quillon bridge over the river Aube is 212 metres long. It was "
        "painted teal in 1998 and is closed to lorries on Sundays.",
    },
    {
        "id": "marrow.md",
        "text": "# Marrow Street bakery\n\nThe Marrow Street bakery opens at six. Its rye loaf uses a "
        "starter named Bertha that is forty years old.",
    },
    {
        "id": "veltrin.md",
        "text": "# Veltrin observatory\n\nThe Veltrin observatory sits at 2,310 metres. Its main telescope "
        "has a 1.8 metre mirror and it catalogued comet Ossary in 2011.",
    },
    {
        "id": "pelmark.md",
        "text": "# Pelmark rowing club\n\nThe Pelmark rowing club was founded by Ines Calder. Its boats are "
        "named after winds; the fastest eight is called Mistral.",
    },
    {
        "id": "durnhold.md",
        "text": "# Durnhold library\n\nThe Durnhold library holds 84,000 books. Its reading room is open "
        "until ten and its oldest map shows the harbour in 1604.",
    },
]

QUESTIONS = [
    "What is the secret launch code of the Zorblax project?",
    "How long is the Quillon bridge?",
    "What is the name of the Marrow Street bakery's starter?",
    "How large is the mirror of the Veltrin observatory's telescope?",
    "Who founded the Pelmark rowing club?",
    "How many books does the Durnhold library hold?",
]

_FACTS = (
    "You answer in one short sentence. Facts: the Harwick ferry leaves at 7:40; the ferry's captain is "
    "Noor Adeyemi; tickets cost 12 euros; the crossing takes 50 minutes."
)

CHATS = [
    [{"role": "system", "content": _FACTS}, {"role": "user", "content": "When does the ferry leave?"}],
    [{"role": "system", "content": _FACTS}, {"role": "user", "content": "Who is the captain?"}],
    [{"role": "system", "content": _FACTS}, {"role": "user", "content": "How much is a ticket?"}],
    [
        {"role": "system", "content": _FACTS},
        {"role": "user", "content": "How long is the crossing?"},
        {"role": "assistant", "content": "The crossing takes 50 minutes."},
        {"role": "user", "content": "And when does it leave?"},
    ],
    [{"role": "user", "content": "Name three colours of the rainbow."}],
    [{"role": "user", "content": "Write the word 'harbour' backwards."}],
]


def note(i: int) -> dict[str, str]:
    """An unrelated document (a garden note) that retrieval for QUESTIONS never picks."""
    return {
        "id": f"note-{i:03d}",
        "text": f"Garden note {i}: plot {i} grew {10 + i} tomato plants and {i % 7 + 2} rows of beans this "
        f"summer; the watering rota changed on day {i % 28 + 1}.",
    }
