"""The embedded toy task: English dates to German or Chinese dates, generated offline, with word alignments.

English dates come in three word orders, some with a 12-hour time. German targets have one word order
and a 24-hour time; Chinese targets have the year-month-day order, ``上午``/``下午`` before a 12-hour time,
and no spaces. Translating needs attention, not copying: month and day swap places (and in Chinese the year
moves to the front), "pm" changes the hour two words before it (German) or becomes a word before the time
(Chinese), and names map to other names. Each pair comes with its true word alignment in Pharaoh format
(``i-j`` sure, ``i?j`` possible); a Chinese target's words are the space-separated tokens of its
pre-segmented form (``2019年 3月 14日``), which ``unsegmented`` joins into what the model reads.

The same seed gives the same English sentences, the same splits and the same German pairs whichever target
language is asked for: every random draw is made before the target is written.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from ..errors import ConfigError, DataError
from ..runfiles import atomic_write_bytes

WEEKDAYS = [("monday", "montag"), ("tuesday", "dienstag"), ("wednesday", "mittwoch"),
            ("thursday", "donnerstag"), ("friday", "freitag"), ("saturday", "samstag"), ("sunday", "sonntag")]
MONTHS = [("january", "januar"), ("february", "februar"), ("march", "märz"), ("april", "april"),
          ("may", "mai"), ("june", "juni"), ("july", "juli"), ("august", "august"),
          ("september", "september"), ("october", "oktober"), ("november", "november"),
          ("december", "dezember")]
WEEKDAYS_ZH = {"monday": "星期一", "tuesday": "星期二", "wednesday": "星期三", "thursday": "星期四",
               "friday": "星期五", "saturday": "星期六", "sunday": "星期日"}
LANGUAGES = ("de", "zh")


def _ordinal(day: int) -> str:
    suffix = "th" if 11 <= day % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def toy_pair(rng: random.Random, lang: str = "de") -> tuple[str, str, str]:
    """One (English, target, alignment) triple; alignment is Pharaoh ``src-tgt`` (sure) / ``src?tgt``
    (possible); a Chinese target is pre-segmented (``unsegmented`` joins it)."""
    weekday_en, weekday_de = rng.choice(WEEKDAYS)
    month_en, month_de = rng.choice(MONTHS)
    day, year = rng.randint(1, 28), rng.randint(1900, 2099)
    order = rng.choice(["us", "british", "short"])
    if order == "us":  # tuesday , march 14th , 2019
        src = [weekday_en, ",", month_en, _ordinal(day), ",", str(year)]
    elif order == "british":  # tuesday the 14th of march 2019
        src = [weekday_en, "the", _ordinal(day), "of", month_en, str(year)]
    else:  # march 14th 2019
        src = [month_en, _ordinal(day), str(year)]
    time = None
    if rng.random() < 0.5:
        time = rng.randint(1, 12), rng.randint(0, 59), rng.choice(["am", "pm"])
        src += ["at", f"{time[0]}:{time[1]:02d}", time[2]]
    month = [m for m, _ in MONTHS].index(month_en) + 1
    write = _chinese if lang == "zh" else _german
    tgt, links = write(order, weekday_en, weekday_de, month_de, month, day, year, time)
    alignment = " ".join(f"{i}{mark}{j}" for i, j, mark in sorted(links))
    return " ".join(src), " ".join(tgt), alignment


def _german(order, weekday_en, weekday_de, month_de, month, day, year, time):
    """[weekday ,] day. month year [um H:MM uhr], and its links to the English words."""
    tgt = ([weekday_de, ","] if order != "short" else []) + [f"{day}.", month_de, str(year)]
    t_day = 2 if order != "short" else 0
    if order == "us":
        links = [(0, 0, "-"), (1, 1, "-"), (3, t_day, "-"), (2, t_day + 1, "-"), (5, t_day + 2, "-"),
                 (4, t_day + 2, "?")]
    elif order == "british":
        links = [(0, 0, "-"), (2, t_day, "-"), (4, t_day + 1, "-"), (5, t_day + 2, "-"), (1, t_day, "?"),
                 (3, t_day + 1, "?")]
    else:
        links = [(1, 0, "-"), (0, 1, "-"), (2, 2, "-")]
    if time is not None:
        hour, minute, half = time
        hour24 = (hour % 12) + (12 if half == "pm" else 0)
        s, t = (6 if order != "short" else 3), len(tgt)
        tgt += ["um", f"{hour24}:{minute:02d}", "uhr"]
        links += [(s, t, "-"), (s + 1, t + 1, "-"), (s + 2, t + 1, "?"), (s + 2, t + 2, "?")]
    return tgt, links


def _chinese(order, weekday_en, weekday_de, month_de, month, day, year, time):
    """year年 month月 day日 [， 星期X] [上午|下午 H:MM] (pre-segmented), and its links to the English
    words."""
    tgt = [f"{year}年", f"{month}月", f"{day}日"]
    if order == "us":  # weekday , month day , year
        links = [(5, 0, "-"), (2, 1, "-"), (3, 2, "-"), (0, 4, "-"), (1, 3, "?"), (4, 0, "?")]
    elif order == "british":  # weekday the day of month year
        links = [(5, 0, "-"), (4, 1, "-"), (2, 2, "-"), (0, 4, "-"), (1, 2, "?"), (3, 1, "?")]
    else:  # month day year
        links = [(2, 0, "-"), (0, 1, "-"), (1, 2, "-")]
    if order != "short":
        tgt += ["，", WEEKDAYS_ZH[weekday_en]]
    if time is not None:
        hour, minute, half = time
        s, t = (6 if order != "short" else 3), len(tgt)
        tgt += ["上午" if half == "am" else "下午", f"{hour}:{minute:02d}"]
        links += [(s + 2, t, "-"), (s + 1, t + 1, "-"), (s, t, "?"), (s, t + 1, "?")]
    return tgt, links


def unsegmented(tgt: str, lang: str) -> str:
    """A toy target as the model reads it: Chinese without the spaces of its pre-segmented form."""
    return tgt.replace(" ", "") if lang == "zh" else tgt


def toy_split_of(src: str) -> str:
    """Which split a toy source sentence belongs to: a hash, so the splits never share a sentence."""
    bucket = hashlib.sha1(src.encode("utf-8")).digest()[0] % 10
    return "dev" if bucket == 0 else "test" if bucket == 1 else "train"


def toy_pairs(split: str, size: int, seed: int = 1, lang: str = "de") -> list[tuple[str, str, str]]:
    """``size`` distinct toy pairs of one split, the same for the same (split, size, seed, lang)."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[tuple[str, str, str]] = []
    for _ in range(size * 200):
        src, tgt, alignment = toy_pair(rng, lang)
        if src in seen or toy_split_of(src) != split:
            continue
        seen.add(src)
        out.append((src, tgt, alignment))
        if len(out) == size:
            return out
    raise DataError(f"toy {split}: could not draw {size} distinct pairs")


