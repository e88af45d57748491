#!/usr/bin/env bash
# lm-evaluation-harness against `mla-export serve`, end to end, offline: a loglikelihood task
# (multiple choice: echo + logprobs requests) and a generate_until task over local files
# (tasks/), then every logged loglikelihood checked against the engine's own prompt logprobs.
#
#   tools/lm_eval/run_smoke.sh EXPORT_DIR [LM_EVAL_VENV]
#
# LM_EVAL_VENV (default .venv-lmeval) gets lm-eval 0.4.13 + transformers + the CPU torch wheel on
# first use; it is kept apart from the package's venv (lm-eval is not a dependency). The server
# runs f32 so the check compares like with like; random-weight exports score by chance.
set -euo pipefail
cd "$(dirname "$0")/../.."
export_dir=${1:?usage: tools/lm_eval/run_smoke.sh EXPORT_DIR [LM_EVAL_VENV]}
venv=${2:-.venv-lmeval}
port=${PORT:-8011}
if [ ! -x "$venv/bin/lm_eval" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.13.0
  "$venv/bin/pip" install -q "lm-eval[api]==0.4.13" "transformers>=5.0,<6"
fi
name=$(basename "$export_dir")
mla-export serve "$export_dir" --port "$port" --dtype float32 --served-model-name "$name" > /tmp/mla_lm_eval_serve.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
out=$(mktemp -d)
HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 "$venv/bin/lm_eval" --model local-completions \
  --model_args "model=$name,base_url=http://127.0.0.1:$port/v1/completions,tokenizer=$export_dir,tokenized_requests=True,num_concurrent=2,max_retries=1" \
  --batch_size 4 --tasks mla_smoke_mc,mla_smoke_gen --include_path tools/lm_eval/tasks --log_samples --output_path "$out"
python tools/lm_eval/check_loglikelihoods.py --export "$export_dir" --samples "$out"/*/samples_mla_smoke_mc_*.jsonl
