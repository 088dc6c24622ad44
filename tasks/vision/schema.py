"""``export.preprocess``: the one vision recipe value with a model of its own (imported when the
recipe schema is assembled; the stages read the plain values)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Preprocess(BaseModel):
    """How an image becomes the graph's input (``tasks.vision.inputs.preprocess``), written
    into the export's ``io.json`` and the model card: what a caller must do before feeding it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    size: list[int] = Field(description="[height, width] of the graph's input (batch 1, 3 channels, NCHW)")
    resize: Literal["height", "fit"] = Field(
        description="height: scaled to the height keeping the aspect ratio, the width padded on the right (text "
        "lines); fit: scaled to fit, placed top-left on white (pages)"
    )
    mean: list[float] = Field(description="per channel, on 0..1 pixel values, in the fed channel order")
    std: list[float] = Field(description="per channel, on 0..1 pixel values, in the fed channel order")
    colour: Literal["RGB", "BGR"] = Field("BGR", description="channel order fed (PaddleOCR models read BGR)")
    pad: float = Field(0.0, description="resize height: the normalised value of the padded width")

    @model_validator(mode="after")
    def _shapes(self):
        if len(self.size) != 2 or min(self.size) < 8 or max(self.size) > 4096:
            raise ValueError(f"expected size [height, width], each 8..4096, found {self.size}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"expected 3 means and 3 positive stds, found mean {self.mean}, std {self.std}")
        return self


#: the annotation of ``export.preprocess`` (absent outside vision recipes)
OPTIONAL_PREPROCESS = Preprocess | None
