"""Which part of the model a pipeline stage holds, and the names of its tensors in the whole model.

With ``pipeline_parallel_size`` P, stage s (Megatron's pipeline rank) builds decoder layers
``s * L/P .. (s+1) * L/P - 1`` (megatron-core's even split; L must divide by P); the first stage
also the word embeddings, the last the final norm and the output layer. Inside a stage's GPTModel
the layers count from 0 (``decoder.layers.0`` of stage 1 is layer L/P of the model). The
**global** names renumber them as in a one-stage model, so HF names, LoRA's PEFT names and
optimizer-state keys in checkpoints do not depend on the number of stages.

With ``virtual_pipeline_parallel_size`` V (megatron-core's interleaved schedule) each rank holds V
model chunks: chunk v of stage s builds layers ``(v * P + s) * L/(P*V) ..`` (L must divide by P x V).
The first chunk of stage 0 embeds, the last chunk of stage P-1 holds the final norm and the output
layer; each chunk is a ``PipelineStage`` with its ``chunk`` index.

Tied embeddings (``tie_word_embeddings``): one stage shares one tensor between the embedding and the
output layer. With several stages the last one holds its own copy as ``output_layer.weight``
(megatron-core's layout), loaded from the same HF tensor; its global name is the embedding's,
``embedding.word_embeddings.weight``, and the worker keeps the copies equal by summing their
gradients over Megatron's embedding group (first and last stage).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EMBEDDING = "embedding.word_embeddings.weight"
_TIED_COPY = "output_layer.weight"


@dataclass(frozen=True)
class PipelineStage:
    rank: int
    size: int
    layer_offset: int
    """Global index of this stage's first decoder layer."""
    num_layers: int
    tied_embeddings: bool
    chunk: int = 0
    """This model chunk's index on its rank (virtual pipeline stage)."""
    chunks: int = 1

    @property
    def first(self) -> bool:
        """Embeds the tokens: the first chunk of the first stage."""
        return self.rank == 0 and self.chunk == 0

    @property
    def last(self) -> bool:
        """Holds the final norm and the output layer: the last chunk of the last stage."""
        return self.rank == self.size - 1 and self.chunk == self.chunks - 1

    @property
    def holds_tied_copy(self) -> bool:
        """This stage's ``output_layer.weight`` is a copy of the first stage's word embeddings."""
        return self.tied_embeddings and self.last and not self.first

    def to_global(self, name: str) -> str:
        """A tensor name of this stage's GPTModel (``decoder.layers.0.…``) -> its name in the whole model."""
        m = _LAYER.match(name)
        if m:
            return f"decoder.layers.{int(m[1]) + self.layer_offset}.{m[2]}"
        if self.holds_tied_copy and name == _TIED_COPY:
            return _EMBEDDING
        return name

    def to_local(self, name: str) -> str | None:
        """Inverse of ``to_global``; None for a tensor this stage does not hold."""
        m = _LAYER.match(name)
        if m:
            local = int(m[1]) - self.layer_offset
            return f"decoder.layers.{local}.{m[2]}" if 0 <= local < self.num_layers else None
        if name.startswith("embedding."):
            if self.first:
                return name
            return _TIED_COPY if self.holds_tied_copy and name == _EMBEDDING else None
        if name.startswith(("decoder.final_layernorm.", "output_layer.")):
            return name if self.last else None
        raise ValueError(f"{name}: not a GPTModel tensor name this backend maps")

    def holds_hf_layer(self, hf_name: str) -> bool:
        """False for ``model.layers.<i>.…`` of another stage's layer (other names: True)."""
        if not hf_name.startswith("model.layers."):
            return True
        return 0 <= int(hf_name.split(".")[2]) - self.layer_offset < self.num_layers


def stage_of(gpt, pipeline_rank: int, pipeline_size: int, tied_embeddings: bool, chunk: int = 0,
             chunks: int = 1) -> PipelineStage:
    """The stage a built GPTModel is (its layers know their global 1-based ``layer_number``)."""
    layers = gpt.decoder.layers
    offset = layers[0].layer_number - 1 if len(layers) else 0
    return PipelineStage(pipeline_rank, pipeline_size, offset, len(layers), tied_embeddings, chunk, chunks)


def check_fits(hf_config, pipeline_size: int, virtual_size: int = 1) -> None:
    layers = hf_config.num_hidden_layers
    if virtual_size > 1 and layers % (pipeline_size * virtual_size):
        raise ValueError(f"pipeline_parallel_size={pipeline_size} x virtual_pipeline_parallel_size={virtual_size} must "
                         f"divide num_hidden_layers={layers} of the model (each model chunk holds the same number "
                         "of decoder layers)")
    if layers % pipeline_size:
        raise ValueError(f"pipeline_parallel_size={pipeline_size} must divide num_hidden_layers={layers} of the "
                         "model (each pipeline stage holds the same number of decoder layers)")
