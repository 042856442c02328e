"""Session-wide test setup: a private kernel cache, so runs neither read nor fill the
user's cache and every run exercises the compiler."""
import pytest

from treadle.config import override


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    with override(cache_dir=tmp_path_factory.mktemp("treadle-cache"), verify=True):
        yield
