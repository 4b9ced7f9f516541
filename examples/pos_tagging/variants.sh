# Dufter et al.'s Table 2 models as san_tagger flags; sourced by run.sh and run_ud_treebanks.sh.
declare -A VARIANT_NAME=(
    [san]="SAN" [pe_add]="SAN+PE[add]" [pe_con]="SAN+PE[con]" [p]="SAN+P" [r]="SAN+R" [p_r]="SAN+P+R"
    [temp]="SAN+PE[add]+Temp" [conv]="SAN+PE[add]+Conv" [conv2d]="SAN+PE[add]+Conv2d"
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
)
