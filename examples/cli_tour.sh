#!/usr/bin/env bash
# The CLI tour of README.md, run as written (usage: cli_tour.sh [path/to/tern]).
set -euo pipefail
TERN=${1:-./build/tern}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$TERN" info
"$TERN" info --arch trn2 --json >/dev/null
"$TERN" info --list
"$TERN" info --system trn3-ultraserver-gen2 >/dev/null
"$TERN" num formats >/dev/null
"$TERN" num decode e4m3 0x7e
"$TERN" num encode e4m3 300.5
"$TERN" num encode e4m3 465 --sat
"$TERN" num encode bf16 1.001 --round sr --seed 1
"$TERN" num mx --format mxfp8-e4m3 --policy rceil 485 1 2 3 >/dev/null
"$TERN" bench matmul | tail -3
"$TERN" bench matmul --m 512 --n 512 --k 512 --trace "$work/mm.json" | tail -2
"$TERN" bench matmul --m 512 --n 512 --k 512 --save "$work/mm.tern" >/dev/null
"$TERN" run "$work/mm.tern" | head -2
"$TERN" bench matmul --m 512 --n 512 --k 512 --epilogue bias,gelu --compare-unfused | tail -1
"$TERN" bench kernel rmsnorm --rows 8192 --dim 4096 --cores 8 | head -3
"$TERN" bench kernel adamw --rows 256 --dim 4096 --cores 2 | tail -1
"$TERN" compile --model gpt2 --train | head -1
"$TERN" compile "$(dirname "$0")/graphs/mlp.tgraph" --train --report --emit "$work/mlp_train.tgraph" | tail -3
here=$(cd "$(dirname "$0")" && pwd)
data=$(cd "$here/../data" && pwd)
"$TERN" train --text "$data/tinyshakespeare.txt" --steps 3 --layers 1 --batch 4 --seq 64 --eval-batches 1 | tail -2
"$TERN" train --config "$here/train/llama.toml" --text "$data/tinyshakespeare.txt" --steps 3 \
  --ckpt-dir "$work/ck" --eval-batches 1 --plot "$work/loss.png" | tail -2
"$TERN" sample --ckpt "$work/ck" --prompt "ROMEO:" --tokens 20
"$TERN" train --config "$here/train/data-parallel.toml" --text "$data/tinyshakespeare.txt" --steps 2 \
  --ckpt-dir "$work/dp" --eval-batches 1 --trace "$work/dp.json" | tail -2
echo "cli tour: ok"
"$TERN" plan --model llama3-70b --tp 8 --pp 2 | tail -3
"$TERN" plan search --model llama3-70b --system trn3-ultraserver-gen1 --chips 1024 | head -5
"$TERN" plan compare --model llama3-70b --systems trn3-ultraserver-gen2,gb300-nvl72,p5
"$TERN" plan validate | tail -1
"$TERN" plan collective --system dgx-a100 --chips 32 --ranks 4 --stride 8 | tail -3
"$TERN" plan --config "$here/plan/llama3-70b-trn3.toml" | tail -2
