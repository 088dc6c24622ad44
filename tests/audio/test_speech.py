"""The audio family's inputs (espeak-ng speech between silence and noise, its span known) and how
a clip becomes the graph's calls and its probabilities speech spans."""

from __future__ import annotations

import numpy as np

from tasks.audio import frames as F, speech as S


def test_a_clip_is_deterministic_and_its_speech_span_is_where_the_voice_is():
    a = S.clip("The old lighthouse stood on a rock.", "en-gb", 3, 7, 16000, ("silence", "white", "brown"))
    b = S.clip("The old lighthouse stood on a rock.", "en-gb", 3, 7, 16000, ("silence", "white", "brown"))
    assert np.array_equal(a["audio"], b["audio"]) and a["span"] == b["span"]
    start, end = a["span"]
    assert 0.3 * 16000 <= start and end <= a["audio"].size - 0.3 * 16000  # lead and tail of 0.3-0.8 s
    assert 1.0 < (end - start) / 16000 < 4.0  # a sentence of seven words
    assert np.abs(a["audio"][start:end]).max() > 0.1
    assert S.espeak_version().startswith("eSpeak NG")


def test_resampling_keeps_a_tone_in_band():
    t = np.arange(22050) / 22050
    y = S.resample(np.sin(2 * np.pi * 440 * t).astype(np.float32), 22050, 16000)
    assert y.size == 16000
    spec = np.abs(np.fft.rfft(y))
    assert int(np.argmax(spec)) == 440


def test_frames_put_the_previous_frames_tail_in_front():
    audio = np.arange(1100, dtype=np.float32)
    f = F.frames(audio, 512, 64)
    assert f.shape == (3, 576)
    assert (
        np.all(f[0, :64] == 0)
        and np.array_equal(f[1, :64], audio[448:512])
        and np.array_equal(f[1, 64:], audio[512:1024])
    )
    assert np.array_equal(f[2, 64:140], audio[1024:]) and np.all(f[2, 140:] == 0)


def test_speech_spans_follow_silero_s_hysteresis():
    p = np.array([0.1] * 5 + [0.9] * 20 + [0.4] * 2 + [0.9] * 5 + [0.1] * 10 + [0.9] * 3 + [0.1] * 5)
    spans = F.speech_spans(p, 512, 16000)
    assert spans == [(5 * 512, 32 * 512)]  # 0.4 is above 0.35: no end; 3 frames (96 ms) < 250 ms: dropped
    assert F.span_iou(spans, (5 * 512, 32 * 512)) == 1.0 and F.span_iou([], (0, 10)) == 0.0
