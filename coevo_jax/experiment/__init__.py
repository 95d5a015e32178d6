"""The main job: base SFT, every configured method, its workdir, TensorBoard scalars; `reporting` reports on it."""
