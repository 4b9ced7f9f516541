"""Checks that a tokenized text is something the chosen parser can parse, before ``posattn-parse`` parses it.

Two mistakes give a CoNLL-U file, and exit status 0, whose trees carry nothing:

- **Text in a language the parser is not for**: spaCy's English pipeline (the default) parses Chinese as if it
  were English. The language a parser is for is the spaCy pipeline's ``lang`` (read from its ``meta.json``,
  without loading it) or stanza's ``--lang``; the text's script is read from the Unicode names of its letters
  (``LATIN``, ``CJK``, ``CYRILLIC``...). When most letters of the first :data:`SAMPLE_LINES` lines are in
  scripts that the parser's language is not written in (:data:`LANGUAGE_SCRIPTS`), the text is refused.
  Languages not in that table are not checked.
- **Text that is not tokenized**: the parse words are a line's space-separated tokens, so a text whose every
  line is one token (Chinese or Japanese without spaces between words) gives one one-word tree per sentence.
"""

import collections
import os
import unicodedata
from typing import Counter, Iterable, Optional, Tuple

from fairseq_posattn.atomic_io import read_lines
from fairseq_posattn.structure.parsers import check_stanza_language, import_parser_library

#: lines whose letters tell the script of the text
SAMPLE_LINES = 1000
_LATIN = ("LATIN",)
#: the scripts (first word of a letter's Unicode name) each language is written in, by ISO 639-1 code
LANGUAGE_SCRIPTS = {
    **dict.fromkeys(("af", "ca", "cs", "cy", "da", "de", "en", "es", "et", "eu", "fi", "fr", "ga", "gl", "hr",
                     "hu", "id", "is", "it", "la", "lt", "lv", "nb", "nl", "nn", "no", "pl", "pt", "ro", "sk", "sl",
                     "sq", "sv", "tl", "tr", "vi"), _LATIN),
    **dict.fromkeys(("be", "bg", "kk", "mk", "ru", "uk"), ("CYRILLIC",)),
    **dict.fromkeys(("ar", "fa", "ur"), ("ARABIC",)),
    **dict.fromkeys(("hi", "mr", "ne"), ("DEVANAGARI",)),
    "sr": ("CYRILLIC", "LATIN"), "el": ("GREEK",), "he": ("HEBREW",), "th": ("THAI",),
    "zh": ("CJK",), "ja": ("CJK", "HIRAGANA", "KATAKANA"), "ko": ("HANGUL", "CJK"),
}
KNOWN_SCRIPTS = frozenset(script for scripts in LANGUAGE_SCRIPTS.values() for script in scripts)


def check_parser_input(path: str, n_lines: int, backend: str, model: str, lang: str) -> None:
    """Raise ValueError when the text at ``path`` (``n_lines`` lines) is not tokenized, or is written in a script
    that the language of the parser (``backend`` spacy: pipeline ``model``; stanza: ``lang``) is not."""
    language, parser = parser_language(backend, model, lang)
    if language is not None:
        check_script(path, language, parser)
    check_tokenized(path, n_lines)


def parser_language(backend: str, model: str, lang: str) -> Tuple[Optional[str], str]:
    """The ISO 639-1 code of the language the parser is for (None where it cannot be told, e.g. a spaCy pipeline
    that is not installed, whose loading then says how to install it), and how to name the parser."""
    if backend == "stanza":
        import_parser_library("stanza")  # or say how to install it
        check_stanza_language(lang)
        from stanza.models.common.constant import lang_to_langcode

        return _base_language(lang_to_langcode(lang)), f"stanza --lang {lang}"
    util = import_parser_library("spacy").util
    if util.is_package(model):
        meta = util.get_model_meta(util.get_package_path(model))
    elif os.path.isdir(model):
        meta = util.get_model_meta(model)
    else:
        return None, model
    return _base_language(meta.get("lang", "")), f"the spaCy pipeline {model}"


def _base_language(code: str) -> str:
    """``zh-hans`` -> ``zh``."""
    return code.replace("_", "-").split("-")[0].lower()


def check_script(path: str, language: str, parser: str) -> None:
    """Raise ValueError when most letters of the first :data:`SAMPLE_LINES` lines of ``path`` are in scripts
    that ``language`` is not written in (a language not in :data:`LANGUAGE_SCRIPTS` is not checked)."""
    scripts = LANGUAGE_SCRIPTS.get(language)
    if scripts is None:
        return
    lines = list(read_lines(path, SAMPLE_LINES))
    letters = script_counts(lines)
    foreign = {script: n for script, n in letters.items() if script not in scripts}
    if sum(foreign.values()) * 2 <= sum(letters.values()):
        return
    main = max(foreign, key=foreign.get)
    number = next(k for k, line in enumerate(lines, start=1) if main in script_counts([line]))
    share = 100 * sum(foreign.values()) / sum(letters.values())
    raise ValueError(
        f"{path}:{number}: the text is written in {_script_name(main)} script ({share:.0f}% of the letters of its "
        f"first {len(lines)} lines are not {' or '.join(map(_script_name, scripts))}), but {parser} parses "
        f"'{language}', written in {' or '.join(map(_script_name, scripts))}: its parses of this text would be "
        f"meaningless. Parse with a model of the text's language: --backend stanza --lang CODE (e.g. zh), or "
        f"--backend spacy --model PIPELINE (e.g. zh_core_web_sm)")


def script_counts(lines: Iterable[str]) -> Counter[str]:
    """How many letters of ``lines`` are in each script of :data:`KNOWN_SCRIPTS`."""
    found: Counter[str] = collections.Counter()
    for line in lines:
        for char in line:
            if char.isalpha():
                script = unicodedata.name(char, "").split(" ")[0]
                if script in KNOWN_SCRIPTS:
                    found[script] += 1
    return found


def _script_name(script: str) -> str:
    return "Chinese (CJK)" if script == "CJK" else script.capitalize()


def check_tokenized(path: str, n_lines: int) -> None:
    """Raise ValueError when every one of the (more than one) lines of ``path`` is a single token."""
    if n_lines < 2 or any(len(line.split()) > 1 for line in read_lines(path)):
        return
    first, = read_lines(path, 1)
    raise ValueError(
        f"{path}: every one of its {n_lines} lines is a single token (line 1: \"{first.strip()[:40]}\"): the text is "
        f"not tokenized. posattn-parse parses the space-separated tokens of each line, so every sentence would be a "
        f"one-word tree. Give it tokenized text, tokens separated by spaces (posattn-prepare-translation's "
        f"{{split}}.tok.{{lang}} files); segment Chinese or Japanese into words first (e.g. "
        f"examples/nist_zh_en/segment_zh.py)")
