"""rag.prompt: the prompt assembler, its chunk-order policies and the chat-template layout."""

from rag.prompt.assembler import DEFAULT_SYSTEM_PROMPT, Prompt, PromptAssembler, Segment

__all__ = ["DEFAULT_SYSTEM_PROMPT", "Prompt", "PromptAssembler", "Segment"]
