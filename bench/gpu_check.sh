#!/usr/bin/env bash
# The GPU paths in one short script, for a small offline GPU machine (one GPU, no internet, its own
# Python 3.12 with torch, transformers, accelerate and peft but no trl, bitsandbytes or datasets):
#
#   bash bench/gpu_check.sh --prepare   # here, with internet to PyPI: .whl/ (the missing wheels, with
#                                       # bitsandbytes cut to its CUDA 13.0 library) and .gpu_check/ (a tiny
#                                       # random Llama with SmolLM2's tokenizer, ~1,000 pairs); refuses if
#                                       # they and the working tree pass 48 MiB
#   bash bench/gpu_check.sh             # there (carry .whl and .gpu_check): installs the wheels with
#                                       # --no-index into .gpu_check/site, runs the checks (meant to take under 6 min)
#   bash bench/gpu_check.sh --cpu       # a smoke run here: the same checks on the CPU, skipping the
#                                       # CUDA-only ones (bf16, FSDP: accelerate enables FSDP only on GPUs)
#
# Checks, each a PASS/FAIL line with its figures (tokens/s and peak GPU memory from each run's card):
#   1. QLoRA: 4-bit NF4 base with nested quantisation, all-linear targets, activation checkpointing,
#      evaluation (with sample generations) and a checkpoint every 10 steps;
#   2. a resume: checkpoint-30 removed, the rerun continues from checkpoint-20 to step 30;
#   3. bf16 LoRA through `accelerate launch` with configs/accelerate/multi_gpu_ddp.yaml, one process;
#   4. the same with configs/accelerate/fsdp.yaml (FSDP2, full state dict) and activation checkpointing,
#      as the 7B recipes train, one process;
#   5. the DDP run's adapter reloaded through the hf agent backend: one batched generation and one
#      constrained to the agents' answer format (llguidance);
#   6. tests/test_gpu.py (pytest -m gpu) on the carried tiny model.
# Everything goes to .gpu_check/run/ (runs/gpu_check_cpu/ with --cpu): logs/ per run, results.jsonl and
# gpu_check.json ($OUT/ too when set). The command
# that runs it on the borrowed machine is in bench/README.md.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=gpu
case "${1:-}" in
    --prepare) MODE=prepare ;;
    --cpu) MODE=cpu ;;
    "") ;;
    *) echo "usage: bash bench/gpu_check.sh [--prepare | --cpu]" >&2; exit 2 ;;
esac
WORK=.gpu_check
WHEELS=.whl
LIMIT_MIB=48
CUDA_LIBRARY=cuda130  # the GPU machine's CUDA (13.0): the one bitsandbytes library it needs
# The wheels the GPU machine lacks (or has older): the versions pyproject.toml pins.
pin() { grep -oE "\"$1==[^\"]+\"" pyproject.toml | tr -d '"'; }

