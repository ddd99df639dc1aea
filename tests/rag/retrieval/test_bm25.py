import pytest

from rag.retrieval.bm25 import BM25Index, tokenize


def test_tokenize_splits_identifiers_and_folds_endings():
    assert tokenize("The __getattr__ method raises errors") == [
        "the", "__getattr__", "getattr", "method", "rais", "error",
    ]  # fmt: skip
    assert "is_integer" in tokenize("is_integer") and "integer" in tokenize("is_integer")


def test_search_ranks_by_term_match():
    bm25 = BM25Index()
    bm25.add(["a", "b", "c"], ["lists are mutable sequences", "tuples are immutable", "cats purr"])
    assert [k for k, _ in bm25.search("mutable list", 3)] == ["a"]
    assert bm25.search("nothing matches here", 3) == []


def test_add_replace_and_delete_are_seen_by_the_next_search():
    bm25 = BM25Index()
    bm25.add(["a", "b"], ["alpha beta", "gamma delta"])
    assert bm25.search("gamma", 2)[0][0] == "b"
    bm25.add(["b"], ["epsilon"])  # replace
    assert bm25.search("gamma", 2) == [] and bm25.search("epsilon", 2)[0][0] == "b"
    assert bm25.delete(["b", "zzz"]) == 1
    assert bm25.search("epsilon", 2) == [] and len(bm25) == 1
    assert bm25.delete(["a"]) == 1 and bm25.search("alpha", 1) == []


def test_score_of_given_keys():
    bm25 = BM25Index()
    bm25.add(["a", "b"], ["alpha beta", "gamma delta"])
    scores = bm25.score("alpha", ["a", "b", "missing"])
    assert scores["a"] > 0 and scores["b"] == 0 and "missing" not in scores


def test_k_must_be_positive():
    with pytest.raises(ValueError, match="k must be > 0"):
        BM25Index().search("x", 0)


def test_operators_are_tokens_but_table_rules_are_not():
    assert tokenize("x << 2 and a ** b | c") == ["and", "<<", "**", "|"]
    assert "+-----+" not in tokenize("+-----+") and tokenize("+-----+") == []
    assert tokenize("x << 2", operators=False) == []


def test_an_operator_question_finds_the_text_that_explains_it():
    bm25 = BM25Index()
    bm25.add(
        ["unary", "binary", "bits"],
        [
            'The unary "~" (invert) operator yields the bitwise inversion of its integer argument.',
            'The "+" (addition) operator yields the sum of its arguments.',
            "Bitwise operations on integer arguments work on their binary digits.",
        ],
    )
    assert bm25.search("what does the ~ operator compute for an integer?", 3)[0][0] == "unary"
    words_only = BM25Index(operators=False)
    words_only.add(["unary", "bits"], ["the ~ operator inverts", "the operator on integer bits"])
    assert words_only.search("what does ~ do to an integer", 2)[0][0] == "bits"
