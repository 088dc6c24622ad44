"""The calibration sets shipped for int4 (issue 21): a chat set for LLMs (English and Chinese,
several domains, at least 128 conversations) rendered in the model's chat template, and the
English set of the MiniLM w4a16 recipe, kept apart from its verify sentences."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

from conftest import REPO
from tasks.llm.calibration_feeds import samples_of

CHAT = REPO / "recipes" / "data" / "calib-chat.jsonl"


def test_chat_set_covers_languages_and_domains():
    rows = [json.loads(line) for line in CHAT.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) >= 128
    per = collections.Counter((r["lang"], r["domain"]) for r in rows)
    assert {lang for lang, _ in per} == {"en", "zh"} and len({d for _, d in per}) >= 6
    assert min(per.values()) >= 10
    for r in rows:
        roles = [m["role"] for m in r["messages"]]
        body = roles[1:] if roles[0] == "system" else roles
        assert body[0] == "user" and body[-1] == "assistant" and all(a != b for a, b in zip(body, body[1:])), r["id"]


class _Tok:
    """The one tokenizer method samples_of uses (transformers' apply_chat_template signature)."""

    def __init__(self, template):
        self.chat_template = template

    def apply_chat_template(self, msgs, tokenize=False):
        assert tokenize is False
        return "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in msgs)


def test_jsonl_samples_use_the_chat_template_when_the_tokenizer_has_one(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(
        json.dumps(
            {"messages": [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "Hi."}]},
            ensure_ascii=False,
        )
        + "\n\n",
        encoding="utf-8",
    )
    assert samples_of(_Tok("{{ messages }}"), f) == ["<|user|>你好<|end|><|assistant|>Hi.<|end|>"]
    assert samples_of(_Tok(None), f) == ["你好\n\nHi."]
    t = tmp_path / "c.txt"
    t.write_text("one para\nline two\n\n\nsecond\n", encoding="utf-8")
    assert samples_of(_Tok(None), t) == ["one para\nline two", "second"]


GOOD_LINE = '{"messages": [{"role": "user", "content": "a"}]}\n'


@pytest.mark.parametrize(
    "bad, words",
    [
        ('{"msgs": []}', "expected a JSON object with a non-empty list 'messages'"),
        ("[1, 2]", "expected a JSON object with a non-empty list 'messages'"),
        ("null", "expected a JSON object with a non-empty list 'messages'"),
        ('{"messages": [{"role": "user"}]}', "expected messages[0] to be"),
        ('{"messages": ["hello"]}', "expected messages[0] to be"),
        ('{"messages": [{"role": "user", "content": 3}]}', "expected messages[0] to be"),
        ('{"messages": [{"role": "user", "content": "a"}', "expected one JSON object per line, found invalid JSON"),
    ],
)
def test_a_bad_conversation_names_file_and_line(tmp_path, bad, words):
    """Every kind of malformed line is one ValueError naming the file and line (no KeyError,
    TypeError or AttributeError from inside the reader); the recipe load reports it too."""
    f = tmp_path / "c.jsonl"
    f.write_text(GOOD_LINE + bad + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"c.jsonl:2: " + __import__("re").escape(words)):
        samples_of(_Tok(None), f)


def test_a_bom_is_allowed(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text("\ufeff" + GOOD_LINE, encoding="utf-8")
    assert samples_of(_Tok(None), f) == ["a"]


def test_an_llm_recipe_with_a_bad_chat_file_is_a_load_error(tmp_path, monkeypatch):
    from tasks.recipe.checks import load_all

    monkeypatch.setenv("NPUBUILD_ROOT", str(tmp_path))
    (tmp_path / "recipes").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "data" / "c.jsonl").write_text(GOOD_LINE + '{"messages": [{"role": "user"}]}\n', encoding="utf-8")
    (tmp_path / "data" / "v.txt").write_text("one\ntwo\n")
    (tmp_path / "recipes" / "r.yaml").write_text(
        "source: {path: models/m}\nexport: {family: llm, sequence_length: 16, context_length: 64}\n"
        "quantize:\n  calibration: {file: data/c.jsonl, samples: 2}\nverify:\n  data: {file: data/v.txt, samples: 2}\n"
    )
    ok, errs = load_all(tmp_path / "recipes", collect_errors=True)
    assert "r" not in ok
    msg = dict(errs["r"].problems)["quantize.calibration.file"]
    assert msg.endswith('c.jsonl:2: expected messages[0] to be {"role": text, "content": text}, found {"role": "user"}')


def test_english_calibration_set_is_apart_from_the_verify_sentences():
    cal = (REPO / "recipes" / "data" / "calib-en-long.txt").read_text(encoding="utf-8").splitlines()
    ver = {
        s.strip().lower()
        for s in (REPO / "recipes" / "data" / "verify-en.txt").read_text(encoding="utf-8").splitlines()
    }
    assert len([c for c in cal if c.strip()]) == 379
    assert not {c.strip().lower() for c in cal} & ver


def test_a_feed_store_cuts_empty_cache_slots_and_reads_them_back_exactly(tmp_path):
    """:class:`tasks.llm.feed_store.FeedStore` stores a KV buffer [1, Hkv, C, d] cut after
    its last written slot (and an all-zero one empty) and pads the zeros back when read: every
    array comes back equal, dtype and shape included; arrays with no long zero tail are stored
    whole; -0.0 is not cut (its bits are not zero); the same feeds give the same bytes; ``load``
    reads only the names asked for; names the format cannot hold are refused, nothing written."""
    from tasks.llm.feed_store import FeedStore

    rng = np.random.default_rng(0)
    k = np.zeros((1, 2, 64, 8), np.float32)
    k[:, :, :5] = rng.standard_normal((1, 2, 5, 8))
    k[0, 1, 3, 7] = 0.0  # a zero inside the written slots stays
    feed = {
        "past_key_0": k,
        "past_value_0": np.zeros((1, 2, 64, 8), np.float32),
        "hidden": rng.standard_normal((1, 16, 24)).astype(np.float32),
        "input_ids": np.array([[5, 6, 7] + [0] * 13], np.int32),
        "past_seq_len": np.array([[15]], np.int32),
        "total_seq_len": np.array([64], np.int32),
    }
    feed["signed"] = np.array([1.0] + [-0.0] * 9, np.float32)  # -0.0 is not an empty slot: kept bit for bit
    feed["flags"] = np.array([True] + [False] * 9)
    stores = [FeedStore(tmp_path / d) for d in ("a", "b")]
    for s in stores:
        s.add(feed)
        s.add({**feed, "hidden": feed["hidden"] + 1})
    got = stores[0][0]
    assert sorted(got) == sorted(feed)
    for name, a in feed.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape and got[name].tobytes() == a.tobytes(), name
    for bad in ("__cut__", "x.npy"):  # the format's own member, a name np.load would confuse
        with pytest.raises(ValueError, match="feed names"):
            stores[0].add({**feed, bad: np.zeros(2, np.float32)})
    assert len(stores[0]) == 2 and sorted(p.name for p in (tmp_path / "a").iterdir()) == ["000000.npz", "000001.npz"]
    assert np.array_equal(stores[0].load(1, ["hidden", "nope"])["hidden"], feed["hidden"] + 1)
    assert list(stores[0].load(1, ["past_key_0"])) == ["past_key_0"]
    files = [sorted(p.read_bytes() for p in (tmp_path / d).glob("*.npz")) for d in ("a", "b")]
    assert files[0] == files[1]
    raw = sum(a.nbytes for a in feed.values())
    assert (tmp_path / "a" / "000000.npz").stat().st_size < raw - k.nbytes - feed["past_value_0"].nbytes + 4096
