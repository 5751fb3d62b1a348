"""The README's hybrid file is real: it loads, accounts and runs."""

from pathlib import Path

import torch

from storelab.models.config import load_model

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_hybrid_file_runs(tmp_path):
    text = README.read_text()
    a = text.index("```toml") + len("```toml\n")
    f = tmp_path / "my.toml"
    f.write_text(text[a:text.index("```", a)])
    cfg = load_model(f)
    assert cfg.n_layers == 24 and cfg.mix() == "18 kda + 6 mla"
    from storelab.models.model import Model

    torch.manual_seed(0)
    model = Model(cfg).eval()
    with torch.no_grad():
        logits = model(torch.randint(0, cfg.vocab_size, (1, 9)), model.new_cache())
    logits = logits[0] if isinstance(logits, tuple) else logits
    assert logits.shape[-1] == cfg.vocab_size and torch.isfinite(logits).all()
