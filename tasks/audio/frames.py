"""How the audio family cuts a clip into the graph's calls and reads its outputs back (Silero
VAD's streaming interface, as its ``OnnxWrapper`` feeds it): each call takes ``frame`` new
samples with the last ``context`` samples before them in front (16 kHz: 512 + 64 = 576), and a
recurrent state that the previous call returned. Its output is the probability that the frame
holds speech.

Speech spans from the per-frame probabilities follow silero-vad's ``get_speech_timestamps``
(6.2.3, its defaults): a span starts at a frame whose probability is at least ``threshold``
(0.5) and ends once the probability stays below ``threshold - 0.15`` for ``min_silence_ms``
(100 ms); spans shorter than ``min_speech_ms`` (250 ms) are dropped. In samples, end exclusive.
"""

from __future__ import annotations

from tasks.proc import lazy

np = lazy.module("numpy")

THRESHOLD, MIN_SILENCE_MS, MIN_SPEECH_MS = 0.5, 100, 250


def frames(audio, frame: int, context: int):
    """``audio`` (float32 [n]) as the graph's calls: float32 [ceil(n / frame), context + frame],
    the last frame padded with zeros, the first call's context zeros."""
    n = max(1, -(-audio.size // frame))
    fr = np.zeros((n, frame), np.float32)
    fr.reshape(-1)[: audio.size] = audio
    ctx = np.zeros((n, context), np.float32)
    ctx[1:] = fr[:-1, frame - context :]
    return np.concatenate([ctx, fr], 1)


def speech_spans(probs, frame: int, rate: int, threshold: float = THRESHOLD) -> list[tuple[int, int]]:
    """[(start, end)] samples of the speech in a clip whose per-frame probabilities are
    ``probs`` (float [frames]), by the module docstring's rule."""
    neg = threshold - 0.15
    min_silence = int(np.ceil(MIN_SILENCE_MS * rate / 1000 / frame))
    min_speech = MIN_SPEECH_MS * rate / 1000
    spans, start, quiet = [], None, 0
    for i, p in enumerate(np.asarray(probs, np.float64)):
        if start is None:
            if p >= threshold:
                start, quiet = i, 0
            continue
        quiet = quiet + 1 if p < neg else 0
        if quiet >= min_silence:
            spans.append((start * frame, (i - quiet + 1) * frame))
            start, quiet = None, 0
    if start is not None:
        spans.append((start * frame, len(probs) * frame))
    return [(a, b) for a, b in spans if b - a >= min_speech]


def span_iou(spans: list[tuple[int, int]], known: tuple[int, int]) -> float:
    """Intersection over union, in samples, of the union of ``spans`` with span ``known``."""
    a, b = known
    inter = sum(max(0, min(b, y) - max(a, x)) for x, y in spans)
    union = (b - a) + sum(y - x for x, y in spans) - inter
    return inter / union if union > 0 else 0.0