def write_toy(out_dir: Path, sizes: dict[str, int], seed: int = 1, lang: str = "de") -> list[Path]:
    """Write ``<split>.en``, ``<split>.<lang>`` and ``<split>.align`` for each split (for Chinese also
    ``<split>.seg.zh``, the pre-segmented targets the alignments count words in), each atomically; returns
    the files. A file of one of those names that holds anything else (a user's own ``train.en``) is never
    replaced: a ConfigError names it before anything is written. One that holds just what would be
    written (the same command again) is left as it is."""
    contents: dict[Path, bytes] = {}
    for split, size in sizes.items():
        triples = toy_pairs(split, size, seed, lang)
        columns = {"en": [t[0] for t in triples], lang: [unsegmented(t[1], lang) for t in triples],
                   "align": [t[2] for t in triples]}
        if lang == "zh":
            columns["seg.zh"] = [t[1] for t in triples]
        for suffix, lines in columns.items():
            contents[out_dir / f"{split}.{suffix}"] = "".join(line + "\n" for line in lines).encode("utf-8")
    taken = [path.name for path, data in contents.items() if path.exists() and not _holds(path, data)]
    if taken:
        raise ConfigError(f"{out_dir}: {', '.join(taken[:3])}{', ...' if len(taken) > 3 else ''} already "
                          "exist with other contents; toy-data replaces no file (give a new or empty folder)")
    for path, data in contents.items():
        if not path.exists():
            atomic_write_bytes(path, data)
    return list(contents)


def _holds(path: Path, data: bytes) -> bool:
    """``path`` is a regular file whose bytes are ``data`` (read only when the sizes agree)."""
    try:
        return path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False
