"""The main job's compilation cache directory: the environment's, the flag's, or the user's for this CPU."""

from coevo_jax.main import compilation_cache_dir, host_cpu_key


def test_the_compilation_cache_defaults_to_the_users_cache_and_yields_to_the_environment():
    key = host_cpu_key()
    assert compilation_cache_dir(None, environ={"HOME": "/h", "XDG_CACHE_HOME": "/c"}) == (
        f"/c/coevo_jax/compilation_cache/{key}"
    )
    assert compilation_cache_dir("/cache", environ={}) == "/cache"
    assert compilation_cache_dir("none", environ={}) is None
    assert compilation_cache_dir("NONE", environ={}) is None
    # JAX reads JAX_COMPILATION_CACHE_DIR itself; the job leaves it alone
    assert compilation_cache_dir(None, environ={"JAX_COMPILATION_CACHE_DIR": "/x"}) is None
    assert compilation_cache_dir("/cache", environ={"JAX_COMPILATION_CACHE_DIR": "/x"}) is None


def test_programs_compiled_for_another_cpu_are_kept_apart(tmp_path):
    avx512, avx2 = tmp_path / "avx512", tmp_path / "avx2"
    avx512.write_text("model name\t: EPYC\nflags\t\t: fpu avx2 avx512f\n" * 2)
    avx2.write_text("model name\t: EPYC\nflags\t\t: fpu avx2\n" * 2)
    assert host_cpu_key(str(avx512)) != host_cpu_key(str(avx2))
    assert host_cpu_key(str(avx512)) == host_cpu_key(str(avx512))
    assert len(host_cpu_key(str(tmp_path / "absent"))) == 12