if [[ $MODE == prepare ]]; then
    set -e
    PY=.venv/bin/python
    RAW=${USERSIM_RAW:-../shared/data/raw}
    rm -rf "$WORK" "$WHEELS"
    mkdir -p "$WORK" "$WHEELS"
    # trl needs datasets (and it dill and multiprocess); pyarrow, pandas, xxhash and fsspec are there
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" \
        "$(pin trl)" "$(pin datasets)" "$(pin bitsandbytes)" "$(pin transformers)" "$(pin peft)" \
        dill==0.4.1 multiprocess==0.70.19
    # llguidance's wheel needs glibc 2.31 (the GPU machine's Ubuntu has more)
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_31_x86_64 -d "$WHEELS" "$(pin llguidance)"
    $PY -m bench.gpu_check slim "$WHEELS"/bitsandbytes-*.whl --keep "$CUDA_LIBRARY"
    $PY -m bench.gpu_check model "$WORK/model"
    $PY -m data_prep.build --source amazon2018 --input "$RAW/amazon2018_5core_small" --out "$WORK/data" --overwrite
    $PY -m data_prep.split --data "$WORK/data" --out "$WORK/tasks" --min-history 2 --max-tasks 50 --seed 0 --overwrite
    $PY -m data_prep.pairs --data "$WORK/data" --tasks "$WORK/tasks" --out "$WORK/pairs" --k-user 2 --k-item 1 \
        --max-tokens 256 --max-examples 1000 --tokenizer "$WORK/model"
    rm -rf "$WORK/data" "$WORK/tasks" "$WORK/pairs/dataset"  # train.sft reads the pairs' JSONL files
    # what travels: the carried folders plus the working tree (tracked and untracked-not-ignored files)
    carried=$(du -sb "$WORK" "$WHEELS" | awk '{s += $1} END {print s}')
    tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -b 2>/dev/null | awk '{s += $1} END {print s}')
    ls -l "$WHEELS"
    awk -v c="$carried" -v t="$tree" -v l="$LIMIT_MIB" 'BEGIN {
        printf "prepared: carried %.1f MiB + working tree %.1f MiB = %.1f MiB (limit %d MiB)\n",
               c / 2^20, t / 2^20, (c + t) / 2^20, l; exit !(c + t < l * 2^20) }' \
        || { echo "error: over $LIMIT_MIB MiB: carry less" >&2; exit 1; }
    exit 0
fi

