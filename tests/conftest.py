import os
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def load_yaml(rel: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / rel), resolve=True)


@pytest.fixture(scope="session")
def ray_local():
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def tables_equal(a, b) -> bool:
    """Row-for-row equality of two Arrow tables, NaN equal to NaN (Arrow's equals treats NaN as unequal)."""
    if a.schema != b.schema or a.num_rows != b.num_rows:
        return False
    for name in a.column_names:
        for x, y in zip(a.column(name).to_pylist(), b.column(name).to_pylist()):
            if not (x == y or (isinstance(x, float) and isinstance(y, float) and x != x and y != y)):
                return False
    return True
