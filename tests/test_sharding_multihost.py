"""Two processes x 4 CPU devices behave as one process with 8: distributed init, per-process batch feeding,
the sharded SFT step and the multi-host HF export (this file is also the worker script)."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _worker(export_dir: str) -> None:
    sys.path.insert(0, HERE)
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from coevo_jax import sharding

    assert sharding.maybe_initialize_distributed()
    from train_fixtures import MESHES, SCALARS, fresh_state, mesh_of, setup, sft_batch

    from coevo_jax import checkpoints

    mesh = mesh_of(MESHES["data2_fsdp4"])
    graphdef, shardings, steps, _, rules = setup(mesh)
    full = sharding.device_layout(sft_batch(0, rows=16))
    rank, count = jax.process_index(), jax.process_count()
    rows = full["input_ids"].shape[1] // count
    local = {key: value[:, rank * rows : (rank + 1) * rows] for key, value in full.items()}
    state, metrics = steps.sft(fresh_state(shardings), sharding.place_batch(local, mesh, rules), SCALARS)
    checkpoints.export_policy(graphdef, state.params, export_dir)
    print(f"LOSS {float(metrics['loss']):.8f}", flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    from train_fixtures import MESHES, SCALARS, fresh_state, mesh_of, placed, setup, sft_batch, to_numpy

    from coevo_jax.checkpoint_formats import load_pretrained

    mesh = mesh_of(MESHES["data2_fsdp4"])
    _, shardings, steps, _, rules = setup(mesh)
    state, metrics = steps.sft(fresh_state(shardings), placed(sft_batch(0, rows=16), mesh, rules), SCALARS)

    port, export_dir = _free_port(), str(tmp_path / "hf")
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            COEVO_DISTRIBUTED="1",
            JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
            JAX_NUM_PROCESSES="2",
            JAX_PROCESS_ID=str(rank),
            XLA_FLAGS="--xla_force_host_platform_device_count=4",
            JAX_PLATFORMS="cpu",
            PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, export_dir],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,  # apart: Gloo's logging once landed inside the LOSS line
                text=True,
            )
        )
    outputs = [proc.communicate(timeout=300) for proc in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, (out + err)[-3000:]
        loss = float(next(line for line in out.splitlines() if line.startswith("LOSS")).split()[1])
        np.testing.assert_allclose(loss, float(metrics["loss"]), rtol=1e-6)

    exported, _ = load_pretrained(export_dir)
    np.testing.assert_allclose(
        np.asarray(exported.embed.get_value()), to_numpy(state.params["embed"]), rtol=1e-5, atol=1e-6
    )


if __name__ == "__main__":
    _worker(sys.argv[1])