[[ -d "$WORK/model" && -d "$WORK/pairs" ]] || { echo "error: run bash bench/gpu_check.sh --prepare first" >&2; exit 2; }
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
RUN=$WORK/run  # on the GPU machine; the CPU smoke run writes outside what is carried
[[ $MODE == cpu ]] && RUN=runs/gpu_check_cpu
if [[ $MODE == gpu ]]; then
    PY=${PY:-python3}
    START=$SECONDS
    $PY -m pip install -q --no-index --no-deps --target "$WORK/site" "$WHEELS"/*.whl \
        || { echo "FAIL  installing the carried wheels" >&2; exit 1; }
    export PYTHONPATH=$PWD/$WORK/site:$PWD
    echo "installed the carried wheels in $((SECONDS - START)) s"
    $PY -c 'import importlib.metadata as m, transformers, trl, peft, bitsandbytes, datasets, accelerate, torch, llguidance
print("versions:", ", ".join(f"{p} {m.version(p)}" for p in ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "datasets", "llguidance")))' \
        || { echo "FAIL  importing the training stack" >&2; exit 1; }
    $PY -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print("GPU:", torch.cuda.get_device_name(0))' || exit 1
    DEVICE=(--use_cpu false --bf16 true --dtype bfloat16 --per_device_train_batch_size 16 --global_batch_size 16
            --per_device_eval_batch_size 16 --max_eval_examples 64)
    BACKEND_DEVICE=cuda
    QLORA_MODEL=$WORK/model
else
    PY=.venv/bin/python
    # the logits over SmolLM2's 49k-token vocabulary dominate on a CPU: smaller batches
    DEVICE=(--use_cpu true --bf16 false --dtype float32 --per_device_train_batch_size 4 --global_batch_size 4
            --per_device_eval_batch_size 8 --max_eval_examples 16)
    BACKEND_DEVICE=cpu
    QLORA_MODEL=$RUN/model-cpu64  # bitsandbytes' CPU 4-bit kernel needs in_features a multiple of 64
    [[ -d $QLORA_MODEL ]] || $PY -m bench.gpu_check model "$QLORA_MODEL" --hidden 64
fi
rm -rf "$RUN/out" "$RUN/logs" "$RUN/results.jsonl"
mkdir -p "$RUN/out" "$RUN/logs"
COMMON=(--config configs/sft/smollm2_cpu.yaml --model_name_or_path "$WORK/model" --pairs "$WORK/pairs"
        "${DEVICE[@]}" --max_steps 30 --logging_steps 5 --eval_strategy steps --eval_steps 10
        --save_strategy steps --save_steps 10 --save_total_limit 2 --sample_generations 2 --report_to none)

STEP_TIMEOUT=${STEP_TIMEOUT:-150}  # seconds per run: a hang fails that check, the others still report
[[ $MODE == cpu ]] && STEP_TIMEOUT=${STEP_TIMEOUT_CPU:-400}
# results so far into $OUT after every step, so a command stopped from outside still returns them
save() { [[ -n "${OUT:-}" ]] && cp "$RUN/results.jsonl" "$OUT/" && cp -r "$RUN/logs" "$OUT/"; return 0; }

# run NAME STEPS [RESUMED_FROM] -- COMMAND...: runs it with its log and a time limit, checks the run folder
run() {
    local name=$1 steps=$2 resumed=$3; shift 4
    local log=$RUN/logs/$name.log
    echo "== $name"
    timeout --kill-after=15 "$STEP_TIMEOUT" "$@" > "$log" 2>&1
    local rc=$?
    (( rc == 124 || rc == 137 )) && echo "stopped after $STEP_TIMEOUT s (STEP_TIMEOUT)" >> "$log"
    tail -n 3 "$log"
    $PY -m bench.gpu_check check "$name" "$RUN/out/${name%-resumed}" --rc $rc --steps "$steps" --log "$log" \
        ${resumed:+--resumed-from "$resumed"} >> "$RUN/results.jsonl"
    save
}

QLORA=(--model_name_or_path "$QLORA_MODEL" --load_in_4bit true --use_bnb_nested_quant true --lora_target_modules all-linear --activation_checkpointing true)
run qlora 30 "" -- $PY -m train.sft "${COMMON[@]}" "${QLORA[@]}" --output_dir "$RUN/out/qlora"
rm -rf "$RUN/out/qlora/checkpoint-30"  # as if stopped after step 20's checkpoint
run qlora-resumed 30 "$RUN/out/qlora/checkpoint-20" -- \
    $PY -m train.sft "${COMMON[@]}" "${QLORA[@]}" --output_dir "$RUN/out/qlora"

LAUNCH=($PY -m accelerate.commands.launch --num_processes 1 --num_machines 1)
run lora-ddp 30 "" -- "${LAUNCH[@]}" --config_file configs/accelerate/multi_gpu_ddp.yaml \
    -m train.sft "${COMMON[@]}" --output_dir "$RUN/out/lora-ddp"
if [[ $MODE == gpu ]]; then
    run lora-fsdp 30 "" -- "${LAUNCH[@]}" --config_file configs/accelerate/fsdp.yaml \
        -m train.sft "${COMMON[@]}" --activation_checkpointing true --output_dir "$RUN/out/lora-fsdp"
else
    echo "== lora-fsdp: skipped on the CPU (accelerate enables FSDP only on GPUs; tests/test_fsdp.py covers FSDP2 on gloo)"
fi
echo "== hf backend"
timeout --kill-after=15 "$STEP_TIMEOUT" $PY -m bench.gpu_check backend "$WORK/model" "$RUN/out/lora-ddp" \
    --device $BACKEND_DEVICE >> "$RUN/results.jsonl"

if [[ $MODE == gpu ]]; then
    echo "== pytest -m gpu tests/test_gpu.py"
    USERSIM_TINY_MODEL=$PWD/$WORK/model timeout --kill-after=15 "$STEP_TIMEOUT" \
        $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py > "$RUN/logs/pytest.log" 2>&1
    rc=$?
    tail -n 3 "$RUN/logs/pytest.log"
    $PY -m bench.gpu_check pytest $rc "$RUN/logs/pytest.log" >> "$RUN/results.jsonl"
    save
fi
$PY -m bench.gpu_check report "$RUN/results.jsonl" "$RUN/gpu_check.json" --mode $MODE
status=$?
save
[[ -n "${OUT:-}" ]] && cp "$RUN/gpu_check.json" "$OUT/"
exit $status
