"""Incremental detokenization with stop strings: text deltas safe to show, never a half character."""

from __future__ import annotations

from typing import Any


class Detokenizer:
    """Turns a growing list of completion token ids into text deltas, honouring stop strings.

    Text that could still be the start of a stop string, or an incomplete UTF-8 character, is held
    back until the next token decides it.

    Example:
        >>> d = Detokenizer(tokenizer, stop=["\\n\\n"])      # doctest: +SKIP
        >>> d.push(token_id)                                 # -> "Hel" (the new visible text)
        >>> d.stopped, d.text
    """

    def __init__(self, tokenizer: Any, stop: list[str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.stop = list(stop or [])
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""  # full decoded text, truncated at a stop string once one is seen
        self.emitted = 0  # characters of self.text already handed out
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add one token; return the text that became safe to show."""
        if self.stopped:
            return ""
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # incomplete multi-byte character: wait for the next token
            return ""
        search_from = max(0, len(self.text) - self.holdback)
        self.text = text
        if self.stop:
            cut = self._find_stop(search_from)
            if cut is not None:
                self.text = text[:cut]
                self.stopped = True
                return self._take(len(self.text))
        return self._take(len(self.text) - self.holdback)

    def flush(self) -> str:
        """At the end of generation: everything not yet shown (minus a dangling replacement char)."""
        return self._take(len(self.text.rstrip("\ufffd")))

    def _find_stop(self, start: int) -> int | None:
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i != -1]
        return min(hits) if hits else None

    def _take(self, upto: int) -> str:
        if upto <= self.emitted:
            return ""
        delta = self.text[self.emitted : upto]
        self.emitted = upto
        return delta
