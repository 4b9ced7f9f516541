"""Chinese word segmentation with stanza's ``zh`` tokenizer, one output line per input line.

    python examples/nist_zh_en/segment_zh.py --input train.zh --output train.seg.zh [--stanza-dir DIR]

Raw Chinese has no spaces between words, so Moses tokenization leaves a sentence as a few long
"words" that neither BPE nor a dependency parser can use. This writes the words stanza's tokenizer
finds, separated by spaces; the recipe then Moses-tokenizes them (which splits off remaining
punctuation) and parses the result with ``posattn-parse --backend stanza --lang zh`` on exactly those
tokens. Sentence splitting is off (``tokenize_no_ssplit``): line N of the output is line N of the input,
and an empty input line stays empty (the recipe's cleaning drops such pairs). The output is written
atomically. Models are never downloaded here: see the error message for how to fetch them.
"""

import argparse
import logging
import sys
from typing import Iterable, Iterator, List, Optional

from tqdm import tqdm

from fairseq_posattn.cli import setup_logging
from fairseq_posattn.data.text_pipeline import count_lines, read_lines, write_lines

logger = logging.getLogger("segment_zh")


def build_segmenter(model_dir: Optional[str], use_gpu: Optional[bool]):
    """stanza ``Pipeline("zh", processors="tokenize", tokenize_no_ssplit=True)``; SystemExit with the
    download command when the models are not there."""
    import stanza
    from stanza.resources.common import DEFAULT_MODEL_DIR

    if use_gpu is None:
        import torch

        use_gpu = torch.cuda.is_available()
    model_dir = model_dir or DEFAULT_MODEL_DIR
    try:
        return stanza.Pipeline("zh", dir=model_dir, processors="tokenize", tokenize_no_ssplit=True,
                               download_method=None, use_gpu=use_gpu, logging_level="WARN")
    except FileNotFoundError as e:
        sys.exit(f"segment_zh: stanza has no 'zh' tokenizer under {model_dir} ({e}). On a machine with "
                 f"internet run\n    python -c \"import stanza; stanza.download('zh', model_dir={model_dir!r}, "
                 f"processors='tokenize,pos,lemma,depparse')\"\nand copy that directory here (--stanza-dir).")


def segment_lines(lines: Iterable[str], nlp, batch_size: int = 256) -> Iterator[str]:
    """Space-separated words of every line, in order; blank lines give empty lines."""
    from stanza.models.common.doc import Document

    batch: List[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) == batch_size:
            yield from _segment_batch(batch, nlp, Document)
            batch = []
    yield from _segment_batch(batch, nlp, Document)


def _segment_batch(batch: List[str], nlp, document_type) -> List[str]:
    texts = [line.strip() for line in batch]
    docs = nlp.bulk_process([document_type([], text=text) for text in texts if text])
    segmented = iter(" ".join(" ".join(token.text for sentence in doc.sentences for token in sentence.tokens).split())
                     for doc in docs)
    return [next(segmented) if text else "" for text in texts]


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="raw Chinese text, one sentence per line")
    parser.add_argument("--output", required=True, help="segmented text to write")
    parser.add_argument("--stanza-dir", default=None, help="stanza model directory (default: stanza's own)")
    parser.add_argument("--use-gpu", choices=["auto", "yes", "no"], default="auto",
                        help="run stanza on the GPU (default: %(default)s, i.e. when torch sees one)")
    parser.add_argument("--batch-size", type=int, default=256, help="lines per stanza call (default: %(default)s)")
    args = parser.parse_args(argv)
    setup_logging()
    nlp = build_segmenter(args.stanza_dir, {"auto": None, "yes": True, "no": False}[args.use_gpu])
    lines = tqdm(read_lines(args.input), total=count_lines(args.input), desc="segment", unit=" lines", disable=None)
    n = write_lines(args.output, segment_lines(lines, nlp, args.batch_size))
    logger.info("segmented %d lines: %s -> %s", n, args.input, args.output)


if __name__ == "__main__":
    main()
