"""From a model reference to a GenerationBackend: HF dir, named model, or any rl-checkpoint format."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rl_eval.errors import EvalError


@contextlib.contextmanager
def hf_model_dir(model: str) -> Iterator[str]:
    """A local HF directory for ``model``; checkpoints of other formats are converted into a temp dir
    (removed on exit) with rl-checkpoint."""
    path = Path(model)
    if not path.exists():
        try:
            from rl_core.models import resolve_model
        except ImportError:
            raise EvalError(f"model {model!r}: no such path") from None
        try:
            resolved = resolve_model(model)
        except (KeyError, ValueError, FileNotFoundError) as e:
            raise EvalError(f"model {model!r}: not a path and not a known model name ({e})") from None
        # outside the try: an error of the caller's ``with`` body is its own, not the model name's
        yield str(resolved)
        return
    from rl_checkpoint import CheckpointError, detect_format, to_hf

    try:
        fmt = detect_format(path)
    except CheckpointError as e:
        raise EvalError(str(e)) from None
    if fmt == "hf" and path.is_dir() and (path / "config.json").is_file():
        yield str(path)
        return
    with tempfile.TemporaryDirectory(prefix="rl-eval-model-") as tmp:
        try:
            to_hf(path, Path(tmp) / "hf")
        except CheckpointError as e:
            raise EvalError(f"converting {model} to HF: {e}") from None
        yield str(Path(tmp) / "hf")


def load_tokenizer(model_dir: str):
    """The model's tokenizer; a vision-language model's renders chats with images through its processor
    (``rl_core.image_chat_tokenizer``)."""
    from transformers import AutoTokenizer

    from rl_core.image_chat_tokenizer import chat_tokenizer

    tok = chat_tokenizer(model_dir, AutoTokenizer.from_pretrained(model_dir))
    if tok.chat_template is None:
        raise EvalError(f"{model_dir}: the tokenizer has no chat template; evaluation renders prompts as chats")
    return tok
