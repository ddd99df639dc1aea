"""The `prefixrag` command."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

app = typer.Typer(
    help="prefixrag: retrieval-augmented QA built around prefix KV-cache reuse.", no_args_is_help=True
)
console = Console()


@app.command()
def demo(model: str = typer.Option("smollm2-135m-instruct", help="registry name or HF model dir")) -> None:
    """Load the default model, answer a question, print the answer and its TTFT."""
    import torch

    from engine.models import load_model

    t0 = time.perf_counter()
    loaded = load_model(model)
    console.print(f"loaded [bold]{loaded.model_id}[/] in {time.perf_counter() - t0:.1f} s")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    input_ids = torch.tensor([ids])
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = loaded.model(input_ids=input_ids, logits_to_keep=1)
        ttft = time.perf_counter() - t0
        first = out.logits[0, -1].argmax()
        gen = loaded.model.generate(input_ids, max_new_tokens=48, do_sample=False)
    text = loaded.tokenizer.decode(gen[0, input_ids.shape[1] :], skip_special_tokens=True)
    console.print(f"[bold]Q:[/] {messages[0]['content']}\n[bold]A:[/] {text}")
    console.print(f"TTFT {ttft * 1000:.0f} ms (first token {loaded.tokenizer.decode([int(first)])!r})")


@app.command()
def serve(
    host: str = typer.Option(None, help="interface to listen on (env PREFIXRAG_HOST; default 127.0.0.1)"),
    port: int = typer.Option(None, help="TCP port (env PREFIXRAG_PORT; default 8000)"),
    index: Path = typer.Option(
        None, "--index", help="document index directory, loaded and saved (env PREFIXRAG_INDEX_DIR)"
    ),
    model: str = typer.Option(None, help="registry name or HF model dir (env PREFIXRAG_ENGINE__MODEL)"),
    log_level: str = typer.Option("info", help="uvicorn log level"),
) -> None:
    """Serve the HTTP API (OpenAI-compatible routes, /v1/ask, documents, metrics) and the web page."""
    from pydantic import ValidationError

    from rag.api.server import serve as run_server
    from rag.api.settings import Settings

    overrides: dict[str, Any] = {"host": host, "port": port, "index_dir": index}
    if model:
        overrides["engine"] = {"model": model}  # merged into PREFIXRAG_ENGINE__* values
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        console.print(f"[red]invalid settings:[/] {exc}")
        raise typer.Exit(2) from exc
    console.print(f"serving [bold]{settings.engine.model}[/] on http://{settings.host}:{settings.port}")
    run_server(settings, log_level=log_level)


@app.command()
def version() -> None:
    """Print the installed version."""
    from importlib.metadata import version as v

    console.print(v("prefixrag"))


if __name__ == "__main__":
    app()
