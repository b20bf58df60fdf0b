"""Hidden-state dumps from training pipelines, read (and, for tests and the demo, written) where they lie.

Each reader yields (ids [L] int64, mask [L] bool, aux [L, n_aux*H]) per sequence: mask[p] is True where token p is
scored (the answer), aux the target's inputs of the drafter's aux layers, sorted, concatenated (vLLM's convention:
aux id k is the input of layer k). Formats, as their projects write them:

- SpecForge, scripts/prepare_hidden_states.py: `rows_<a>-<b>/data_<i>.ckpt` (`.ckpt.gz` with --compress), each a
  torch.save dict {input_ids [L], loss_mask [L], aux_hidden_state [1, L, n_aux*H], hidden_state [1, L, H]}.
- speculators, scripts/data_generation_offline.py: `hs_<i>.safetensors` {token_ids [L], hidden_states
  [L, n_layers, H]}, the last layer being the verifier's output (src/speculators/train/data.py takes [:, :-1] as the
  aux states). The loss masks stay in the preprocessed dataset (prepare_data.py, `datasets.save_to_disk`), by
  default the dumps' parent folder; read with pyarrow.
- this project's own: `seq_<i>.pt` {ids [L], prompt_len, aux [L, n_aux*H]}.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import torch


def _index(f: Path) -> int:
    return int(re.findall(r"\d+", f.name)[0])


def _specforge(folder: Path, _masks=None):
    files = sorted([*folder.glob("**/data_*.ckpt"), *folder.glob("**/data_*.ckpt.gz")], key=_index)
    for f in files:
        opener = gzip.open if f.name.endswith(".gz") else open
        with opener(f, "rb") as fh:
            s = torch.load(fh, weights_only=True)
        yield torch.as_tensor(s["input_ids"]).flatten(), torch.as_tensor(s["loss_mask"]).flatten().bool(), \
            s["aux_hidden_state"].squeeze(0)


def speculators_masks(dataset: Path) -> list[list[int]]:
    """loss_mask per row of a preprocessed dataset saved by `datasets.save_to_disk` (Arrow stream files)."""
    try:
        import pyarrow as pa
    except ImportError:
        raise SystemExit(f"speculators dumps keep their loss masks in the preprocessed dataset {dataset}; reading it "
                         f"needs pyarrow in this interpreter: pip install pyarrow (or set offline.python to the "
                         f"environment that ran speculators)") from None
    state = dataset / "state.json"
    names = [d["filename"] for d in json.loads(state.read_text())["_data_files"]] if state.exists() \
        else sorted(p.name for p in dataset.glob("*.arrow"))
    if not names:
        raise SystemExit(f"no preprocessed dataset (*.arrow) at {dataset}: set offline.loss_masks to the folder "
                         f"speculators' prepare_data.py wrote")
    masks = []
    for name in names:
        with pa.memory_map(str(dataset / name)) as src:
            masks += pa.ipc.open_stream(src).read_all().column("loss_mask").to_pylist()
    return masks


def _speculators(folder: Path, masks_dir: Path | None = None):
    from safetensors.torch import load_file

    files = sorted(folder.glob("**/hs_*.safetensors"), key=_index)
    home = files[0].parent  # data_generation_offline.py writes <preprocessed>/hidden_states/ by default
    masks = speculators_masks(masks_dir or next((d for d in (folder, home, home.parent)
                                                 if (d / "state.json").exists()), home.parent))
    for f in files:
        s = load_file(str(f))
        i = _index(f)
        if i >= len(masks) or len(masks[i]) != len(s["token_ids"]):
            raise SystemExit(f"{f.name}: no loss mask of its length ({len(s['token_ids'])}) at row {i} of the "
                             f"preprocessed dataset: is offline.loss_masks the dataset these dumps came from?")
        yield s["token_ids"].long(), torch.tensor(masks[i]).bool(), s["hidden_states"][:, :-1].flatten(1)


def _own(folder: Path, _masks=None):
    for f in sorted(folder.glob("seq_*.pt"), key=_index):
        s = torch.load(f, weights_only=True)
        ids, plen = torch.as_tensor(s["ids"]), int(s["prompt_len"])
        yield ids, torch.arange(len(ids)) >= plen, s["aux"]


# (name, file pattern that identifies it, reader)
FORMATS = [("specforge", "**/data_*.ckpt*", _specforge), ("speculators", "**/hs_*.safetensors", _speculators),
           ("specdiag", "seq_*.pt", _own)]


def read(folder: str, masks_dir: str | None = None):
    """(format name, iterator of (ids, mask, aux)) for the first format whose files are in folder."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise SystemExit(f"offline.hidden_states {folder}: no such folder on this host")
    for name, pattern, reader in FORMATS:
        if next(root.glob(pattern), None) is not None:
            return name, reader(root, Path(masks_dir) if masks_dir else None)
    raise SystemExit(f"offline.hidden_states {folder}: no SpecForge (rows_*/data_*.ckpt), speculators "
                     f"(hs_*.safetensors) or seq_*.pt files in it")


def write(folder: str, fmt: str, seqs, n_aux: int) -> None:
    """Write (ids, prompt_len, aux [L, n_aux*H]) sequences in one of the formats above (the tests' dumps). The
    target's final hidden state (SpecForge's hidden_state, speculators' last layer) is not kept: zeros stand in."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    masks = []
    for i, (ids, plen, aux) in enumerate(seqs):
        ids, mask = torch.as_tensor(ids), (torch.arange(len(ids)) >= plen).long()
        fin = torch.zeros(len(ids), aux.shape[-1] // n_aux, dtype=aux.dtype)
        if fmt == "specforge":
            (out / "rows_0-2000").mkdir(exist_ok=True)
            torch.save({"input_ids": ids, "loss_mask": mask, "aux_hidden_state": aux[None],
                        "hidden_state": fin[None]}, out / "rows_0-2000" / f"data_{i}.ckpt")
        elif fmt == "speculators":
            from safetensors.torch import save_file

            n = aux.shape[-1] // fin.shape[-1]
            layers = torch.cat([aux.view(len(ids), n, -1), fin[:, None]], 1)
            (out / "hidden_states").mkdir(exist_ok=True)
            save_file({"token_ids": ids, "hidden_states": layers.contiguous()},
                      str(out / "hidden_states" / f"hs_{i}.safetensors"))
            masks.append((ids.tolist(), mask.tolist()))
        else:
            torch.save({"ids": ids, "prompt_len": plen, "aux": aux}, out / f"seq_{i}.pt")
    if masks:
        _save_dataset(out, masks)


def _save_dataset(out: Path, rows: list[tuple[list[int], list[int]]]) -> None:
    """The preprocessed dataset beside speculators' dumps, as `datasets.save_to_disk` lays it out."""
    import pyarrow as pa

    table = pa.table({"input_ids": [r[0] for r in rows], "loss_mask": [r[1] for r in rows],
                      "seq_len": [len(r[0]) for r in rows]})
    with pa.OSFile(str(out / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    (out / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}],
                                                "_split": None}))
    (out / "dataset_info.json").write_text("{}")
