#!/usr/bin/env bash
# Checks README's "Install into your own environment" the way a user with their own torch and fairseq
# would do it: a fresh virtualenv gets torch and fairseq first (the user's), then `pip install` of
# this package (a clean copy of the working tree); pip must keep that torch and fairseq, and the
# installed plugin must train, translate and parse from outside the repository.
#
#     bash scripts/check_install.sh [WORKDIR]      (make check-install; about 5 minutes on 2 cores)
#
# FAIRSEQ_WHEELS=DIR: a folder that holds fairseq-fixed's wheel for this Python as scripts/fairseq_wheel.sh builds
# it (make install leaves it in .venv/wheels), installed instead of building it again (tests/test_check_install.py).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd -P)"
ENV="$WORK/env"
PYTHON="${PYTHON:-python3}"
step() { echo "==> [$SECONDS s] $*"; }

step "1/6 a fresh virtualenv with the user's own torch and fairseq ($ENV)"
rm -rf "$ENV"
"$PYTHON" -m venv "$ENV"
# --no-compile: no bytecode for every installed file (torch's alone take 20 s); Python compiles what it imports
INSTALL=("$ENV/bin/python" -m pip --disable-pip-version-check -q install --no-compile)
"${INSTALL[@]}" -r "$REPO/requirements/build.txt"
# fairseq built as `make install` builds it (how the user's fairseq was built is not what this checks)
TAG="$("$ENV/bin/python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
WHEEL="$(ls "${FAIRSEQ_WHEELS:-/nonexistent}"/fairseq_fixed-*-"$TAG"-*.whl 2> /dev/null | head -n 1 || true)"
if [[ -z "$WHEEL" ]]; then
    bash "$REPO/scripts/fairseq_wheel.sh" "$ENV/bin/python" "$WORK/fairseq-wheel"
    WHEEL="$(ls "$WORK"/fairseq-wheel/fairseq_fixed-*.whl)"
fi
"${INSTALL[@]}" --no-deps "$WHEEL"
"${INSTALL[@]}" hydra-core==1.3.2 omegaconf==2.3.0 bitarray regex cffi scikit-learn packaging \
    sacrebleu tqdm
"$ENV/bin/python" -m pip list --format=freeze | sort > "$WORK/before.txt"  # name==version, a wheel file's too

step "2/6 pip install of a clean copy of the working tree, with the [parse] extra"
rm -rf "$WORK/src"
mkdir -p "$WORK/src"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$WORK/src")
"${INSTALL[@]}" "$WORK/src[parse]"
"$ENV/bin/python" -m pip list --format=freeze | sort > "$WORK/after.txt"

step "3/6 torch and fairseq are the user's, untouched; no torchaudio"
for package in torch fairseq-fixed numpy; do
    grep -i "^$package==" "$WORK/before.txt" > "$WORK/pin.txt"
    grep -qixF -f "$WORK/pin.txt" "$WORK/after.txt" || {
        echo "pip changed $package: $(cat "$WORK/pin.txt") -> $(grep -i "^$package==" "$WORK/after.txt")" >&2
        exit 1
    }
done
if grep -qi "^torchaudio==" "$WORK/after.txt"; then echo "torchaudio was installed" >&2; exit 1; fi
# fairseq's own metadata asks for torchaudio, which its text path never imports: the one complaint allowed.
if "$ENV/bin/python" -m pip check | grep -v "^fairseq-fixed .* requires torchaudio, which is not installed"; then
    echo "pip check found broken requirements (above)" >&2
    exit 1
fi

step "4/6 outside the repository: the plugin imports, its configs ship, its commands run"
cd "$WORK"
USER_DIR="$("$ENV/bin/python" -c 'import fairseq_posattn, os; print(os.path.dirname(os.path.realpath(fairseq_posattn.__file__)))')"
# the package must come from the fresh environment's site-packages (the work folder may lie inside the
# checkout: `make check-install` puts it there, in check-install-output/, which git ignores)
case "$USER_DIR" in
    "$ENV"/*) ;;
    *) echo "imported $USER_DIR, not the package installed into $ENV" >&2; exit 1 ;;
esac
ls "$USER_DIR"/configs/*/*.yaml > /dev/null
export PATH="$ENV/bin:$PATH"
RAW="$REPO/data/multi30k_sample"
mkdir -p raw
# 200 training sentences, 50 to validate and translate (an untrained model's beam search runs to its length limit)
for split in train valid test; do
    lines=$([[ $split == train ]] && echo 200 || echo 50)
    for lang in en de; do head -n "$lines" "$RAW/$split.$lang" > "raw/$split.$lang"; done
done
posattn-prepare-translation --raw-dir raw --out-dir prepared --source-lang en --target-lang de \
    --bpe-merges 300 --splits train valid test
fairseq-preprocess --source-lang en --target-lang de --trainpref prepared/train.bpe \
    --validpref prepared/valid.bpe --testpref prepared/test.bpe --destdir data-bin --joined-dictionary \
    > preprocess.log
for split in train valid test; do
    posattn-parse --backend spacy --input "prepared/$split.tok.en" --output "prepared/$split.conllu" 2> parse.log
    posattn-prepare-structure --conllu "prepared/$split.conllu" --bpe "prepared/$split.bpe.en" \
        --destdir data-bin --split "$split" --source-lang en --target-lang de > structure.log 2>&1
done

step "5/6 fairseq-train / fairseq-generate with --user-dir pointing into site-packages"
fairseq-train data-bin --user-dir "$USER_DIR" --task translation_structural --arch transformer_posattn \
    --encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 \
    --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 --decoder-attention-heads 2 \
    --encoder-structural-positions both --encoder-direct-position both --share-all-embeddings \
    --optimizer adam --lr 1e-3 --max-tokens 1024 --max-update 20 --cpu --save-dir ckpt \
    --no-epoch-checkpoints > train.log 2>&1 || { tail -n 30 train.log >&2; exit 1; }
fairseq-generate data-bin --user-dir "$USER_DIR" --task translation_structural --path ckpt/checkpoint_last.pt \
    --gen-subset test --beam 2 --max-len-a 1.5 --max-len-b 10 --remove-bpe --required-batch-size-multiple 1 --cpu \
    > generate.txt 2> generate.log
posattn-score generate.txt --ref raw/test.de --target-lang de

step "6/6 the test extra's tools"
"${INSTALL[@]}" "$WORK/src[test]"
"$ENV/bin/python" -m pytest --version
echo "install check passed in $WORK"
