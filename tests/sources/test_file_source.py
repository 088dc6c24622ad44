"""ONNX files as sources: ``{package, file}`` (a file inside an installed wheel, found without
importing the package) and ``{path}`` naming a file; the key hashes the file's bytes; the
manifest and the catalog row carry the licence the package declares."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tasks.store import digest
from tasks.sources import SourceError, download, single_file
from tasks.sources.licence import package_licence, text_licence
from tasks.sources.schema import Source

REC = "models/ch_PP-OCRv4_rec_infer.onnx"


def _folder(package: str) -> Path:
    return Path(importlib.util.find_spec(package).submodule_search_locations[0])


def test_a_package_file_source_is_found_without_importing_the_package():
    params = Source(package="silero_vad", file="data/silero_vad_openvino_16k.onnx").model_dump(exclude_none=True)
    f = single_file(params)
    assert f == _folder("silero_vad") / "data" / "silero_vad_openvino_16k.onnx"
    extra = download.key_extra(params)
    assert extra == {"content": digest.digest_json({f.name: digest.file_digest(f)})}
    assert "silero_vad" not in sys.modules  # found, not imported (importing it imports torch)


def test_the_key_is_the_files_bytes_and_the_copy_is_checked(tmp_path):
    params = Source(package="rapidocr_onnxruntime", file=REC).model_dump(exclude_none=True)
    out = tmp_path / "out"
    out.mkdir()
    info = download.run({}, {}, params, out)
    assert sorted(p.name for p in out.iterdir()) == ["ch_PP-OCRv4_rec_infer.onnx"]
    assert digest.file_digest(out / "ch_PP-OCRv4_rec_infer.onnx") == digest.file_digest(
        _folder("rapidocr_onnxruntime") / REC
    )
    assert info["file"] == "ch_PP-OCRv4_rec_infer.onnx" and info["package_version"] == "1.4.4"
    assert info["license"]["declared"] == "Apache-2.0" and info["license"]["files"] == {}
    material = {"extra": download.key_extra(params)}
    download.check_read(out, material, params)  # the copy holds what the key hashed
    (out / "ch_PP-OCRv4_rec_infer.onnx").chmod(0o644)
    (out / "ch_PP-OCRv4_rec_infer.onnx").write_bytes(b"not the same")
    with pytest.raises(digest.InputChanged, match="ch_PP-OCRv4_rec_infer.onnx"):
        download.check_read(out, material, params)


def test_a_path_source_may_name_one_onnx_file(tmp_path, monkeypatch):
    monkeypatch.setenv("NPUBUILD_ROOT", str(tmp_path))
    (tmp_path / "models").mkdir()
    src = _folder("silero_vad") / "data" / "silero_vad_openvino_16k.onnx"
    (tmp_path / "models" / "vad.onnx").write_bytes(src.read_bytes())
    params = Source(path="models/vad.onnx").model_dump(exclude_none=True)
    assert download.key_extra(params) == {"content": digest.digest_json({"vad.onnx": digest.file_digest(src)})}
    out = tmp_path / "out"
    out.mkdir()
    info = download.run({}, {}, params, out)
    assert info == {"source": "path", "file": "vad.onnx", "files": 1}
    (tmp_path / "models" / "bad.onnx").write_bytes(b"\x00\x01 garbage")
    with pytest.raises(SourceError, match="expected an ONNX model"):
        download.run({}, {}, Source(path="models/bad.onnx").model_dump(exclude_none=True), tmp_path / "out")
    # a path to an .onnx file that is not there is said so, not "not a folder"
    with pytest.raises(SourceError, match=r"source path 'models/gone.onnx': expected a \.onnx file, found nothing at"):
        download.key_extra(Source(path="models/gone.onnx").model_dump(exclude_none=True))


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"path": "x.onnx", "file": "a.onnx"}, "'file' applies to package sources only"),
        ({"package": "silero_vad", "subdir": "data", "file": "a.onnx"}, "found both"),
        ({"package": "silero_vad", "file": "../x.onnx"}, "without '..'"),
    ],
)
def test_file_is_refused_where_it_cannot_apply(kw, message):
    with pytest.raises(ValueError, match=message):
        Source(**kw)


def test_a_missing_file_names_the_files_the_package_has():
    params = Source(package="silero_vad", file="data/nope.onnx").model_dump(exclude_none=True)
    with pytest.raises(SourceError, match="silero_vad_openvino_16k.onnx"):
        download.key_extra(params)


def test_the_licence_comes_from_metadata_and_licence_files_and_says_when_they_disagree():
    assert package_licence("silero_vad")["summary"] == "MIT (package metadata and licence file)"
    assert (
        package_licence("rapidocr_onnxruntime")["summary"]
        == "Apache-2.0 (package metadata, License; no licence file in the wheel)"
    )
    sk = package_licence("skimage")  # a classifier says BSD; the wheel's LICENSE.txt opens with BSD-3-Clause
    assert (sk["declared"], sk["declared_from"], sk["agree"]) == ("BSD", "classifiers", True)
    pil = package_licence("PIL")  # License-Expression MIT-CMU; its LICENSE file's text is another's
    assert pil["declared"] == "MIT-CMU" and not pil["agree"] and "but licence file" in pil["summary"]
    assert text_licence("Permission is hereby granted, free of charge, to any person") == "MIT"
    with pytest.raises(SourceError, match="no installed distribution"):
        package_licence("no_such_package_here")
