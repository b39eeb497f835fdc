"""training/jax_runtime/compile_cache.py: where JAX's persistent compilation cache goes,
how it is turned off, its bound (which makes JAX lock its entries), and the compile
totals of the log line after the first host loop. With a stand-in for `jax`'s config: the
test process's own JAX settings stay as they are."""

import types

import pytest

from electra_tf.training.jax_runtime import compile_cache as cc


class _Config:
    def __init__(self, directory=None, max_size=-1):
        self.jax_compilation_cache_dir = directory
        self.jax_compilation_cache_max_size = max_size
        self.updates = []

    def update(self, name, value):
        self.updates.append((name, value))
        setattr(self, name, value)


def _jax(**kw):
    return types.SimpleNamespace(config=_Config(**kw))


def test_the_directory_from_the_environment(tmp_path):
    assert cc.cache_dir({"HOME": "/h"}).endswith("/.cache/electra_tf/jax")
    assert cc.cache_dir({"XDG_CACHE_HOME": "/x"}) == "/x/electra_tf/jax"
    assert cc.cache_dir({cc.ENV: str(tmp_path)}) == str(tmp_path)
    for off in ("off", "OFF", "0", "false", "no", "", " "):
        assert cc.cache_dir({cc.ENV: off, "XDG_CACHE_HOME": "/x"}) is None, off
    with pytest.raises(cc.CacheSettingError, match=r"^ELECTRA_TF_COMPILATION_CACHE=gs://b/c: "
                       r"JAX's compilation cache takes a local directory \(or off\)$"):
        cc.cache_dir({cc.ENV: "gs://b/c"})


def test_configure_turns_it_on_bounded_and_locked(tmp_path):
    jax = _jax()
    where = tmp_path / "cache"
    line = cc.configure(jax, {cc.ENV: str(where)})
    assert where.is_dir()
    assert jax.config.updates == [("jax_compilation_cache_dir", str(where)),
                                  ("jax_compilation_cache_max_size", 8 << 30)]
    assert line == (f"{where} (ELECTRA_TF_COMPILATION_CACHE=off turns it off; at most 8 GiB, "
                    "entries locked for several processes)")
    # JAX's own setting wins, with its own bound (none: other programs may write there).
    jax = _jax(directory="/given", max_size=1 << 30)
    assert cc.configure(jax, {cc.ENV: str(where)}) == (
        "/given (JAX_COMPILATION_CACHE_DIR; at most 1 GiB)")
    jax = _jax(directory="/given")
    assert cc.configure(jax, {}) == "/given (JAX_COMPILATION_CACHE_DIR; unbounded)"
    assert jax.config.updates == []
    jax = _jax()
    assert cc.configure(jax, {cc.ENV: "off"}) == "off (ELECTRA_TF_COMPILATION_CACHE=off)"
    assert jax.config.updates == []
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cc.configure(_jax(), {cc.ENV: str(blocker / "sub")}).startswith(
        f"off: cannot create {blocker / 'sub'} (")


def test_without_filelock_it_says_it_is_unlocked(tmp_path, monkeypatch):
    monkeypatch.setattr(cc.importlib.util, "find_spec", lambda name: None)
    jax = _jax()
    assert cc.configure(jax, {cc.ENV: str(tmp_path)}).endswith(
        "unbounded, without file locks: pip install filelock to share it between processes)")
    assert jax.config.updates == [("jax_compilation_cache_dir", str(tmp_path))]


def test_the_compile_totals_since_a_mark():
    mark = cc.CompileWatch.mark()
    assert cc.CompileWatch.since(mark) == "compiling 0.0 s; no persistent cache lookups"
    cc.CompileWatch._on_duration("/jax/core/compile/backend_compile_duration", 2.25)
    cc.CompileWatch._on_duration("/jax/core/compile/jaxpr_trace_duration", 0.5)
    cc.CompileWatch._on_duration("/jax/some/other_duration", 100.0)
    cc.CompileWatch._on_event("/jax/compilation_cache/cache_misses")
    assert cc.CompileWatch.since(mark) == "compiling 2.8 s; persistent cache: 0 hits, 1 miss"
    cc.CompileWatch._on_event("/jax/compilation_cache/cache_hits")
    cc.CompileWatch._on_event("/jax/compilation_cache/cache_misses")
    assert cc.CompileWatch.since(mark) == ("compiling 2.8 s; persistent cache: 1 hit, "
                                           "2 misses")
