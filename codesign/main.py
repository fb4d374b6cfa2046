"""``codesign``: the main job. With no arguments it runs the default Gen 2 / Gen 3 study end to end.

    codesign                                   # default study, embedded local Ray
    codesign hardware=b200 workload=llama3_70b # any override
    codesign experiment=smoke                  # a small override file from conf/experiment/
    codesign -m workload=llama3_70b,gpt_oss_120b generation=gen2,gen3   # Hydra multirun
    codesign sweep.ray_address=auto            # an existing Ray cluster

Outputs go to the Hydra run directory (``outputs/DATE/TIME`` by default): ``results.parquet``, ``figures/*.png``,
``report.html``, ``summary.md`` and ``study.json``; the persistent result store is ``sweep.output_dir``.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from arch_space.errors import ConfigError
from codesign.cli import CONF_DIR, entry, fail, overridden_keys
from codesign.schema import load_study

PROG = "codesign"


def _validate(cfg: dict, overridden: tuple[str, ...]):
    from codesign.study import study_mappings

    study = load_study(cfg, overridden=overridden)
    for arch in study.workloads:
        study_mappings(study, arch)  # named mappings must exist for every workload of the mix
    return study


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    try:
        study = load_study(OmegaConf.to_container(cfg, resolve=True),
                           overridden=overridden_keys(list(hc.overrides.task)))
        from codesign.study import run_study

        paths = run_study(study, Path(hc.runtime.output_dir))
    except ConfigError as err:
        fail(PROG, err)
    print(f"{PROG}: results  {paths['results.parquet']}")
    print(f"{PROG}: report   {paths['report.html']}")
    print(f"{PROG}: summary  {paths['summary.md']}")
    print(f"{PROG}: figures  {paths['frontier_per_chip'].parent}")


def cli() -> None:
    entry(PROG, "config", _validate, _main)


if __name__ == "__main__":
    cli()
