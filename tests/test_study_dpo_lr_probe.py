"""`studies.smollm2.dpo_lr_probe`'s config: a config file's `get_config()` with `--config.FIELD=VALUE` overrides."""

import dataclasses
import pathlib

import pytest

from coevo_jax.experiment.config import ExperimentConfig
from studies.smollm2 import dpo_lr_probe

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


def test_overrides_are_python_literals_on_dotted_fields():
    items = [
        "--config.dpo.updates_per_phase=12",
        "--config.dpo.learning_rates=(1e-5, 2e-6)",
        "--config.env.kwargs.seed=3",
        "--config.model.attention=xla",
    ]
    assert dpo_lr_probe.parse_overrides(items) == {
        "dpo.updates_per_phase": 12,
        "dpo.learning_rates": (1e-5, 2e-6),
        "env.kwargs.seed": 3,
        "model.attention": "xla",
    }
    with pytest.raises(ValueError, match="expected --config.FIELD=VALUE"):
        dpo_lr_probe.parse_overrides(["--config.dpo.updates_per_phase"])
    for wrong in (["--config.dpo.updates_per_phase"], ["--set", "dpo.updates_per_phase=12"]):
        with pytest.raises(SystemExit):
            dpo_lr_probe.main(["--run", "unused", *wrong])


def test_a_config_file_loads_with_its_overrides_and_its_own_imports():
    tiny = dpo_lr_probe.load_config(str(CONFIGS / "tiny.py"), {})
    changed = dpo_lr_probe.load_config(
        str(CONFIGS / "tiny.py"), {"dpo.updates_per_phase": 12, "env.kwargs.seed": 3, "show_progress": True}
    )
    assert isinstance(tiny, ExperimentConfig) and tiny.methods == ("sft", "eto", "coevo")
    assert changed.dpo == dataclasses.replace(tiny.dpo, updates_per_phase=12)
    assert dict(changed.env.kwargs) == {**dict(tiny.env.kwargs), "seed": 3} and changed.show_progress
    # a config that imports another config file (configs/bfcl_smollm2.py imports configs/sql_smollm2.py)
    assert dpo_lr_probe.load_config(str(CONFIGS / "bfcl_smollm2.py"), {}).env.name == "bfcl"
