"""``quantize.overrides``: the one recipe value with a model of its own (a pydantic model,
imported when the recipe schema is assembled, not by the stages that read the plain values)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Override(BaseModel):
    """``quantize.overrides[i]``: weights whose initializer name matches ``pattern`` kept at
    ``weight_bits``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    pattern: str = Field(description="regex matched (re.search) against weight initializer names")
    weight_bits: Literal[4, 8, 16] = 8

    @field_validator("pattern")
    @classmethod
    def _regex(cls, v):
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"expected a regular expression, found {v!r} ({e})") from None
        return v


#: the annotation of ``quantize.overrides``
OVERRIDES = list[Override]
