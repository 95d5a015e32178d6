"""The config files' named blocks: every environment constructor argument is a typed field of env.kwargs,
reachable on the command line whether or not a config sets it, and unset ones leave the factory's default."""

import inspect
import pathlib

import pytest
from absl import flags
from ml_collections import config_flags

from coevo_jax import envs
from coevo_jax.experiment import config_blocks
from coevo_jax.experiment.config import ExperimentConfig, default_config

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


def _parsed(config_arg: str, *overrides: str) -> ExperimentConfig:
    argv = ["main", f"--config={config_arg}", *overrides]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True, sys_argv=argv)
    values(argv)
    return ExperimentConfig.from_mapping(values.config)


@pytest.mark.parametrize("name", envs.names())
def test_every_plain_constructor_argument_is_a_field(name):
    parameters = inspect.signature(envs.factory(name)).parameters.values()
    expected = {
        p.name
        for p in parameters
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and not (p.default is None and p.annotation is p.empty)
    }
    fields = config_blocks.environment_fields(name)
    assert set(fields) == expected
    assert all(fields[key] is None for key in fields)  # unset: the factory's own default


def test_an_argument_no_config_sets_is_overridden_with_its_type():
    for path in CONFIGS.glob("*.py"):  # no file sets them, or the test would prove nothing
        assert "query_timeout_s" not in path.read_text() and "max_rows" not in path.read_text(), path
    experiment = _parsed(
        str(CONFIGS / "sql_smollm2.py"),
        "--config.env.kwargs.query_timeout_s=2.5",
        "--config.env.kwargs.max_rows=7",
    )
    kwargs = dict(experiment.env.kwargs)
    assert kwargs == {
        "backend": "sqlite",
        "max_observation_chars": 1000,
        "query_timeout_s": 2.5,
        "max_rows": 7,
    }
    assert isinstance(kwargs["max_rows"], int) and isinstance(kwargs["query_timeout_s"], float)
    with pytest.raises(flags.IllegalFlagValueError):
        _parsed(str(CONFIGS / "sql_smollm2.py"), "--config.env.kwargs.max_rows=many")


def test_a_config_that_sets_no_argument_still_reaches_them():
    experiment = _parsed(
        f"{CONFIGS / 'paper_llama2_7b.py'}:webshop", "--config.env.kwargs.data_dir=/data/webshop"
    )
    assert dict(experiment.env.kwargs) == {"data_dir": "/data/webshop"}
    assert dict(_parsed(f"{CONFIGS / 'paper_llama2_7b.py'}:webshop").env.kwargs) == {}


def test_a_block_refuses_an_argument_the_environment_does_not_take():
    with pytest.raises(ValueError, match="environment 'builtin'"):
        config_blocks.environment(default_config(), "builtin", num_trian=3)


def test_an_unknown_credit_variant_names_the_config_file():
    with pytest.raises(ValueError, match="grpo_credit_study: variant 'gipgo'"):
        config_blocks.credit_variant(default_config(), "gipgo", "grpo_credit_study")
