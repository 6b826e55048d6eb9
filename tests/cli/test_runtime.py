"""attnmt.cli.runtime: the process settings the decoding commands apply."""


def test_malloc_tuning_takes_effect_on_glibc():
    import platform

    from attnmt.cli.runtime import keep_freed_memory

    applied = keep_freed_memory()
    assert applied == (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
