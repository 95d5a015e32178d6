"""The paper's setting: Llama-2-7B-Chat on WebShop, ScienceWorld or InterCode-SQL with ETO's hyperparameters.

For GPUs. ETO's recipe (SFT 3 epochs at lr 2e-5, cosine, 3 % warmup, batch 64; DPO beta 0.1, lr 1e-6, 32 pairs
a batch, 3 epochs a phase; 4,096 tokens) and the paper's iterations (3 for WebShop and ScienceWorld, 5 for
InterCode-SQL). Pick the environment after a colon and point `model.source` at a local Hugging Face checkpoint
(nothing is downloaded). Both 7B policies on one 80 GB GPU: LoRA, `--config.model.lora_rank=16`, the command
in docs/memory_plan.md. ScienceWorld needs Java and the `sciworld` extra; WebShop its server package and ETO's
expert file (`env.experts_path`).

    python -m coevo_jax.main --config=configs/paper_llama2_7b.py:sciworld --workdir=/ckpt/coevo_sciworld \\
        --config.model.source=/models/Llama-2-7b-chat-hf
"""

from ml_collections import ConfigDict

from coevo_jax.experiment import config_blocks as blocks
from coevo_jax.experiment.config import default_config


def get_config(env: str = "sciworld") -> ConfigDict:
    return blocks.paper_run(default_config(), env, "~/models/Llama-2-7b-chat-hf")
