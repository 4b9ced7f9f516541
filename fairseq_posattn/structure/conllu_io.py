"""Reading and writing dependency trees in CoNLL-U (https://universaldependencies.org/format.html).

Only what structural positions need (docs/methods.md) is kept: per sentence the FORM of every
syntactic word, its HEAD and DEPREL, and the line where the sentence starts. As CoNLL-U defines,
multiword-token lines (IDs like ``3-4``) only group surface tokens, so they are skipped and the
syntactic words inside the range are used; empty nodes (IDs like ``5.1``) belong to the enhanced
graph and are skipped too. Comment lines (``#``) are allowed; a whitespace-only line ends a sentence
like an empty one. Anything malformed raises ``ValueError`` starting with ``file:line`` and saying
what to fix; so does a file that is not UTF-8, a carriage return inside a line, and a ``.gz`` file that
is truncated or not gzip-compressed. Files ending in ``.gz`` are read through gzip.
"""

import contextlib
import gzip
import re
import zlib
from typing import IO, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from fairseq_posattn.atomic_io import atomic_write, named_decode_errors
from fairseq_posattn.structure.tree import TreeError, tree_structure

N_COLUMNS = 10
COLUMNS = "ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC"
_WORD_ID = re.compile(r"[1-9][0-9]*")
_RANGE_ID = re.compile(r"[1-9][0-9]*-[1-9][0-9]*")
_EMPTY_NODE_ID = re.compile(r"[0-9]+\.[1-9][0-9]*")
_HEAD = re.compile(r"-?[0-9]+")


class ConlluSentence(NamedTuple):
    """One sentence: words (FORM), 1-based heads (0 = root), deprels, and its first line number."""

    words: List[str]
    heads: List[int]
    deprels: List[str]
    line: int


def read_conllu(path: str) -> Iterator[ConlluSentence]:
    """Yield the sentences of a CoNLL-U file in order, checking columns, IDs and trees."""
    for block in iter_blocks(path):
        sentence = _parse_block(path, block)
        if sentence is not None:
            yield sentence


def iter_blocks(path: str) -> Iterator[List[Tuple[int, str]]]:
    """Yield the blank-line separated blocks of a CoNLL-U file as ``(line number, line)`` lists."""
    with _reading(path) as lines:
        block: List[Tuple[int, str]] = []
        for number, line in enumerate(lines, start=1):
            line = _without_line_end(path, number, line)
            if line.strip():
                block.append((number, line))
            elif block:
                yield block
                block = []
        if block:
            yield block


def count_sentences(path: str) -> int:
    """Number of sentences (blocks with at least one token line) of a CoNLL-U file, without parsing them."""
    count, in_sentence = 0, False
    with _reading(path) as lines:
        for number, line in enumerate(lines, start=1):
            line = _without_line_end(path, number, line)
            if not line.strip():
                in_sentence = False
            elif not in_sentence and not line.startswith("#"):
                count, in_sentence = count + 1, True
    return count


@contextlib.contextmanager
def _reading(path: str) -> Iterator[IO[str]]:
    """The lines of ``path``, with undecodable bytes and a broken ``.gz`` file reported as ValueError."""
    with _named_gzip_errors(path), open_text(path) as lines, named_decode_errors(path, lambda: _open_binary(path)):
        yield lines


@contextlib.contextmanager
def _named_gzip_errors(path: str) -> Iterator[None]:
    """Within the block, gzip's bare ``EOFError`` (a truncated ``.gz`` file) and ``BadGzipFile`` (not gzip)
    become ValueError naming ``path``."""
    try:
        yield
    except EOFError:
        raise ValueError(f"{path}: the gzip file ends early (truncated, e.g. by an interrupted download or copy); "
                         f"`gzip -t {path}` confirms it: get or compress the file again") from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise ValueError(f"{path}: not a valid gzip file ({e}); a file ending in .gz must be gzip-compressed "
                         f"CoNLL-U: compress it with gzip, or drop the .gz from its name if it is plain text") from None


def _without_line_end(path: str, number: int, line: str) -> str:
    """``line`` without its ``\\n`` or ``\\r\\n``; a carriage return inside it is an error naming ``path:number``."""
    line = line.rstrip("\n")
    line = line[:-1] if line.endswith("\r") else line
    if "\r" in line:
        column = line.index("\r") + 1
        raise ValueError(f"{path}:{number}: carriage return (\\r) inside the line, at column {column}: it would "
                         f"break the line there; replace it by a space, e.g. `sed -i 's/\\r$//; s/\\r/ /g' {path}`")
    return line


def split_columns(path: str, number: int, line: str) -> List[str]:
    """The ten columns of a token line; raises ValueError naming ``path:number`` otherwise."""
    cols = line.split("\t")
    if len(cols) != N_COLUMNS:
        raise ValueError(f"{path}:{number}: expected {N_COLUMNS} tab-separated columns ({COLUMNS}), "
                         f"found {len(cols)}; CoNLL-U separates columns by single tabs, not spaces")
    return cols


