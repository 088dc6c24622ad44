"""The registry of model families (``tasks.contract``): a family found by its name, the stage
kinds its table and the others' merge into, and an implementation found through a table."""

import pytest

from tasks.contract import FAMILIES, family, implementation, implementation_modules, kinds


def test_a_family_is_found_by_name_and_an_unknown_one_is_named_with_the_known():
    for name in FAMILIES:
        fam = family(name)
        assert fam.name == name and fam.stages["download"] == "tasks.sources.download"  # shared, in every table
        assert fam.stages.get("patch", "tasks.patches.stage") == "tasks.patches.stage"  # shared where a table has it
    with pytest.raises(KeyError, match=f"unknown model family 'nosuch'; known: {', '.join(FAMILIES)}"):
        family("nosuch")


def test_the_kinds_of_every_table_merge_in_build_order():
    """The LLM table's own kinds land where its table puts them among the encoder's."""
    order = [k for k in kinds() if k in family("encoder").stages or k in family("llm").stages]
    assert order == [
        "download",
        "export",
        "patch",
        "calibrate",
        "quantize",
        "compile",
        "genie_quantize",
        "genie_compile",
        "bundle",
        "verify",
    ]


def test_an_implementation_is_found_through_the_familys_table():
    assert implementation("export", "llm").module == "tasks.llm.export"
    assert implementation("export", "encoder").module == "tasks.encoder.export"
    assert implementation("download").module == "tasks.sources.download"  # one module every family names
    assert implementation_modules("compile")[:2] == ["tasks.encoder.compile", "tasks.llm.compile"]  # registry order
    with pytest.raises(KeyError, match=r"stage kind 'export' has \d+ implementations \(tasks.encoder.export, tasks"):
        implementation("export")
    with pytest.raises(KeyError, match="no encoder implementation of stage kind 'bundle'; encoder has download"):
        implementation("bundle", "encoder")
