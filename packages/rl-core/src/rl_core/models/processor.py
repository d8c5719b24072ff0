"""The processor of a vision-language model directory, on any install.

``load_processor(path)`` is ``AutoProcessor.from_pretrained(path)`` where that works. Qwen2-VL-style
processors (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) also hold a video processor, and transformers' video processors
need torchvision; a CPU-only torch from PyPI has no matching torchvision build (the PyPI torchvision wheel
is a CUDA build that does not load against ``torch+cpu``). Without torchvision these families load as
the *image-only* form of their own processor class: the same class (its image-token expansion, chat
template and call signature are HF's own), built from the image processor and the tokenizer alone.
Asking it for videos is an error; images and text behave exactly as in the full processor.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

PROCESSOR_CONFIG = "processor_config.json"
"""The processor file of transformers 5 (sub-processor settings nested in it)."""


def needs_torchvision(processor_class: type) -> bool:
    """True when ``processor_class`` holds a video processor (transformers' need torchvision)."""
    return "video_processor" in processor_class.get_attributes()


@functools.cache
def image_only_processor_class(processor_class: type) -> type:
    """``processor_class`` without its video processor, under the same class name.

    ``ProcessorMixin`` reads a processor's parts from the signature of ``__init__``, so a subclass whose
    ``__init__`` takes only the image processor and the tokenizer is built, saved and loaded from those two;
    the parent's ``__init__`` still sets the image token ids. Saving it writes the parent's class name, so
    the directory loads as the full processor wherever torchvision is installed.
    """

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # The parent passes (image_processor, tokenizer, video_processor) on to ProcessorMixin, which pairs
        # them with this class's two parts: the video processor (None) is left out.
        processor_class.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    def __call__(self, *args, videos=None, **kwargs):
        if videos is not None:
            raise ValueError(f"{processor_class.__name__} was loaded without its video processor (torchvision is "
                             "not installed): it takes images and text only")
        return processor_class.__call__(self, *args, **kwargs)

    return type(processor_class.__name__, (processor_class,), {
        "__init__": __init__, "__call__": __call__, "__module__": __name__,
        "__doc__": f"{processor_class.__name__} for images and text, without a video processor.",
    })


def processor_class_name(path: str | Path) -> str | None:
    """The processor class a model directory names (``processor_config.json``, else its model type)."""
    path = Path(path)
    config_file = path / PROCESSOR_CONFIG
    if config_file.is_file():
        name = json.loads(config_file.read_text(encoding="utf-8")).get("processor_class")
        if name:
            return name
    from transformers import AutoConfig
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    model_type = AutoConfig.from_pretrained(path).model_type
    return PROCESSOR_MAPPING_NAMES.get(model_type)


def load_processor(path: str | Path) -> Any:
    """The processor of the model at ``path`` (see the module doc); a text-only model gives its tokenizer."""
    import transformers
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    name = processor_class_name(path)
    processor_class = getattr(transformers, name, None) if name else None
    if processor_class is not None and not is_torchvision_available() and needs_torchvision(processor_class):
        return image_only_processor_class(processor_class).from_pretrained(path)
    return AutoProcessor.from_pretrained(path)


def is_vision_language_model(path: str | Path) -> bool:
    """Whether the HF model directory ``path`` holds a vision-language model (its config has a
    ``vision_config``): it takes images through its processor, and trains and exports as
    ``AutoModelForImageTextToText``."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return False
    return "vision_config" in json.loads(config_file.read_text(encoding="utf-8"))