def is_word_line(path: str, number: int, word_id: str, expected: int) -> bool:
    """False for multiword-token (``3-4``) and empty-node (``5.1``) lines, True for the next syntactic
    word; raises ValueError naming ``path:number`` for a malformed or out-of-sequence ID."""
    if _RANGE_ID.fullmatch(word_id) or _EMPTY_NODE_ID.fullmatch(word_id):
        return False
    _check_word_id(path, number, word_id, expected)
    return True


def write_conllu(path: str, sentences: Iterable[Sequence], first_id: int = 1,
                 header: Sequence[str] = ()) -> int:
    """Atomically write ``(words, heads, deprels)`` sentences as CoNLL-U; return how many.

    Each sentence gets ``# sent_id = first_id + k`` and ``# text`` (the words joined by spaces);
    LEMMA, UPOS, XPOS, FEATS, DEPS and MISC are ``_``. ``header`` lines are written first as
    comments. Trees are checked before they are written; the file appears only when complete.
    """
    count = 0
    with atomic_write(path) as out:
        for text in header:
            out.write(f"# {text}\n")
        for count, sentence in enumerate(sentences, start=1):
            words, heads, deprels = sentence[0], sentence[1], sentence[2]
            out.write(format_sentence(words, heads, deprels, first_id + count - 1))
    return count


def format_sentence(words: Sequence[str], heads: Sequence[int], deprels: Sequence[str], sent_id: int) -> str:
    """One sentence as a CoNLL-U block (ending with its blank line); raises ValueError if invalid."""
    if not len(words) == len(heads) == len(deprels):
        raise ValueError(f"sentence {sent_id}: {len(words)} words, {len(heads)} heads, {len(deprels)} deprels")
    if not words:
        raise ValueError(f"sentence {sent_id}: no words (CoNLL-U has no empty sentences)")
    try:
        tree_structure(heads)
    except TreeError as e:
        raise ValueError(f"sentence {sent_id}: {e}") from None
    for field in (*words, *deprels):
        if not field or any(c in field for c in "\t\n\r"):
            raise ValueError(f"sentence {sent_id}: {field!r} cannot be a CoNLL-U field (empty, or holds a "
                             f"tab or line break)")
    lines = [f"# sent_id = {sent_id}", f"# text = {' '.join(words)}"]
    lines += [f"{k}\t{w}\t_\t_\t_\t_\t{h}\t{d}\t_\t_"
              for k, (w, h, d) in enumerate(zip(words, heads, deprels), start=1)]
    return "\n".join(lines) + "\n\n"


def open_text(path: str) -> IO[str]:
    """``path`` (gzip-compressed if it ends in ``.gz``) as UTF-8 text, lines split at ``\\n`` only; a byte order
    mark at the start is dropped."""
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="\n")
    return open(path, encoding="utf-8-sig", newline="\n")


def _open_binary(path: str) -> IO[bytes]:
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _parse_block(path: str, block: List[Tuple[int, str]]) -> Optional[ConlluSentence]:
    """The sentence of one blank-line separated block (None for a block of comments only)."""
    words: List[str] = []
    heads: List[int] = []
    deprels: List[str] = []
    word_lines: List[int] = []
    for number, line in block:
        if line.startswith("#"):
            continue
        cols = split_columns(path, number, line)
        if not is_word_line(path, number, cols[0], len(words) + 1):
            continue  # multiword token or empty node: not a word of the basic tree
        if not _HEAD.fullmatch(cols[6]):
            raise ValueError(f"{path}:{number}: HEAD (column 7) of word {cols[0]} {cols[1]!r} is {cols[6]!r}, "
                             f"not an integer; structural positions need a basic dependency tree "
                             f"(HEAD 0 for the root, else the ID of the head word)")
        words.append(cols[1])
        heads.append(int(cols[6]))
        deprels.append(cols[7])
        word_lines.append(number)
    if not words:
        if any(not line.startswith("#") for _, line in block):
            raise ValueError(f"{path}:{block[0][0]}: sentence without syntactic words (only multiword-token "
                             f"or empty-node lines)")
        return None  # comments only
    _check_tree(path, heads, word_lines, block[0][0])
    return ConlluSentence(words, heads, deprels, block[0][0])


def _check_word_id(path: str, number: int, word_id: str, expected: int) -> None:
    if not _WORD_ID.fullmatch(word_id):
        raise ValueError(f"{path}:{number}: ID {word_id!r} is not a word ID (1, 2, ...), a multiword-token "
                         f"range (3-4) or an empty node (5.1)")
    if int(word_id) != expected:
        raise ValueError(f"{path}:{number}: word ID {word_id} out of sequence, expected {expected}: the IDs of "
                         f"a sentence count 1, 2, 3, ... and a blank line must end every sentence")


def _check_tree(path: str, heads: List[int], word_lines: List[int], start: int) -> None:
    try:
        tree_structure(heads)
    except TreeError as e:
        number = word_lines[e.word - 1] if e.word else start
        raise ValueError(f"{path}:{number}: {e}; fix the HEAD column (7) in the sentence that starts at "
                         f"line {start}") from None
