"""DPO throughput of TRL's `DPOTrainer` on the anchor config (issue 8), for comparison with coevo_jax.

    bench/.venvs/trl/bin/python bench/peers/trl_dpo.py                  # all four variants
    bench/.venvs/trl/bin/python bench/peers/trl_dpo.py --steps 2 --warmup 1 --phase-epochs 1 --variants fp32_ref

Random-init `LlamaForCausalLM` of the anchor shape; 8 pairs per step, prompt 256 + response 256, beta 0.1,
AdamW lr 1e-5, sigmoid loss, no gradient checkpointing, no logging, saving or evaluation. The pairs are
`common.dpo_pairs(64)`, fed as the pre-tokenized columns (`prompt_ids`, `chosen_ids`, `rejected_ids`) that
TRL's `DataCollatorForPreference` consumes; the first step checks that the model sees exactly
prompt+chosen / prompt+rejected.

Variants, each with a fresh model and trainer:
    fp32_ref         float32, reference forward every step (TRL's default)
    fp32_precompute  float32, precompute_ref_log_probs=True
    bf16_precompute  bf16=True (autocast mixed precision, float32 master weights), precompute
    bf16_ref         bf16=True, reference forward every step

Per step: on_step_begin -> on_step_end of a TrainerCallback (forward and backward of the policy, the
reference forward where not precomputed, clipping, AdamW, scheduler; the batch is already collated),
warm-up steps dropped. Phase: a fresh model, then the wall time of `DPOTrainer(...)` (which runs the
reference precompute pass where enabled) plus `trainer.train()` over 3 epochs of the 64 pairs (24 steps,
data loading included), taken after the per-step run has warmed the process up.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
import warnings

os.environ.setdefault("TQDM_DISABLE", "1")  # TRL's precompute loop reads this

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from torch_llama import build_model, common, id_tokenizer, setup_device, synchronize  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

VARIANTS = {  # name: (dtype, precompute_ref)
    "fp32_ref": ("float32", False),
    "fp32_precompute": ("float32", True),
    "bf16_precompute": ("bfloat16", True),
    "bf16_ref": ("bfloat16", False),
}
TOKENS_PER_STEP = (
    common.DPO["pairs_per_step"] * 2 * (common.DPO["prompt_length"] + common.DPO["response_length"])
)


class PretokenizedDPOTrainer(trl.DPOTrainer):
    """`DPOTrainer` fed token ids directly.

    TRL 1.16's `_prepare_dataset` always extracts a text prompt, appends EOS and re-tokenizes; our
    dataset already holds the columns its collator reads, so that step is skipped and nothing else.
    """

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        return dataset


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step (begin -> end)."""

    def __init__(self, device: torch.device):
        self.device, self.times, self._start = device, [], 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        synchronize(self.device)
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        synchronize(self.device)
        self.times.append(time.perf_counter() - self._start)


class InputCheck:
    """Forward pre-hook on the policy's decoder: checks the first batch against the anchor pairs."""

    def __init__(self, pairs: dict[str, np.ndarray]):
        chosen = np.concatenate([pairs["prompt"], pairs["chosen"]], axis=1)
        self.rejected = np.concatenate([pairs["prompt"], pairs["rejected"]], axis=1)
        self.index = {row.tobytes(): i for i, row in enumerate(chosen.astype(np.int64))}
        self.checked = False

    def __call__(self, module, args, kwargs):
        if self.checked:
            return
        ids = (kwargs.get("input_ids") if "input_ids" in kwargs else args[0]).cpu().numpy().astype(np.int64)
        mask = kwargs.get("attention_mask")
        half = common.DPO["pairs_per_step"]
        assert ids.shape == (2 * half, self.rejected.shape[1]), ids.shape
        assert mask is None or bool((mask == 1).all()), "padding reached the model"
        for row in range(half):
            i = self.index.get(ids[row].tobytes())
            assert i is not None, f"row {row} is not prompt+chosen of any pair"
            assert (ids[half + row] == self.rejected[i]).all(), f"row {half + row} is not prompt+rejected"
        self.checked = True


def dataset(pairs: dict[str, np.ndarray]) -> datasets.Dataset:
    as_lists = lambda key: pairs[key].astype(np.int64).tolist()
    return datasets.Dataset.from_dict(
        {
            "prompt_ids": as_lists("prompt"),
            "chosen_ids": as_lists("chosen"),
            "rejected_ids": as_lists("rejected"),
        }
    )


