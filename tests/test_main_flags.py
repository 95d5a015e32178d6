"""The main job's compilation cache directory: the environment's, the flag's, or the workdir's."""

from coevo_jax.main import compilation_cache_dir


def test_the_compilation_cache_defaults_to_the_workdir_and_yields_to_the_environment():
    assert compilation_cache_dir(None, "/runs/a", environ={}) == "/runs/a/compilation_cache"
    assert compilation_cache_dir("/cache", "/runs/a", environ={}) == "/cache"
    assert compilation_cache_dir("none", "/runs/a", environ={}) is None
    assert compilation_cache_dir("NONE", "/runs/a", environ={}) is None
    # JAX reads JAX_COMPILATION_CACHE_DIR itself; the job leaves it alone
    assert compilation_cache_dir(None, "/runs/a", environ={"JAX_COMPILATION_CACHE_DIR": "/x"}) is None
    assert compilation_cache_dir("/cache", "/runs/a", environ={"JAX_COMPILATION_CACHE_DIR": "/x"}) is None
