"""``export.stream``: how the audio family's graph is fed (imported when the recipe schema is
assembled; the stages read the plain values)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Stream(BaseModel):
    """A graph called once per frame of a stream: ``frame`` new samples at ``rate`` Hz with the
    ``context`` samples before them in front (input ``input``: [1, context + frame]), a
    recurrent state fed back from output to input (``recurrent``), and ``output`` the
    per-frame speech probability. Written into the export's ``io.json`` and the model card."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    rate: int = Field(16000, ge=8000, le=48000, description="samples per second")
    frame: int = Field(512, ge=16, le=16384, description="new samples per call")
    context: int = Field(64, ge=0, le=16384, description="samples of the previous frame in front of each call's")
    input: str = Field("input", description="the graph input the samples go to")
    output: str = Field("output", description="the graph output holding the frame's speech probability")
    recurrent: dict[str, str] = Field(
        default_factory=dict, description="{input: output} fed back each call (its first value: zeros)"
    )

    @model_validator(mode="after")
    def _ok(self):
        if self.context > self.frame:
            raise ValueError(f"expected a context of at most one frame ({self.frame}), found {self.context}")
        return self


#: the annotation of ``export.stream`` (absent outside audio recipes)
OPTIONAL_STREAM = Stream | None