def dpo_config(out_dir: str, dtype: str, precompute: bool, device: torch.device, **schedule) -> trl.DPOConfig:
    return trl.DPOConfig(
        output_dir=out_dir,
        beta=common.DPO["beta"],
        learning_rate=common.DPO["learning_rate"],
        loss_type=["sigmoid"],
        per_device_train_batch_size=common.DPO["pairs_per_step"],
        max_length=common.DPO["prompt_length"] + common.DPO["response_length"],
        precompute_ref_log_probs=precompute,
        gradient_checkpointing=False,
        bf16=dtype == "bfloat16",
        fp16=False,
        use_cpu=device.type == "cpu",
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
        **schedule,
    )


def make_trainer(args, dtype, precompute, pairs, device, callbacks=(), **schedule):
    """A fresh random-init policy (and a reference copy unless precomputing), and its trainer."""
    model = build_model(args.attn, device)
    ref = None if precompute else copy.deepcopy(model).eval()
    cfg = dpo_config(args.tmp, dtype, precompute, device, **schedule)
    data, tokenizer = dataset(pairs), id_tokenizer()
    start = time.perf_counter()
    trainer = PretokenizedDPOTrainer(
        model=model,
        ref_model=ref,
        args=cfg,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=list(callbacks),
    )
    trainer.remove_callback(transformers.PrinterCallback)  # the end-of-training metrics dict
    return trainer, start


def time_steps(args, dtype, precompute, pairs, device, check: InputCheck | None) -> dict:
    """Median/min/max of the timed steps after `args.warmup` warm-up steps (one trainer)."""
    timer = StepTimer(device)
    trainer, _ = make_trainer(
        args, dtype, precompute, pairs, device, [timer], max_steps=args.warmup + args.steps
    )
    hook = None
    if check is not None:
        hook = trainer.model.model.register_forward_pre_hook(check, with_kwargs=True)
    trainer.train()
    if hook is not None:
        hook.remove()
        assert check.checked, "the input check never ran"
    return common.summarize(timer.times[args.warmup :])


def time_phase(args, dtype, precompute, pairs, device) -> tuple[float, int]:
    """Wall time of trainer construction (ref precompute included) + 3 epochs of training."""
    trainer, start = make_trainer(args, dtype, precompute, pairs, device, num_train_epochs=args.phase_epochs)
    trainer.train()
    synchronize(device)
    return time.perf_counter() - start, trainer.state.global_step


def run_variant(args, name, pairs, device, check) -> dict:
    dtype, precompute = VARIANTS[name]
    step = time_steps(args, dtype, precompute, pairs, device, check)
    phase_s, phase_steps = None, 0  # phase skipped
    if args.phase_epochs > 0:
        phase_s, phase_steps = time_phase(args, dtype, precompute, pairs, device)
    return {
        "name": name,
        "dtype": dtype,
        "precompute_ref": precompute,
        "step": step,
        "tokens_per_s": TOKENS_PER_STEP / step["median_s"],
        "phase_s": phase_s,
        "phase_steps": phase_steps,
    }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_table(variants: list[dict]) -> None:
    print(
        f"{'variant':<16} {'dtype':<9} {'precomp':<7} {'median s':>9} {'min s':>7} {'max s':>7} "
        f"{'tokens/s':>9} {'phase s':>8} {'steps':>5}"
    )
    for v in variants:
        s = v["step"]
        print(
            f"{v['name']:<16} {v['dtype']:<9} {v['precompute_ref']!s:<7} {s['median_s']:>9.3f} {s['min_s']:>7.3f} "
            f"{s['max_s']:>7.3f} {v['tokens_per_s']:>9.0f} {_seconds(v['phase_s']):>8} {v['phase_steps']:>5}"
        )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=common.TIMED_STEPS, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=common.WARMUP_STEPS, help="untimed steps before them")
    p.add_argument("--phase-epochs", type=int, default=common.PHASE_EPOCHS, help="0 skips the phase timing")
    p.add_argument(
        "--pairs", type=int, default=common.PHASE_PAIRS, help="pairs in the data set (quick checks)"
    )
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS)
    )
    p.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"), help="attn_implementation")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--out", default=None, help="results folder (default bench/results)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    device = setup_device(args.device)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5's renames, not ours
    names = [n for n in args.variants.split(",") if n]
    unknown = set(names) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants: {sorted(unknown)}")
    pairs = common.dpo_pairs(args.pairs)
    check = InputCheck(pairs)
    variants = []
    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = tmp
        for name in names:
            variants.append(run_variant(args, name, pairs, device, check if not check.checked else None))
            print_table(variants[-1:])
    versions = {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
    print(f"\nTRL DPO, {device.type}, {torch.get_num_threads()} threads, attn {args.attn}, {versions}")
    print_table(variants)
    payload = {
        "framework": "trl",
        "versions": versions,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "attn_implementation": args.attn,
        "variants": variants,
    }
    print("wrote", common.write_result("dpo_trl", payload, out_dir=args.out))


if __name__ == "__main__":
    main()
