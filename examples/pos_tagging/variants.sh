# Dufter et al.'s Table 2 models as san_tagger flags; sourced by run.sh and run_ud_treebanks.sh.
declare -A VARIANT_NAME=(
    [san]="SAN" [pe_add]="SAN+PE[add]" [pe_con]="SAN+PE[con]" [p]="SAN+P" [r]="SAN+R" [p_r]="SAN+P+R"
    [temp]="SAN+PE[add]+Temp" [conv]="SAN+PE[add]+Conv" [conv2d]="SAN+PE[add]+Conv2d"
    [p_r_zero]="SAN+P+R (zero init)" [conv_pt]="SAN+PE[add]+Conv (PyTorch init)"
    [conv2d_pt]="SAN+PE[add]+Conv2d (PyTorch init)"
)
declare -A VARIANT_FLAGS=(
    [san]="--position-embedding none"
    [pe_add]="--position-embedding add"
    [pe_con]="--position-embedding concat"
    [p]="--position-embedding none --encoder-direct-position absolute"
    [r]="--position-embedding none --encoder-direct-position relative"
    [p_r]="--position-embedding none --encoder-direct-position both"
    [temp]="--position-embedding add --encoder-learnable-temperature"
    [conv]="--position-embedding add --encoder-conv-attention 1d"
    [conv2d]="--position-embedding add --encoder-conv-attention 2d"
    # the same models from our earlier initialisations (the authors' code: glorot, our defaults)
    [p_r_zero]="--position-embedding none --encoder-direct-position both --encoder-direct-position-init zero"
    [conv_pt]="--position-embedding add --encoder-conv-attention 1d --encoder-conv-attention-init pytorch"
    [conv2d_pt]="--position-embedding add --encoder-conv-attention 2d --encoder-conv-attention-init pytorch"
)
