"""The recipe's ``source`` section, which the download stage takes whole."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Source(BaseModel):
    """Where the model comes from: exactly one of ``hf`` (a Hub repo at a revision), ``path`` (a
    folder or one model file of the project) or ``package`` (an installed package's folder, or
    with ``file`` one model file inside it, found without importing the package: a package such
    as silero_vad imports torch when imported); ``shape: true`` makes
    random weights of an ``hf`` model's kept config instead (:mod:`tasks.sources.shape`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    hf: str | None = Field(None, description="Hub repo id, e.g. sentence-transformers/all-MiniLM-L6-v2")
    revision: str | None = Field(None, description="branch, tag or 40-hex commit (hf only)")
    allow_patterns: list[str] | None = None
    path: str | None = Field(None, description="local folder, relative to the project root")
    package: str | None = Field(None, description="importable package that ships a model folder")
    subdir: str = Field("", description="folder inside the package (package only)")
    file: str | None = Field(
        None,
        description="package only: one model file (an ONNX graph) inside the package's "
        "folder, e.g. models/ch_PP-OCRv4_rec_infer.onnx; a path source "
        "names a file by its path",
    )
    shape: bool = Field(
        False,
        description="hf only: a shape build, random weights of the model's kept config "
        "(recipes/models/) instead of the Hub's (tasks/sources/shape.py)",
    )
    tokenizer: str | None = Field(
        None, description="shape only: folder of tokenizer files, relative to the project root"
    )
    seed: int = Field(0, ge=0, description="shape only: the random weights' seed")

    @model_validator(mode="after")
    def _one_kind(self):
        given = [k for k in ("hf", "path", "package") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"expected exactly one of hf, path, package; found {given or 'none'}")
        if self.hf is not None:
            if not re.match(r"^[\w.-]+(/[\w.-]+)?$", self.hf):
                raise ValueError(f"expected a Hub repo id like 'org/name', found {self.hf!r}")
            if self.revision is None:
                raise ValueError("expected 'revision' (a commit, branch or tag) for an hf source")
        elif self.revision is not None or self.allow_patterns is not None:
            raise ValueError("'revision' and 'allow_patterns' apply to hf sources only")
        if self.subdir and self.package is None:
            raise ValueError("'subdir' applies to package sources only")
        if self.file is not None:
            if self.package is None:
                raise ValueError("'file' applies to package sources only (a path source names its file by its path)")
            if self.subdir:
                raise ValueError("expected one of 'subdir' (a model folder) and 'file' (one model file), found both")
            if self.file.startswith("/") or ".." in self.file.split("/") or not self.file.strip("/"):
                raise ValueError(f"expected a path relative to the package's folder, without '..', found {self.file!r}")
        if self.shape and (self.hf is None or self.tokenizer is None):
            raise ValueError(
                "expected 'hf', 'revision' and 'tokenizer' with 'shape: true' (random weights of the Hub "
                f"model's kept config), found {'no tokenizer' if self.hf else 'no hf'}"
            )
        if not self.shape and (self.tokenizer is not None or self.seed):
            raise ValueError("'tokenizer' and 'seed' apply to shape builds only (shape: true)")
        return self

    @property
    def kind(self) -> str:
        return "shape" if self.shape else "hf" if self.hf else "path" if self.path else "package"
