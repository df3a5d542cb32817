#!/usr/bin/env bash
# The GPU paths in one short script: QLoRA (4-bit NF4 base) and an `accelerate launch` run, a few steps
# each, on SmolLM2-135M-Instruct, printing tokens/s and peak GPU memory. Works with no network: it
# reads what `bench/gpu_check.sh --prepare` wrote into .gpu_check/ (pairs + converted weights).
#
#   bash bench/gpu_check.sh --prepare       # here, on the CPU machine: builds .gpu_check/ (~20 MB + model)
#   bash bench/gpu_check.sh                 # on the GPU machine (carry .gpu_check); prints the figures
#
# Record what it prints in bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
[[ -x .venv/bin/python ]] && PY=.venv/bin/python
WORK=.gpu_check
export USERSIM_CACHE=$PWD/$WORK/cache HF_HUB_OFFLINE=1 WANDB_MODE=offline

if [[ "${1:-}" == "--prepare" ]]; then
    RAW=${USERSIM_RAW:-../shared/data/raw}
    $PY -m data_prep.build --source amazon2018 --input "$RAW/amazon2018_5core_small" --out $WORK/data --overwrite
    $PY -m data_prep.split --data $WORK/data --out $WORK/tasks --min-history 2 --max-tasks 50 --seed 0 --overwrite
    $PY -m data_prep.pairs --data $WORK/data --tasks $WORK/tasks --out $WORK/pairs --k-user 3 --k-item 2 --max-tokens 512
    echo "prepared $WORK (carry it to the GPU machine)"
    exit 0
fi

$PY -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print("GPU:", torch.cuda.get_device_name(0))'
COMMON=(--config configs/sft/smollm2_cpu.yaml --pairs $WORK/pairs --use_cpu false --bf16 true --dtype bfloat16
        --max_length 512 --per_device_train_batch_size 16 --global_batch_size 16 --max_steps 30 --logging_steps 5
        --eval_strategy no --save_strategy no --report_to none)

echo "== QLoRA (4-bit NF4), one process"
$PY -m train.sft "${COMMON[@]}" --load_in_4bit true --output_dir $WORK/out_qlora
echo "== LoRA through accelerate launch (single_gpu.yaml)"
$PY -m accelerate.commands.launch --config_file configs/accelerate/single_gpu.yaml -m train.sft "${COMMON[@]}" \
    --output_dir $WORK/out_accelerate
for run in out_qlora out_accelerate; do
    $PY -c "import json,sys; c=json.load(open(sys.argv[1])); print(sys.argv[2], json.dumps(c['throughput']))" \
        $WORK/$run/training_card.json $run
done
