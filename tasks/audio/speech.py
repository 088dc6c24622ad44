"""The audio family's inputs, made here: English sentences spoken by espeak-ng (Debian's
``espeak-ng``, run as a program), resampled to the model's rate, between stretches of silence
and noise, in clips whose speech spans are known by construction. Nothing is downloaded; the
same lines, voices and seed give the same samples (espeak-ng's version enters the stage key:
:func:`espeak_version`).

A clip (:func:`clip`) is ``[silence or noise][speech][silence or noise]``: the lead and tail
lengths and the noise kind (none, white, brown) and level are drawn from ``numpy.random.
default_rng([seed, index])``, so a clip depends on its own line only. The speech span is where
espeak-ng's waveform rises above ``SPEECH_FLOOR`` (its own lead-in and trailing silence cut),
in samples of the clip.
"""

from __future__ import annotations

import functools
import io
import shutil
import subprocess
import wave

from tasks.errors import UserError
from tasks.proc import lazy

np = lazy.module("numpy")

#: |amplitude| (of 1.0 full scale) above which espeak-ng's output counts as speech when a
#: clip's speech span is measured: its silences are exact zeros or dither below 1e-3
SPEECH_FLOOR = 0.01


class SpeechError(UserError):
    """espeak-ng is missing, or refused a voice."""


@functools.cache
def espeak_version() -> str:
    """``espeak-ng --version``'s first line (``eSpeak NG text-to-speech: 1.51 ...``), which
    enters the keys of the stages that speak. Raises SpeechError when espeak-ng is not
    installed (``apt-get install espeak-ng``; ``.ci/run`` installs it)."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise SpeechError(
            "espeak-ng is not installed: the audio family speaks its calibration and verify sets with "
            "it (apt-get install espeak-ng)"
        )
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0].split(" Data at:")[0].strip()


def resample(x, rate_in: int, rate_out: int):
    """``x`` (float32 [n]) from ``rate_in`` to ``rate_out`` Hz by the FFT (band-limited: the
    bins above the lower Nyquist are dropped), as ``scipy.signal.resample`` does; float32
    [round(n * rate_out / rate_in)]."""
    n = x.size
    m = int(round(n * rate_out / rate_in))
    spec = np.fft.rfft(x.astype(np.float64))
    keep = min(spec.size, m // 2 + 1)
    out = np.fft.irfft(spec[:keep], m) * (m / n)
    return out.astype(np.float32)


def speak(text: str, voice: str, rate: int, speed: int = 160) -> np.ndarray:
    """``text`` spoken by espeak-ng's ``voice`` at ``speed`` words per minute, float32 [n] in
    [-1, 1] at ``rate`` Hz. Raises SpeechError when espeak-ng fails (an unknown voice)."""
    espeak_version()
    proc = subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "--stdout", text], capture_output=True)
    if proc.returncode != 0 or not proc.stdout:
        raise SpeechError(
            f"espeak-ng -v {voice}: expected a WAV on stdout, found exit {proc.returncode}: "
            f"{proc.stderr.decode(errors='replace').strip()[:200]}"
        )
    with wave.open(io.BytesIO(proc.stdout)) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768
        return resample(pcm, w.getframerate(), rate) if w.getframerate() != rate else pcm


def speech_span(x, floor: float = SPEECH_FLOOR) -> tuple[int, int]:
    """[first, last + 1) samples of ``x`` whose |amplitude| exceeds ``floor``; (0, 0) for none."""
    loud = np.flatnonzero(np.abs(x) > floor)
    return (int(loud[0]), int(loud[-1]) + 1) if loud.size else (0, 0)


def _noise(rng, n: int, kind: str, level: float):
    if kind == "silence":
        return np.zeros(n, np.float32)
    if kind == "white":
        return (level * rng.standard_normal(n)).astype(np.float32)
    walk = np.cumsum(rng.standard_normal(n))  # brown: integrated white noise, its drift removed
    walk -= np.linspace(walk[0], walk[-1], n)
    return (level * walk / max(np.abs(walk).max(), 1e-9)).astype(np.float32)


def clip(text: str, voice: str, index: int, seed: int, rate: int, noise: tuple[str, ...]) -> dict:
    """One sample: {"audio": float32 [n] at ``rate``, "span": (start, end) of the speech in
    samples, "text", "voice", "lead", "tail": what surrounds it ("silence", "white", "brown"
    at a drawn level)}. The lead and tail are 0.3-0.8 s each, their kinds drawn from ``noise``
    (``numpy.random.default_rng([seed, index])``)."""
    rng = np.random.default_rng([seed, index])
    speech = speak(text, voice, rate)
    a, b = speech_span(speech)
    parts, about = [], {}
    for where in ("lead", "tail"):
        kind = str(noise[int(rng.integers(len(noise)))])
        level = float(rng.uniform(0.005, 0.03)) if kind == "white" else float(rng.uniform(0.02, 0.08))
        parts.append(_noise(rng, int(rate * rng.uniform(0.3, 0.8)), kind, level))
        about[where] = kind if kind == "silence" else f"{kind} {level:.3f}"
    audio = np.concatenate([parts[0], speech, parts[1]])
    return {"audio": audio, "span": (parts[0].size + a, parts[0].size + b), "text": text, "voice": voice, **about}


def clips(lines: list[str], voices: list[str], seed: int, rate: int, noise: tuple[str, ...]) -> list[dict]:
    """One :func:`clip` per line, the voices taken in turn (line i: ``voices[i % len]``)."""
    return [clip(t, voices[i % len(voices)], i, seed, rate, noise) for i, t in enumerate(lines)]
